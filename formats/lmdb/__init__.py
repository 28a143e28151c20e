"""The LMDB layout: one database per split, written by ``folder2lmdb.py`` and read by
``main.py --lmdb`` (``loaders.readers.lmdb_records``), ``ImageFolderLMDB`` and ``--dali --lmdb``.

Layout, format ``"imagenet-lmdb"`` version 1 (version 2 below) (:data:`FORMAT_NAME`, :data:`FORMAT_VERSION`): an
LMDB directory holding ``data.mdb`` and ``skipped.tsv`` (the files not stored, with why), and in
the database

* record ``i`` (``0 <= i < count``) under key :func:`record_key` ``(i)`` (10 ASCII digits, so
  LMDB's byte order is index order): ``msgpack.packb([jpeg_bytes, label])`` with
  ``jpeg_bytes`` the source file's bytes unchanged, or its re-encoding to a baseline JPEG
  (:mod:`formats.images` decides which), and ``label`` an ``int``, torchvision ``ImageFolder``'s
  ``class_to_idx`` of its folder;
* the metadata record under :data:`META_KEY`: msgpack of ``{"format", "version", "count",
  "classes", "shuffle_seed"}`` and optionally ``"names"``: ``classes`` the class folder names
  (WNIDs) in sorted order, ``shuffle_seed`` the seed of the records' order or None for
  class-sorted order, ``names`` the classes' human-readable names where the source has them
  (an optional key: version-1 readers ignore it). It is written
  in the last transaction, so a database whose conversion did not finish has none and is never
  opened as complete;
* the checksum record under :data:`CHECKSUMS_KEY`, written in that same last transaction: the
  CRC-32 of every record's value (:func:`encode_checksums`), read only by :func:`verify`;
* while a conversion runs (never in a complete database): its resume state under
  :data:`PROGRESS_KEY` and per-batch entries under keys starting with :data:`PROGRESS_PREFIX`,
  all deleted by the last transaction.

Version 2 (``folder2lmdb.py --raw-budget``, :mod:`formats.raw_share`): a record's bytes may be a
raw record instead of a JPEG, a binary PPM/PGM of the pixels the JPEG decodes to
(:mod:`decode.raw`, told apart by its first two bytes ``P6``/``P5``), and the metadata holds
``"raw"``: the budget, the cost model, the threshold and what was chosen
(:meth:`formats.raw_share.RawChoice.state`). A database written without a raw share is version 1,
byte for byte as before.

A change to this layout must bump :data:`FORMAT_VERSION` and keep reading version 1
(``tests/formats/test_formats_compat.py`` opens databases written before ``formats/`` existed).

API: write with :func:`convert`; read with :func:`open_readonly`, :func:`read_meta`,
:func:`record_key` and :func:`decode_record`; check with :func:`verify`.
"""
from ._codec import (BASE_VERSION, CHECKSUMS_KEY, FORMAT_NAME, FORMAT_VERSION, META_KEY,
                     PROGRESS_KEY, RAW_VERSION,
                     PROGRESS_PREFIX, LMDBFormatError, Metadata, close_all_readonly, close_readonly, decode_checksums,
                     decode_meta, decode_record, encode_checksums, encode_meta, encode_record,
                     is_lmdb, is_open, last_record_index, open_readonly, read_meta,
                     record_checksum, record_key)
from ._convert import convert
from ._verify import verify
from ._writer import ResumeState

__all__ = ["BASE_VERSION", "CHECKSUMS_KEY", "FORMAT_NAME", "FORMAT_VERSION", "META_KEY",
           "PROGRESS_KEY", "PROGRESS_PREFIX", "RAW_VERSION", "LMDBFormatError", "Metadata", "ResumeState", "close_all_readonly", "close_readonly",
           "convert", "decode_checksums", "decode_meta", "decode_record", "encode_checksums",
           "encode_meta", "encode_record", "is_lmdb", "is_open", "last_record_index",
           "open_readonly", "read_meta", "record_checksum", "record_key", "verify"]
