"""``--random-erase`` on the normalised device batch, as timm's ``PrefetchLoader`` erases."""
from __future__ import annotations

import math

import torch

from ..draws import keyed_rng

_TAG = 0x45524153  # "ERAS": random erasing's stream, apart from the loader's of a batch
ERASE_ATTEMPTS = 10  # torchvision's RandomErasing.get_params tries 10 boxes


class RandomErasing:
    """torchvision's ``RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)`` (Zhong et
    al. 2020) per image, its draws from ``(seed, epoch, rank, batch)``."""

    def __init__(self, p: float, seed: int, rank: int, scale=(0.02, 0.33), ratio=(0.3, 3.3)):
        self.p, self.seed, self.rank, self.scale = p, seed, rank, scale
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))

    def boxes(self, epoch: int, batch: int, count: int, height: int, width: int) -> list:
        """``(top, left, h, w)`` per image (pixels), or None where nothing is erased."""
        rng = keyed_rng(self.seed, epoch, self.rank, batch, _TAG)
        draws = rng.random((count, 1 + 4 * ERASE_ATTEMPTS)).tolist()
        return [self._box(row, height, width) for row in draws]

    def _box(self, u: list[float], height: int, width: int):
        if not u[0] < self.p:
            return None
        area = height * width
        for k in range(ERASE_ATTEMPTS):
            u_area, u_ratio, u_top, u_left = u[1 + 4 * k:5 + 4 * k]
            erase_area = area * (self.scale[0] + u_area * (self.scale[1] - self.scale[0]))
            aspect = math.exp(self.log_ratio[0] + u_ratio * (self.log_ratio[1] -
                                                             self.log_ratio[0]))
            h = int(round(math.sqrt(erase_area * aspect)))
            w = int(round(math.sqrt(erase_area / aspect)))
            if h < height and w < width:
                return int(u_top * (height - h + 1)), int(u_left * (width - w + 1)), h, w
        return None

    def __call__(self, images: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
        """Erase in place in ``images`` (float ``(N, C, H, W)``, any memory format and device)
        and return it: one mask of the batch's boxes, one ``masked_fill_``."""
        count, _, height, width = images.shape
        boxes = self.boxes(epoch, batch, count, height, width)
        if not any(boxes):
            return images
        edges = torch.tensor([box or (0, 0, 0, 0) for box in boxes], dtype=torch.int64)
        edges = edges.to(images.device, non_blocking=True)
        rows = torch.arange(height, device=images.device)[None, :, None]
        cols = torch.arange(width, device=images.device)[None, None, :]
        top, left, h, w = (edges[:, k, None, None] for k in range(4))
        mask = (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)
        return images.masked_fill_(mask[:, None], 0)

