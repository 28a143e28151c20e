"""JPEG windows decoded without the whole image (:mod:`decode`'s cascade): :mod:`.window`
(nvImageCodec), :mod:`.scaled` (at a DCT scale) through :mod:`.region` (our C) or PIL's draft."""
from . import region, scaled, window
