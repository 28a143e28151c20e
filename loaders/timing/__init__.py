"""Where a loader's time goes: ``stages`` (the workers pipeline's per-image clocks and log),
``batch_stages`` (the batch-decoding pipelines'), ``histogram`` (what both logs keep) and
``throughput`` (images/s and CPU seconds, for ``--benchmark-data`` and ``benchmarks/``)."""
