"""The scripts behind the figures in README.md and docs/*.md, one module per measured feature,
each run from the repository's root as ``python -m benchmarks.WING.NAME`` (benchmarks/README.md),
in wings by what they measure: ``decoders``, ``loading``, ``pipelines``, ``converters``,
``training``, and ``ffcv`` (FFCV beside us). :mod:`benchmarks.runner` is what they share.
``ffcv/side.py`` runs in FFCV's own environment and imports nothing of this package.
"""
