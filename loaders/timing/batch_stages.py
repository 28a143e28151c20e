"""The batch pipelines' names for :mod:`loaders.timing.stages`, whose one log serves them too."""
from .stages import StagedLoader, StageLog as BatchStageLog, no_clock, thread_cpu

__all__ = ["BatchStageLog", "StagedLoader", "no_clock", "thread_cpu"]
