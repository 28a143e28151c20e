"""Images stored at training size, by choice: the converters' ``--max-side N --quality Q``.

FFCV's writer caps every image it stores (``RGBImageField(max_resolution=...)``: the longer side
scaled down to ``max_resolution`` with OpenCV's ``INTER_AREA``, then JPEG at ``jpeg_quality``);
FFCV's ImageNet example writes ``max_resolution=500`` or 512 and ``jpeg_quality=90``, and its
published ResNet-50/18 accuracies are trained from such data. :class:`Cap` does the same for
``folder2lmdb.py`` and ``folder2shards.py``:

* an image whose longer side is at most ``max_side`` is kept as the rules of
  :mod:`formats.images` keep it (a baseline JPEG byte for byte);
* a larger one is decoded completely (PIL), scaled so that its longer side is ``max_side`` and
  its shorter side ``shorter * max_side // longer`` (at least 1), with PIL's ``BOX`` filter, and
  stored as a baseline JPEG at ``quality``. ``BOX`` is an exact area average when shrinking,
  the filter of OpenCV's ``INTER_AREA`` that FFCV's writer uses, so the stored pixels are those
  FFCV's published figures were trained on (up to rounding); it is also the cheapest
  antialiased filter (LANCZOS would sharpen, and cost about 3x);
* images re-encoded anyway (progressive, CMYK, PNG, ...) are capped the same way, and every
  re-encoding uses ``quality``;
* with ``every`` (``--reencode-all``) every image is re-encoded at ``quality``, within the cap or
  not, as FFCV's writer does (``RGBImageField`` encodes each image it does not store raw with
  ``cv2.imencode`` at ``jpeg_quality``): lossy, the pixels trained on are no longer the
  originals', but a baseline JPEG at quality 90 with PIL's default 4:2:0 chroma subsampling is
  about half the bytes of ImageNet's originals (most of them 4:4:4 at a higher quality) and
  faster to decode (docs/raw-share.md).

``Cap()`` (no ``max_side``, quality :data:`formats.images.REENCODE_QUALITY`) is the default:
the converters' rules unchanged. A database records its cap in its metadata (LMDB) or
``index.json`` (shards), ``--verify --dataset`` applies the same one, and a resume refuses a
changed one.
"""
from __future__ import annotations

from dataclasses import dataclass

from formats.images import REENCODE_QUALITY


@dataclass(frozen=True)
class Cap:
    """``max_side``: the longest side in pixels an image is stored with (None: any);
    ``quality``: JPEG quality (1-100, libjpeg's scale) of every image the converter encodes;
    ``every``: re-encode every image (``--reencode-all``), not only those the rules of
    :mod:`formats.images` or the cap re-encode."""

    max_side: int | None = None
    quality: int = REENCODE_QUALITY
    every: bool = False

    def __post_init__(self):
        if self.max_side is not None and (not isinstance(self.max_side, int)
                                          or self.max_side < 1):
            raise ValueError(f"--max-side must be a positive number of pixels, not "
                             f"{self.max_side!r}")
        if not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
            raise ValueError(f"--quality must be 1..100, not {self.quality!r}")

    def exceeds(self, size: tuple[int, int]) -> bool:
        """Whether an image of ``size`` (width, height in pixels) is larger than the cap."""
        return self.max_side is not None and max(size) > self.max_side

    def scaled_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """``(width, height)`` in pixels an image of ``size`` is stored with: the longer side
        ``max_side``, the shorter ``shorter * max_side // longer`` (>= 1); ``size`` if within."""
        if not self.exceeds(size):
            return size
        width, height = size
        longer = max(width, height)
        return (max(1, width * self.max_side // longer), max(1, height * self.max_side // longer))

    def apply(self, image):
        """A PIL image within the cap: ``image`` itself, or its ``BOX``-filtered downscale to
        :meth:`scaled_size` (area averaging, as FFCV's writer; see the module docstring)."""
        if not self.exceeds(image.size):
            return image
        from PIL import Image

        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        return image.resize(self.scaled_size(image.size), Image.BOX)

    def record(self) -> dict:
        """The fields a database's metadata stores (empty for the default, so databases
        written without a cap look as they did before)."""
        if self == Cap():
            return {}
        fields = {"max_side": self.max_side, "quality": self.quality}
        return {**fields, "reencode": "all"} if self.every else fields

    @staticmethod
    def fields_in(metadata: dict) -> dict:
        """The :meth:`record` fields found in a database's metadata (LMDB) or ``index.json``
        (shards), checked: ``max_side`` an int or None, ``quality`` an int, ``reencode``
        ``"all"``. Raises ValueError for other values."""
        fields = {k: metadata[k] for k in ("max_side", "quality", "reencode") if k in metadata}
        for key, value in fields.items():
            ok = (value == "all" if key == "reencode"
                  else isinstance(value, int) or (key == "max_side" and value is None))
            if not ok:
                raise ValueError(f"{key}: {value!r} is not a cap setting")
        return fields

    @classmethod
    def from_record(cls, fields: dict) -> "Cap":
        """Inverse of :meth:`record` (missing fields: the default). Raises ValueError."""
        return cls(fields.get("max_side"), fields.get("quality", REENCODE_QUALITY),
                   fields.get("reencode") == "all")

    def describe(self) -> str:
        """The flags that give this cap, e.g. ``"--max-side 512 --quality 90"`` (and
        ``" --reencode-all"`` with ``every``)."""
        side = f"--max-side {self.max_side}" if self.max_side is not None else "no --max-side"
        return f"{side} --quality {self.quality}" + (" --reencode-all" if self.every else "")


NO_CAP = Cap()
