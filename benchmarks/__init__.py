"""The scripts behind the figures in README.md and docs/*.md, one module per measured feature,
each run from the repository's root as ``python -m benchmarks.NAME`` (benchmarks/README.md:
which feature, which make target, which docs section).

``bench_*`` time a pipeline end to end (images/s, against a baseline on the same data);
``profile_*`` take one step apart (milliseconds per image, one thread). What they share (the
``--data``/``--rounds``/``--out`` options, interleaved rounds and medians, fresh processes,
table and JSON output) is :mod:`benchmarks.runner`. ``ffcv/`` is FFCV beside ours
(``python -m benchmarks.ffcv``); its ``side.py`` runs by path with FFCV's own environment
(``ffcv/setup.sh``): it imports nothing of this package.
"""
