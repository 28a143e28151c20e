"""JPEG windows decoded without decoding the whole image: :mod:`.window` (nvImageCodec's CPU
backend, the rows of the window only), :mod:`.scaled` (at libjpeg-turbo's DCT scale 1/2-1/8
where the window is at least twice the output) through :mod:`.region` (our C, ``_jpegcrop.c``:
crop and scale in one decode) or PIL's ``draft``. Each returns None where it declines and
:mod:`decode`'s cascade takes the image on."""
from . import region, scaled, window

__all__ = ["region", "scaled", "window"]
