"""The NVIDIA DALI pipeline (``--dali``): :class:`DALILoader` with its feed threads, graph,
``--auto-augment`` ops, bad samples and environment checks; DALI is imported inside functions."""
from __future__ import annotations

import torch

from decode.gpu import nvjpeg_pip_package

from ...errors import DataError
from ...readers import Reader
from ...settings import DistInfo, LoaderSettings
from .environment import gpu_decoding_problem, require
from .graph import graph_options
from .loader import DALILoader

__all__ = ["DALILoader", "build_loaders", "require"]


def build_loaders(train: Reader, val: Reader, settings: LoaderSettings, dist: DistInfo):
    """``(train, val)`` :class:`DALILoader` s with ``settings.workers`` DALI CPU threads (at
    least 1). Raises :class:`DataError` for a reader without random access (streamed shards),
    bad order settings, nvJPEG unable to decode on the GPU (without ``--dali-cpu``), or a
    training order smaller than one batch."""
    built = []
    for is_train, reader, path in ((True, train, settings.train_path),
                                   (False, val, settings.val_path)):
        if not reader.random_access:
            raise DataError(f"{path}: --dali reads local shards only; stream them with "
                            "--loader shards (without --dali)")
        order = (reader.train_order if is_train else reader.val_order)(settings, dist)
        opts = graph_options(settings, dist, is_train)
        if is_train and not opts.decode_on_cpu:
            problem = gpu_decoding_problem(dist.device)
            if problem:
                cuda = (torch.version.cuda or "13").split(".")[0]
                raise DataError(f"--dali: nvJPEG cannot decode on {dist.device} ({problem}), "
                                f"so DALI would decode on the CPU: install "
                                f"{nvjpeg_pip_package(cuda)} beside nvidia-nvimgcodec-cu{cuda}, "
                                "or give --dali-cpu")
        built.append(DALILoader(reader, order, opts, settings, dist))
    return built[0], built[1]
