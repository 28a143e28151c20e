"""Tools that are neither the trainer nor a benchmark, each run from the repository's root as
``python -m tools.NAME``: :mod:`tools.gpu_check` (the GPU path checked on a GPU host,
docs/gpu-check.md), :mod:`tools.datagen` (generated ImageNet-layout JPEGs) and
:mod:`tools.replicas` (the real sample laid out as each ImageNet download ships). Nothing here
is imported by ``main.py`` or the packages it uses.
"""
