"""Where a loader's time goes: per stage (``stages``), images/s and CPU s (``throughput``)."""
