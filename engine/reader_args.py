"""``main.py``'s flags for how a reader reads its storage: streamed shards' retries (HTTP,
``pipe:``) and LMDB's read order and readahead (``loaders.LoaderSettings`` carries them)."""
from __future__ import annotations

from engine.argtypes import non_negative_int, positive_int, seconds


def add_reader_args(group) -> None:
    """Add ``--shard-retries``, ``--shard-retry-delay`` (seconds), ``--lmdb-order``,
    ``--lmdb-block-size``, ``--lmdb-buffer-blocks`` and ``--lmdb-readahead`` to ``group`` (an
    argparse argument group)."""
    group.add_argument("--shard-retries", type=non_negative_int, default=2, metavar="N",
                       help="streamed shards (HTTP, pipe:): a failed open or read is tried again "
                       "N times, reopened where it stopped, before the run stops (3 tries over "
                       "30 s)")
    group.add_argument("--shard-retry-delay", type=seconds, default=10.0, metavar="S",
                       help="seconds before a stream's first retry, doubled for each next one")
    group.add_argument("--lmdb-order", default="random", choices=["random", "block"],
                       help="with --lmdb: training read order; 'block' shuffles blocks of "
                       "consecutive records (mostly sequential I/O, for LMDBs larger than RAM)")
    group.add_argument("--lmdb-block-size", type=positive_int, default=256, metavar="N",
                       help="with --lmdb-order block: records per block (256 ~ 28 MB of ImageNet)")
    group.add_argument("--lmdb-buffer-blocks", type=positive_int, default=8, metavar="K",
                       help="with --lmdb-order block: blocks read at once, shuffled together")
    group.add_argument("--lmdb-readahead", default="auto", choices=["auto", "on", "off"],
                       help="with --lmdb: OS readahead; auto = on when the LMDB fits in half "
                       "the available memory (faster random reads), off otherwise (block order "
                       "wants on)")
