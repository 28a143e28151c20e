"""Where a loader's time goes: ``stages`` (the workers pipeline's per-image clocks and log, and
the histograms both logs keep), ``batch_stages`` (the batch-decoding pipelines') and
``throughput`` (images/s and CPU seconds, for ``--benchmark-data`` and ``benchmarks/``)."""
