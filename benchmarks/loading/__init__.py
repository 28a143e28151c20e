"""The CPU training loaders through ``main.py``'s own path: ``throughput`` (``make bench``: ours
beside the stock pipeline and decode-only), ``memory`` (a worker's memory against the LMDB's
record count), ``pagecache`` (an LMDB larger than the page cache), ``stage_cost`` (what the
per-stage clocks cost), ``refused`` (the acceptance rule's targets), ``transforms`` (each CPU
step of a training sample, one thread)."""
