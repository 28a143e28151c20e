"""The LMDB layout (docs/formats.md#lmdb): one database per split, written by ``folder2lmdb.py``,
read by ``main.py --lmdb``, ``--dali --lmdb`` and ``ImageFolderLMDB``.

Format :data:`FORMAT_NAME`: record ``i`` under :func:`record_key` ``(i)`` as :func:`encode_record`;
the :class:`Metadata` under :data:`META_KEY` and the CRC-32 of every record under
:data:`CHECKSUMS_KEY`, both in the last transaction (an unfinished conversion is never opened as
complete); the resume state under :data:`PROGRESS_KEY` while converting. Version 2
(:data:`RAW_VERSION`, ``--raw-budget``): a record may be raw (:mod:`decode.raw`). A layout change
bumps :data:`FORMAT_VERSION` and keeps reading older versions
(``tests/formats/test_formats_compat.py``)."""
from ._codec import (BASE_VERSION, CHECKSUMS_KEY, FORMAT_NAME, FORMAT_VERSION, META_KEY,
                     PROGRESS_KEY, RAW_VERSION, LMDBFormatError, Metadata, close_all_readonly,
                     close_readonly, decode_checksums, decode_meta, decode_record, encode_meta,
                     encode_record, is_lmdb, is_open, open_readonly, read_meta, record_checksum,
                     record_key)
from ._convert import convert
from ._verify import verify
