"""Images stored at training size (``--max-side N --quality Q``, ``--reencode-all``), as FFCV's
writer (``RGBImageField(max_resolution, jpeg_quality)``; docs/ffcv-and-decode.md): an image whose
longer side exceeds ``max_side`` is scaled to it (the shorter side ``shorter * max_side // longer``,
at least 1) with PIL's ``BOX`` filter, an exact area average like the OpenCV ``INTER_AREA`` FFCV
uses, and stored as a baseline JPEG at ``quality``, as is every re-encoding (``every``: of every
image). A store records its cap; ``--verify --dataset`` applies it, a resume refuses another."""
from __future__ import annotations

from dataclasses import dataclass

from formats.images import REENCODE_QUALITY


@dataclass(frozen=True)
class Cap:
    """``max_side`` in pixels (None: any), JPEG ``quality`` (1-100) of every encoding, ``every``:
    re-encode all. Raises ``ValueError`` for values out of range."""

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
        """Whether an image of ``size`` = ``(width, height)`` in pixels is larger than the cap."""
        return self.max_side is not None and max(size) > self.max_side

    def scaled_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """``(width, height)`` an image of ``size`` is stored with."""
        return tuple(max(1, side * self.max_side // max(size)) for side in size) \
            if self.exceeds(size) else size

    def apply(self, image):
        """``image``, or its ``BOX`` downscale to :meth:`scaled_size`."""
        if not self.exceeds(image.size):
            return image
        from PIL import Image

        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        return image.resize(self.scaled_size(image.size), Image.BOX)

    def record(self) -> dict:
        """The fields a store's metadata records (:meth:`from_record`); empty for the default."""
        fields = {"max_side": self.max_side, "quality": self.quality}
        return {} if self == Cap() else {**fields, "reencode": "all"} if self.every else fields

    @staticmethod
    def fields_in(metadata: dict) -> dict:
        """The :meth:`record` fields of ``metadata``; ``ValueError`` if invalid."""
        fields = {k: metadata[k] for k in ("max_side", "quality", "reencode") if k in metadata}
        for key, value in fields.items():
            if not (value == "all" if key == "reencode" else isinstance(value, int)
                    or (key == "max_side" and value is None)):
                raise ValueError(f"{key}: {value!r} is not a cap setting")
        return fields

    @classmethod
    def from_record(cls, fields: dict) -> "Cap":
        """Raises ``ValueError``."""
        return cls(fields.get("max_side"), fields.get("quality", REENCODE_QUALITY),
                   fields.get("reencode") == "all")

    def describe(self) -> str:
        """The flags that give this cap, e.g. ``"--max-side 512 --quality 90"``."""
        side = f"--max-side {self.max_side}" if self.max_side is not None else "no --max-side"
        return f"{side} --quality {self.quality}" + (" --reencode-all" if self.every else "")
