"""FFCV 1.0.2 beside ``main.py --benchmark-data`` on the same stored bytes (``make bench-ffcv``,
``python -m benchmarks.ffcv``): ``compare`` (the stores written, both sides timed in
interleaved rounds, the report), ``table`` (the tables it prints), ``side.py`` (FFCV's side, run
by path with the side environment's Python; it imports nothing of ours) and ``setup.sh`` (that
environment, ``.ffcv/``)."""
