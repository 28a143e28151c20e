"""The LMDB layout (docs/formats.md#lmdb), one database per split: record ``i`` under
:func:`record_key` ``(i)`` as :func:`encode_record`; :class:`Metadata` (:data:`META_KEY`) and every
record's CRC-32 (:data:`CHECKSUMS_KEY`) in the last transaction, so an unfinished conversion never
opens as complete; the resume state under :data:`PROGRESS_KEY` while converting. Version 2
(``--raw-budget``): a record may be raw (:mod:`decode.raw`). A layout change bumps
:data:`FORMAT_VERSION` and keeps reading older versions (tests/formats/test_formats_compat.py)."""
from ._codec import (BASE_VERSION, CHECKSUMS_KEY, FORMAT_NAME, FORMAT_VERSION, META_KEY,
                     PROGRESS_KEY, RAW_VERSION, LMDBFormatError, Metadata, close_all_readonly,
                     close_readonly, decode_checksums, decode_meta, decode_record, encode_meta,
                     encode_record, is_lmdb, is_open, open_readonly, read_meta, record_checksum,
                     record_key)
from ._convert import convert
from ._verify import verify
