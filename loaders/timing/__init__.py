"""Where a loader's time goes: ``stages`` (the clocks and the one log of every pipeline's stages)
and ``throughput`` (images/s and CPU seconds, for ``--benchmark-data`` and ``benchmarks/``)."""
