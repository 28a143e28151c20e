"""Tools around the project that are neither the trainer nor a benchmark, each run from the
repository's root as ``python -m tools.NAME``:

- :mod:`tools.gpu_check` (``make gpu-bundle``, ``gpu-check``, ``gpu-lease``, ``gpu-rehearse``):
  the GPU path proven on a GPU machine, or measured in a borrowed GPU's 15 minutes
  (docs/gpu-check.md); a package, its modules named for what they do;
- :mod:`tools.datagen`: small ImageNet-layout JPEG datasets whose pixels encode the label
  (``make demo``, ``make bench`` without ``DATA=``, ``make gpu-bundle`` without ``DATA=``, the
  tests);
- :mod:`tools.replicas`: the real sample laid out as each ImageNet download ships (tests,
  benchmarks).

Nothing here is imported by ``main.py`` or the packages it uses.
"""
