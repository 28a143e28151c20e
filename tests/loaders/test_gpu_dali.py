"""The DALI backend on a CUDA GPU: nvJPEG (``device="mixed"``) and ``--dali-cpu`` decoding
deliver the loader contract there: CUDA images of the dtype ``--amp``/``--amp-dtype`` ask for,
channels-last with ``--channels-last``, CUDA int64 labels, and pixels that encode the label."""
import pytest
import torch

pytest.importorskip("nvidia.dali")

import loaders  # noqa: E402
from loaders import DistInfo, input_dtype  # noqa: E402
from tests.helpers.loading import loader_settings, to_uint8  # noqa: E402
from tools.datagen import label_from_pixels  # noqa: E402

pytestmark = pytest.mark.gpu

# (source, flags, image dtype); LMDB once with parallel external-source workers, once without.
CASES = [
    ("folder", {}, torch.float32),
    ("folder", {"amp": True}, torch.float16),
    ("folder", {"amp": True, "amp_dtype": "bfloat16"}, torch.bfloat16),
    ("folder", {"channels_last": True}, torch.float32),
    ("folder", {"amp": True, "channels_last": True}, torch.float16),
    ("folder", {"amp": True, "amp_dtype": "bfloat16", "channels_last": True}, torch.bfloat16),
    ("folder", {"dali_cpu": True}, torch.float32),
    ("folder", {"dali_cpu": True, "amp": True, "channels_last": True}, torch.float16),
    ("lmdb", {"amp": True, "workers": 2}, torch.float16),
    ("lmdb", {"dali_cpu": True, "workers": 0}, torch.float32),
]


@pytest.mark.parametrize("source,flags,dtype", CASES)
def test_gpu_batches_follow_the_contract(tiny, source, flags, dtype):
    flags = {"workers": 2, **flags}
    device = torch.device("cuda", torch.cuda.current_device())
    # --amp/--amp-dtype as main.py resolves them: the settings carry the image dtype.
    amp, amp_dtype = flags.pop("amp", False), flags.pop("amp_dtype", "float16")
    args = loader_settings("dali", data=tiny.lmdb if source == "lmdb" else tiny.root,
                           lmdb=source == "lmdb", dtype=input_dtype(amp, amp_dtype, device),
                           **flags)
    train, val = loaders.build_loaders(args, DistInfo(device=device))
    for loader, images_total in ((train, 32), (val, 16)):
        batches = list(loader)
        assert len(batches) == len(loader) == images_total // 4
        for images, labels in batches:
            assert images.device == labels.device == device
            assert images.dtype == dtype and images.shape == (4, 3, 32, 32)
            assert labels.dtype == torch.int64 and labels.shape == (4,)
            layout = torch.channels_last if args.channels_last else torch.contiguous_format
            assert images.is_contiguous(memory_format=layout)
            pixels = to_uint8(images.float().cpu())  # normalised with the ImageNet mean/std
            assert [label_from_pixels(p, tiny.num_classes) for p in pixels] == labels.tolist()

