"""FFCV 1.0.2 beside ``main.py --benchmark-data`` on the same stored bytes (``make bench-ffcv``,
``python -m benchmarks.ffcv``); ``side.py`` runs by path in FFCV's environment (``setup.sh``)."""
