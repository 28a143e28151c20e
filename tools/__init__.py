"""Tools around the project that are neither the trainer nor a benchmark, each run from the
repository's root as ``python -m tools.NAME``:

- :mod:`tools.datagen`: small ImageNet-layout JPEG datasets whose pixels encode the label
  (``make demo``, ``make bench`` without ``DATA=``, and the tests through ``tests/datagen.py``).
"""
