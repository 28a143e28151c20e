"""Where a loader's time goes: ``stages`` (the workers pipeline's per-image stage clocks and the
main process's :class:`~loaders.timing.stages.StageLog`), ``batch_stages`` (the same figures for
the pipelines that decode whole batches: ``--decode-device``, DALI), ``histogram`` (what both
logs keep instead of per-image values) and ``throughput`` (images/s and CPU seconds of a loader,
for ``--benchmark-data`` and ``benchmarks/``)."""
