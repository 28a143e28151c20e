"""Tools around the project that are neither the trainer nor a benchmark, each run from the
repository's root as ``python -m tools.NAME``:

- :mod:`tools.gpu_check` (``make gpu-check``): proves or disproves the whole GPU path on a GPU
  machine; its private modules ``_gpu_settings`` (command line), ``_gpu_runner`` (commands,
  budget, bundle install, data), ``_gpu_report`` (rows, target, exit status) and
  ``_gpu_markdown`` (``report.md``). docs/gpu-check.md.
- :mod:`tools.gpu_bundle` (``make gpu-bundle``): ``.gpu-bundle/``, the wheels and images that
  ``gpu_check`` needs on a machine without network.
- :mod:`tools.datagen`: small ImageNet-layout JPEG datasets whose pixels encode the label
  (``make demo``, ``make bench`` without ``DATA=``, ``make gpu-bundle`` without ``DATA=``, and
  the tests through ``tools/datagen.py``).

Nothing here is imported by ``main.py`` or the packages it uses.
"""
