"""The WebDataset shard layout (docs/formats.md#webdataset-shards), one folder per split:
``{prefix}-000000.tar``, ... (ustar; per record ``KEY.jpg`` then ``KEY.cls``, the label in
ASCII), DALI's ``v1.2`` index of each (``.idx``), ``index.json`` (:class:`ShardIndex`, written
last), ``progress.json`` and ``skipped.tsv``; a job array (``convert(task=, tasks=)``) adds a
``PREFIX-b.done`` per block and ``index.json.lock``. Version 2 (``--raw-budget``): an image may be
``KEY.ppm`` (:mod:`decode.raw`). A layout change bumps :data:`FORMAT_VERSION` and keeps reading
older versions (tests/formats/test_formats_compat.py)."""
from ._codec import (FORMAT_VERSION, INDEX_NAME, ShardFormatError, ShardIndex, ShardWriter,
                     idx_name, read_idx, record_key, shard_name, write_idx)
from ._convert import convert, shard_digests
from ._foreign import index_shards
from ._verify import verify
