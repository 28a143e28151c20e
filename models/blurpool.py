"""BlurPool (Zhang, "Making Convolutional Networks Shift-Invariant Again", ICML 2019) as
FFCV's ImageNet recipe applies it (libffcv/ffcv-imagenet ``train_imagenet.py``,
``BlurPoolConv2d`` and ``apply_blurpool``): a fixed 3x3 binomial blur before every strided
convolution with at least 16 input channels (so not the stem's 3-channel conv)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# FFCV's rule: which convolutions get the blur in front
MIN_IN_CHANNELS = 16


class BlurPoolConv2d(nn.Module):
    """``conv`` after a per-channel ``[1, 2, 1] x [1, 2, 1] / 16`` blur of its ``(N, C, H, W)``
    input (stride 1, padding 1). ``blur_filter`` ``(C, 1, 3, 3)`` is a saved buffer, as in FFCV;
    the conv's weights move to ``<name>.conv``."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        kernel = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16.0
        self.conv = conv
        self.register_buffer("blur_filter", kernel.expand(conv.in_channels, 1, 3, 3).clone()
                             .to(conv.weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blurred = F.conv2d(x, self.blur_filter.to(x.dtype), stride=1, padding=1,
                           groups=self.conv.in_channels)
        return self.conv(blurred)


def apply_blurpool(model: nn.Module) -> int:
    """Wrap, in place, every ``nn.Conv2d`` of ``model`` with a stride above 1 and at least
    :data:`MIN_IN_CHANNELS` input channels in :class:`BlurPoolConv2d`; returns how many
    (ResNet-18 and ResNet-50: 6 each, the downsampling 1x1 convs included)."""
    count = 0
    for name, child in model.named_children():
        if isinstance(child, nn.Conv2d) and max(child.stride) > 1 \
                and child.in_channels >= MIN_IN_CHANNELS:
            setattr(model, name, BlurPoolConv2d(child))
            count += 1
        else:
            count += apply_blurpool(child)
    return count
