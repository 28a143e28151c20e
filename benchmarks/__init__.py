"""The scripts behind the figures in README.md and docs/*.md, one module per measured feature,
each run from the repository's root as ``python -m benchmarks.NAME`` (benchmarks/README.md).
``bench_*`` time a pipeline end to end against a baseline; ``profile_*`` take one step apart,
one thread; :mod:`benchmarks.runner` is what they share. ``ffcv/side.py`` runs in FFCV's own
environment and imports nothing of this package.
"""
