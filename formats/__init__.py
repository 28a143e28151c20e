"""The on-disk formats: what the converters write and the loaders read back.

- :mod:`formats.lmdb`: one LMDB per split (``folder2lmdb.py``, ``main.py --lmdb``); layout and
  version in its docstring; ``convert`` (write), ``open_readonly``/``read_meta``/
  ``decode_record`` (read), ``verify``.
- :mod:`formats.shards`: WebDataset tar shards with DALI ``.idx`` files and ``index.json``
  (``folder2shards.py``, ``main.py --loader shards``); likewise ``convert``, ``ShardIndex``/
  ``read_idx``, ``verify``.
- :mod:`formats.images`: which source files are images, which are stored byte for byte and which
  re-encoded (the image checks, :data:`~formats.images.RULES_VERSION`).
- :mod:`formats.sources`: where the images come from: ImageNet as each distributor ships it
  (class folders, the official tars read in place with the devkit, Kaggle's tree, Hugging
  Face's Parquet or ``.tar.gz``), detected and listed in the class-folder order with the
  sorted-WNID labels (``open_dataset``, ``list_sources``).
- :mod:`formats.raw_share`: ``--raw-budget``, which images are stored as raw pixels
  (:mod:`decode.raw`) instead of JPEG: a cost model timed on a sample, chosen by decode time
  saved per extra byte, under a budget kept throughout the conversion.
- :mod:`formats.conversion`: what both converters share (errors, summary, verification result,
  resume fingerprint, ``skipped.tsv``); :mod:`formats.cli`: their one command-line runner.

Databases and shards already written must keep reading and verifying: a layout change bumps the
format's version (``tests/formats/test_formats_compat.py`` reads ones written before this package).
Runtime concerns (decoding, augmentation, epoch orders, batch slots, the device feed) are
``loaders/``'s; the image checks decode with ``decode.libraries`` so that what is stored is
exactly what the loaders can read.
"""
