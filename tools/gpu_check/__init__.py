"""The GPU check (docs/gpu-check.md), ``python -m tools.gpu_check``: one row list in priority
order (:mod:`.plan`), one runner (:mod:`.check`), one report (:mod:`.report`, judged by
:mod:`.judge`); the rows' commands in :mod:`.rows`; the offline bundle, its steps, the install
and the dry run of the steps in :mod:`.bundle`."""
