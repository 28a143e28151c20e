#!/usr/bin/env python
"""Convert an ImageNet-layout image folder (``root/<wnid>/<image>.JPEG``) to one LMDB.

    python folder2lmdb.py --dataset /imagenet/train -o /lmdb/train [--strict] [--shuffle-seed 0]
                          [--check {full,header}] [--max-side 512 --quality 90]
                          [--raw-budget 1.5x]
    python folder2lmdb.py --verify /lmdb/train [--dataset /imagenet/train]

PyTorch-LMDB's converter interface (docs/formats.md#lmdb); run again, an interrupted conversion
resumes. :class:`ImageFolderLMDB` reads the result as ``ImageFolder`` reads a folder (``from
folder2lmdb import ImageFolderLMDB``, as in PyTorch-LMDB)."""
from __future__ import annotations

import io
import sys

import lmdb
import msgpack
from PIL import Image
from torch.utils.data import Dataset

from formats.cli import converter_parser, run_cli
from formats.conversion import ConversionError, Summary
from formats.lmdb import convert, decode_record, record_key, verify
from formats.sources import DatasetError
from loaders import DataError
from loaders.readers.lmdb_records import LMDBReader

__all__ = ["ConversionError", "ImageFolderLMDB", "Summary", "convert", "main", "pil_decode",
           "verify"]


# msgpack bin headers: marker -> size of the length field that follows it
_BIN_LENGTH_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_FIXARRAY_2 = 0x92


def pil_decode(data: bytes) -> Image.Image:
    """Image bytes -> PIL RGB image, as ImageFolder's default loader (``pil_loader``) does."""
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def _label_of(value) -> int:
    """A record value's label without copying its image bytes (the bin header skipped); other
    layouts through :func:`decode_record`."""
    view = memoryview(value)
    if len(view) > 2 and view[0] == _FIXARRAY_2 and view[1] in _BIN_LENGTH_BYTES:
        width = _BIN_LENGTH_BYTES[view[1]]
        start = 2 + width
        size = int.from_bytes(view[2:start], "big")
        try:
            label = msgpack.unpackb(view[start + size:], raw=False)
        except (ValueError, TypeError, msgpack.exceptions.ExtraData):
            label = None
        if isinstance(label, int) and not isinstance(label, bool):
            return label
    return decode_record(bytes(view))[1]


class ImageFolderLMDB(Dataset):
    """``ImageFolder`` over one split written by ``folder2lmdb.py``
    (docs/formats.md#in-your-own-scripts-imagefolderlmdb): ``dataset[i]`` is ``(transform(PIL RGB
    image), target_transform(label))`` in record order; ``classes``, ``class_to_idx``, ``len()``
    from the metadata; ``targets`` read on first access, labels only. Safe with
    ``DataLoader(num_workers>0)``, fork or spawn. Raises :class:`~loaders.DataError` (one line) if
    ``root`` is not a complete database."""

    def __init__(self, root: str, transform=None, target_transform=None,
                 readahead: bool = False):
        self.root = root
        self.transform = transform
        self.target_transform = target_transform
        self._records = LMDBReader(root, readahead=readahead)
        self.classes = list(self._records.classes)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self._targets = None

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: int):
        if index < 0:
            index += len(self)
        data, label = self._records.read(index)
        image = pil_decode(data)
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    @property
    def targets(self) -> list[int]:
        """Label of every record, read on first access."""
        if self._targets is None:
            self._targets = self._read_targets()
        return self._targets

    @targets.setter
    def targets(self, value) -> None:
        self._targets = list(value)

    def _read_targets(self) -> list[int]:
        count = len(self)
        labels = []
        # buffers=True: views into the map, so the image bytes are skipped, not read
        with self._records.env().begin(buffers=True) as txn:
            cursor = txn.cursor()
            found = cursor.set_key(record_key(0))
            while found and len(labels) < count:
                if bytes(cursor.key()) != record_key(len(labels)):
                    break
                labels.append(_label_of(cursor.value()))
                found = cursor.next()
        if len(labels) != count:
            raise DataError(f"{self.root}: record {len(labels)} missing (the metadata says "
                            f"{count}); run folder2lmdb.py --verify {self.root}")
        return labels

    def __repr__(self) -> str:
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self)}",
                 f"    Root location: {self.root}"]
        if self.transform is not None:
            lines.append(f"    Transform: {self.transform!r}".replace("\n", "\n    "))
        if self.target_transform is not None:
            lines.append(f"    Target transform: {self.target_transform!r}")
        return "\n".join(lines)


def get_args_parser():
    parser = converter_parser(
        "Convert an image folder to an LMDB for main.py --lmdb, or check one.",
        output_help="LMDB directory to create (or resume)", verify_metavar="DB",
        verify_help="check the database DB instead",
        overwrite_help="replace a complete database at --output, or start an unfinished one "
                       "over")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="source files per LMDB transaction (default: 256)")
    parser.add_argument("--map-size", type=int, default=1 << 30,
                        help="initial LMDB map_size in bytes; doubles when full (default: 1 GiB)")
    parser.add_argument("--shuffle-seed", type=int, metavar="N",
                        help="write the records in a pseudo-random order fixed by N instead of "
                             "sorted by class (for training with --lmdb-order block)")
    return parser


def main(argv=None) -> int:
    """CLI entry point; returns the exit status (see :func:`formats.cli.run_cli`)."""
    return run_cli(
        "folder2lmdb.py", get_args_parser(), argv, "an existing database",
        lambda args: verify(args.verify, args.dataset, workers=args.workers, split=args.split),
        lambda args: convert(args.dataset, args.output, workers=args.workers,
                             overwrite=args.overwrite, map_size=args.map_size,
                             batch_size=max(1, args.batch_size), strict=args.strict,
                             shuffle_seed=args.shuffle_seed, check=args.check, split=args.split,
                             allow_partial=args.allow_partial, cap=args.cap,
                             raw_budget=args.raw, max_pixels=args.max_image_pixels),
        (ConversionError, DatasetError, OSError, lmdb.Error))


if __name__ == "__main__":
    sys.exit(main())
