"""The GPU check (docs/gpu-check.md), ``python -m tools.gpu_check``: its command line and one
runner (:mod:`.check`), one row list in priority order (:mod:`.plan`), one report, judged
(:mod:`.report`); the rows' commands in :mod:`.rows`; the offline bundle, its steps, the
install and the dry run of the steps in :mod:`.bundle`."""
