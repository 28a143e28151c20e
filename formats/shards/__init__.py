"""The WebDataset shard layout: one folder per split, written by ``folder2shards.py`` and read by
``main.py --loader shards`` (``loaders.readers.shards``, local, HTTP or ``pipe:``), by ``--dali --loader
shards`` and by DALI's ``fn.readers.webdataset``.

Layout, format ``"webdataset-imagenet"`` version 1 (:data:`FORMAT_NAME`, :data:`FORMAT_VERSION`).
A split is a folder (or the URL of one) holding:

* ``{prefix}-000000.tar``, ``{prefix}-000001.tar``, ...: POSIX (ustar) tar files in the
  WebDataset layout. Each record is two members, ``KEY.jpg`` (the original JPEG bytes, or the
  re-encoded image as in the LMDB) then ``KEY.cls`` (the ImageFolder label, ASCII decimal).
  ``KEY`` is ``<wnid>/<file stem>`` with dots replaced by ``_`` (WebDataset splits a member name
  at its first dot after the last ``/``), so a record names its source image; whitespace is
  replaced too and repeats are numbered (:func:`source_keys`).
* ``{prefix}-000000.idx``, ...: DALI's index file of each tar (``wds2idx.py`` format ``v1.2``:
  a header ``v1.2 N`` and per record ``jpg OFFSET SIZE NAME cls OFFSET SIZE NAME``, offsets of
  the member data in bytes). The reader uses it for random access into local shards.
* ``index.json``: ``{"format": "webdataset-imagenet", "version": 1, "classes": [wnid, ...],
  "seed": int | null, "records": total, "bytes": total tar bytes, "shards": [{"name":
  "train-000000.tar", "records": n, "bytes": b}, ...], "rules": image-check rules version}``,
  optionally ``"names"`` (human-readable class names) and, per shard, ``"url"`` (a shard kept
  elsewhere: foreign shards indexed by ``folder2shards.py --index``); version-1 readers
  ignore both.
  It is written last, so a split without it is an unfinished conversion.
* ``progress.json`` (the converter's, kept after it finishes): the settings, and per finished
  shard its records, bytes, SHA-256 and the files skipped; :func:`verify` checks the digests.
* ``skipped.tsv``: the source files not stored, with why.

Records follow one global pseudo-random order (``shuffle_seed``, default 0), so every shard
mixes all classes.

Version 2 (``folder2shards.py --raw-budget``, :mod:`formats.raw_share`): a record's image member
may be ``KEY.ppm`` instead of ``KEY.jpg``, a binary PPM/PGM of the pixels the JPEG decodes to
(:mod:`decode.raw`), also in the ``.idx`` lines; ``index.json`` says ``"version": 2`` and holds
``"raw"`` (budget, cost model, threshold, what was chosen). Shards written without a raw share
are version 1, byte for byte as before.

A change to this layout must bump :data:`FORMAT_VERSION` and keep reading
version 1 (``tests/formats/test_formats_compat.py`` opens shards written before ``formats/`` existed).

API: write with :func:`convert` (or :class:`ShardWriter` record by record), index shards
written by other tools with :func:`index_shards`; read with
:class:`ShardIndex` and :func:`read_idx`; check with :func:`verify`.
"""
from ._codec import (BASE_VERSION, FORMAT_NAME, FORMAT_VERSION, IDX_VERSION, IMAGE_EXT,
                     IMAGE_EXTS, INDEX_NAME, LABEL_EXT, RAW_EXT, RAW_VERSION,
                     RecordSpan, ShardFormatError, ShardIndex, ShardWriter, idx_name, read_idx,
                     record_key, shard_name, source_keys, write_idx)
from ._convert import PROGRESS_NAME, ConversionProgress, ShardSummary, convert, shard_digests
from ._foreign import IndexSummary, index_shards
from ._verify import ShardVerification, sha256_file, verify

__all__ = ["BASE_VERSION", "IMAGE_EXTS", "RAW_EXT", "RAW_VERSION", "FORMAT_NAME", "FORMAT_VERSION", "IDX_VERSION", "IMAGE_EXT", "INDEX_NAME", "LABEL_EXT",
           "ConversionProgress", "IndexSummary", "PROGRESS_NAME", "RecordSpan", "ShardFormatError",
           "ShardIndex", "ShardSummary", "ShardVerification", "ShardWriter", "convert",
           "idx_name", "index_shards", "read_idx", "record_key", "sha256_file", "shard_digests",
           "shard_name", "source_keys", "verify", "write_idx"]
