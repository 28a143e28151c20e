"""RandomResizedCrop parameters and the uint8 transforms (loaders/transforms/crops.py)."""
import math
import random

import pytest
import torch
from torchvision import transforms

from loaders.transforms import random_resized_crop_params, resize_center_crop

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def stats(windows, height, width):
    shares = [h * w / (height * width) for _, _, h, w in windows]
    log_aspects = [math.log(w / h) for _, _, h, w in windows]
    centres = [(top + h / 2) / height for top, _, h, _ in windows]
    return [sum(v) / len(v) for v in (shares, log_aspects, centres)]


@pytest.mark.parametrize("height,width", [(375, 500), (500, 333), (56, 75), (1600, 2400)])
def test_crop_windows_follow_random_resized_crop(height, width):
    """Every window lies inside the image, and the mean area share, log aspect ratio and
    vertical centre match torchvision's get_params over 2,000 draws each."""
    rng = random.Random(0)
    ours = [random_resized_crop_params(height, width, SCALE, RATIO,
                                       [rng.random() for _ in range(40)]) for _ in range(2000)]
    for top, left, h, w in ours:
        assert 0 <= top <= height - h and 0 <= left <= width - w and h > 0 and w > 0
    torch.manual_seed(0)
    image = torch.empty(3, height, width)
    theirs = [transforms.RandomResizedCrop.get_params(image, list(SCALE), list(RATIO))
              for _ in range(2000)]
    for mine, reference in zip(stats(ours, height, width), stats(theirs, height, width)):
        assert abs(mine - reference) < 0.03


@pytest.mark.parametrize("height,width", [(1, 1000), (1000, 1), (10, 10)])
def test_fallback_is_torchvisions_central_crop(height, width):
    """Where no random window fits, the result is torchvision's own fallback."""
    ours = random_resized_crop_params(height, width, (1.5, 2.0), RATIO, [0.5] * 40)
    torch.manual_seed(0)
    theirs = transforms.RandomResizedCrop.get_params(torch.empty(3, height, width), [1.5, 2.0],
                                                     list(RATIO))
    assert ours == tuple(theirs)


def test_resize_center_crop_matches_torchvision_resize_and_center_crop():
    image = torch.randint(0, 256, (3, 333, 500), dtype=torch.uint8)
    ours = resize_center_crop(image, 256, 224)
    reference = transforms.CenterCrop(224)(
        transforms.Resize(256, antialias=True)(image.unsqueeze(0)))[0]
    assert ours.shape == reference.shape == (3, 224, 224)
    assert (ours.int() - reference.int()).abs().max().item() <= 1
