"""The accelerator-facing logic of main.py and engine/ that can be checked without a GPU: CUDA
problems stop with one line, --gpu with several processes per node is refused, fused SGD and loss
scaling are chosen as documented, AMP-free checkpoints resume under --amp, per-rank RNG
states, torch.compile's wrapper is unwrapped, and steady-state images/s is recorded."""
import random
import warnings
from contextlib import nullcontext

import pytest
import torch
from torch import nn

import main
from engine import settings
from engine.checkpoint import load_optimizer, restore, restore_rng
from engine.distributed.processes import check_cuda, check_gpu_flag, rng_state, unwrap
from engine.recipe.optim import make_optimizer
from engine.settings import resolve_workers
from engine.state import TrainState, autocast, needs_grad_scaler
from loaders import DistInfo
from models import build_model
from tests.helpers.runs import read_metrics, SMALL
from tests.helpers.states import settings_of


def test_driver_too_old_stops_with_one_line(monkeypatch, capsys):
    def unusable():
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old "
                      "(found version 12020).\nPlease update your GPU driver.")
        return False

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", unusable)
    assert main.cli(["--dummy", "--epochs", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "driver on your system is too old" in err[0]
    assert "--no-accel" in err[0] and "CUDA 13.0" in err[0]
    check_cuda(main.parse_args(["--no-accel"]).no_accel)  # training on the CPU on purpose


@pytest.mark.parametrize("probe_warns", [False, True])
def test_no_gpu_at_all_is_not_an_error(monkeypatch, probe_warns):
    """A CPU-only machine with torch's CUDA build: ``is_available()`` is False without a CUDA
    initialization warning (here also with an unrelated one while probing): no error, and no
    warning reaches the user."""
    def no_gpu():
        if probe_warns:
            warnings.warn("an unrelated warning while probing", UserWarning)
        return False

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", no_gpu)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_cuda(main.parse_args([]).no_accel)
    assert [str(w.message) for w in caught] == []


def test_gpu_flag_with_several_processes_per_node_is_refused(tiny, capsys):
    code = main.cli([tiny.root, "--gpu", "1", "--multiprocessing-distributed",
                     "--nproc-per-node", "2", "--epochs", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert "--gpu 1 with 2 processes per node" in err[0]
    check_gpu_flag(1, 1)  # one process per node may pick its GPU
    check_gpu_flag(None, 8)


def test_fused_sgd_on_cuda_and_loss_scaling_only_for_float16():
    model = nn.Linear(4, 2)
    args = main.parse_args(["--amp"])
    sgd = (args.lr, args.momentum, args.weight_decay)
    assert make_optimizer(model, *sgd, torch.device("cpu")).defaults["fused"] is None
    cuda = torch.device("cuda", 0)
    fused = make_optimizer(model, *sgd, cuda)  # fused SGD also builds over CPU tensors
    assert fused.defaults["fused"] is True and fused._step_supports_amp_scaling
    assert needs_grad_scaler(args.amp, args.amp_dtype, cuda)
    bf16 = main.parse_args(["--amp", "--amp-dtype", "bfloat16"])
    assert not needs_grad_scaler(bf16.amp, bf16.amp_dtype, cuda)
    assert not needs_grad_scaler(args.amp, args.amp_dtype, torch.device("cpu"))
    plain = main.parse_args([])
    assert not needs_grad_scaler(plain.amp, plain.amp_dtype, cuda)


def _overflow_then_finite_steps(optimizer, model):
    """GradScaler's usual start: an inf gradient (step skipped), then finite ones."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)  # stands in for CUDA's
    x = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 32
    for factor in (float("inf"), 1.0, 1.0):
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(model(x).sum() * factor).backward()
        scaler.step(optimizer)
        scaler.update()
    return model.weight.detach()


def test_fused_sgd_after_a_skipped_float16_step_equals_stock_sgd():
    """Fused SGD's momentum buffers start at zero (make_optimizer): GradScaler skipping the
    first step leaves them defined, and training goes on exactly as stock SGD's. Before, torch
    left them uninitialised (torch.empty_like) and the H100's float16 runs trained to nan."""
    args = main.parse_args(["--amp"])
    sgd = (args.lr, args.momentum, args.weight_decay)
    weights, optimizers = {}, {}
    for name in ("ours", "stock"):
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        optimizers[name] = (
            make_optimizer(model, *sgd, torch.device("cuda", 0)) if name == "ours"
            else torch.optim.SGD(model.parameters(), sgd[0], momentum=sgd[1],
                                 weight_decay=sgd[2]))
        weights[name] = _overflow_then_finite_steps(optimizers[name], model)
    assert optimizers["ours"].defaults["fused"] is True
    assert torch.equal(weights["ours"], weights["stock"])


def test_resumed_fused_sgd_gets_the_buffers_its_checkpoint_lacks():
    """A checkpoint saved before any step (pytorch/examples' SGD, empty state) resumed into
    fused SGD: zero buffers again; a group with dampening (not ours) stays fused, without them
    (a zero buffer would scale its first step by 1 - dampening)."""
    model = build_model("resnet18", 4, False)
    saved = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9).state_dict()
    optimizer = make_optimizer(model, 0.1, 0.9, 1e-4, torch.device("cuda", 0))
    load_optimizer(optimizer, saved)
    assert optimizer.param_groups[0]["fused"] is True
    buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    assert len(buffers) == len(list(model.parameters())) and not any(b.any() for b in buffers)
    saved["param_groups"][0]["dampening"] = 0.1
    load_optimizer(optimizer, saved)
    assert optimizer.param_groups[0]["fused"] is True and not optimizer.state
    scaler = torch.amp.GradScaler("cpu")  # a float16 step still goes through (stands in for CUDA)
    scaler.scale(model(torch.rand(2, 3, 32, 32)).sum()).backward()
    scaler.step(optimizer)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_autocast_dtype_follows_amp_dtype():
    args = main.parse_args(["--amp", "--amp-dtype", "bfloat16"])
    with autocast(args.amp, args.amp_dtype, torch.device("cpu")):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert main.parse_args([]).amp_dtype == "float16"


def _checkpoint_without_amp(tiny, tmp_path):
    out = str(tmp_path / "plain")
    main.main(["--lmdb", tiny.lmdb, *SMALL, "--epochs", "1", "--output-dir", out,
               "--no-accel"])
    return torch.load(f"{out}/checkpoint.pth.tar", weights_only=True)


def test_amp_resume_of_a_checkpoint_made_without_amp(tiny, tmp_path):
    """A run without float16 AMP saves an empty scaler state; resuming it with a scaler that
    is enabled starts a fresh loss scale instead of failing in GradScaler.load_state_dict."""
    checkpoint = _checkpoint_without_amp(tiny, tmp_path)
    assert checkpoint["scaler"] == {}
    model = build_model("resnet18", 4, False)
    s = settings_of(["--dummy", "-a", "resnet18", "--amp"])
    optimizer = make_optimizer(model, s.recipe.lr, s.recipe.momentum, s.recipe.weight_decay,
                               torch.device("cpu"))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)
    scaler = torch.amp.GradScaler("cpu", enabled=True)  # stands in for CUDA's
    state = TrainState(model, nn.CrossEntropyLoss(), optimizer, scheduler, scaler, nullcontext)
    start_epoch, best = restore(checkpoint, state, s, 1)
    assert start_epoch == 1 and best == checkpoint["best_acc1"]
    assert s.recipe.start_epoch == 0  # the settings are not written
    assert scaler.get_scale() == torch.amp.GradScaler("cpu").get_scale()


def _states(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    return rng_state(torch.device("cpu"))


def test_each_rank_restores_its_own_rng_state():
    saved = [_states(10), _states(11)]
    for rank, world in ((0, 2), (1, 2)):
        random.seed(99)
        restore_rng(saved, DistInfo(rank=rank, world_size=world))
        assert torch.equal(torch.get_rng_state(), saved[rank]["torch"])
        assert random.getstate() == saved[rank]["python"]
    torch.manual_seed(5)
    fresh = torch.get_rng_state()
    restore_rng(saved, DistInfo(rank=2, world_size=3))  # no state saved for rank 2
    assert torch.equal(torch.get_rng_state(), fresh)


def test_older_checkpoint_rng_format_restores_on_fewer_gpus():
    """Before per-rank states, "rng" was rank 0's dict with every visible GPU's CUDA state:
    evaluating such a checkpoint (say from 8 GPUs) elsewhere restores what exists."""
    old = {**_states(3), "cuda": [torch.zeros(16, dtype=torch.uint8)] * 8}
    restore_rng(old, DistInfo())
    assert torch.equal(torch.get_rng_state(), old["torch"])
    restore_rng({**old, "cuda": []}, DistInfo())


def test_gathered_rng_states_are_saved_by_rank(tiny, tmp_path):
    checkpoint = _checkpoint_without_amp(tiny, tmp_path)
    assert isinstance(checkpoint["rng"], list) and len(checkpoint["rng"]) == 1
    assert checkpoint["rng"][0]["cuda"] is None and checkpoint["rng"][0]["torch"].numel() > 0


def test_unwrap_sees_through_compile_and_data_parallel():
    model = nn.Linear(2, 2)
    assert unwrap(torch.compile(model)) is model
    assert unwrap(torch.compile(nn.DataParallel(model))) is model
    assert unwrap(nn.DataParallel(model)) is model and unwrap(model) is model


def test_steady_state_images_per_sec_leaves_out_the_warmup_steps(tiny, tmp_path, monkeypatch):
    """A known warm-up: the first 2 of 8 steps take 0.5 s longer each. The steady figure's 24
    images then took at most the pass's time less that second, while the pass's own figure
    holds all of it; with a warm-up as long as the pass there is no steady figure."""
    import time

    from engine import loop

    step = loop.train_step

    def slow_warmup(state, images, labels, epoch, number):
        if number < 2:
            time.sleep(0.5)
        return step(state, images, labels, epoch, number)

    monkeypatch.setattr(loop, "train_step", slow_warmup)
    out = str(tmp_path / "out")
    small = [a if a != "8" else "4" for a in SMALL]  # -b 4: 8 training steps per epoch
    main.main([tiny.root, *small, "--epochs", "1", "--benchmark-warmup", "2",
               "--output-dir", out])
    main.main([tiny.root, *small, "--epochs", "1", "--benchmark-warmup", "8",
               "--output-dir", str(tmp_path / "short")])
    record = read_metrics(out)[0]
    assert record["train_images"] == 32
    steady_seconds = 24 / record["steady_images_per_sec"]
    pass_seconds = 32 / record["train_images_per_sec"]
    assert 0 < steady_seconds <= pass_seconds - 1.0
    assert read_metrics(str(tmp_path / "short"))[0]["steady_images_per_sec"] is None


def test_auto_workers_share_the_node_cores_among_its_gpus(monkeypatch):
    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert resolve_workers("auto", 8) == 2  # 8 GPUs on 16 cores
    assert resolve_workers("auto", 1) == 16  # every core, not at most 8
    assert resolve_workers("auto", 3) == 5
    assert resolve_workers("auto", 32) == 1 and resolve_workers(3, 8) == 3


def test_compile_trains_and_saves_bare_state_dict_keys(tmp_path):
    """--compile through main.py on the CPU (about 30 s of compilation on 2 cores)."""
    out = str(tmp_path / "compiled")
    last = main.main(["--dummy", "-a", "resnet18", "-b", "4", "--train-crop-size", "32",
                      "--val-resize-size", "32", "--val-crop-size", "32", "--train-batches", "2",
                      "--val-batches", "1", "--epochs", "1", "-p", "0", "-j", "0", "--compile",
                      "--output-dir", out, "--seed", "0"])
    assert last["train_images"] == 8
    state = torch.load(f"{out}/checkpoint.pth.tar", weights_only=True)["state_dict"]
    assert "fc.weight" in state and not any(k.startswith(("_orig_mod.", "module.")) for k in state)


def test_side_stream_waits_for_the_normalisation_constants(monkeypatch):
    """CudaFeeder computes scale/shift on the current stream; its side stream, which reads them
    in the first normalisation, must wait for that stream first (as timm's PrefetchLoader
    waits before each batch)."""
    from loaders.pipelines.workers import cuda_feed

    events = []

    class Stream:
        def __init__(self, device):
            events.append(("stream", device))

        def wait_stream(self, other):
            events.append(("wait", other))

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"current:{device}")
    device = torch.device("cuda", 3)
    feeder = cuda_feed.CudaFeeder(device, torch.float16, True, torch.full((1, 3, 1, 1), 2.0),
                                  torch.full((1, 3, 1, 1), 4.0))
    assert events == [("stream", device), ("wait", f"current:{device}")]
    assert feeder.scale.flatten().tolist() == [0.25] * 3
