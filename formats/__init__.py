"""The on-disk formats the converters write and the loaders read back (docs/formats.md):
:mod:`formats.lmdb` and :mod:`formats.shards`, the image rules (:mod:`formats.images`), the
ImageNet downloads (:mod:`formats.sources`), the raw share (:mod:`formats.raw_share`) and what both
converters share (:mod:`formats.conversion`, :mod:`formats.cli`). Written stores must keep reading:
a layout change bumps the format's version."""
