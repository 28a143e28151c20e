"""What the GPU check's tests share: a bundle folder made from the sample (or its stand-in),
its command line run in this process, and every command faked as on one H100
(:mod:`tools.gpu_check`)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import zipfile

from tools.gpu_check import check


def make_bundle(sample: str, root, classes: int = 8):
    """A ``make gpu-bundle``-like folder: ``sample/train/<wnid>/`` copied from the real sample,
    ``sample/val`` a relative link to it, an empty ``wheels/``."""
    train = root / "sample" / "train"
    for wnid in sorted(os.listdir(os.path.join(sample, "train")))[:classes]:
        shutil.copytree(os.path.join(sample, "train", wnid), train / wnid)
    os.symlink("train", root / "sample" / "val")
    (root / "wheels").mkdir()
    return root


def in_process(main_cli, argv):
    """A tool's ``main_cli(argv)`` in this process: ``(exit status, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main_cli(argv)
    return code, out.getvalue(), err.getvalue()


def gpu_check_cli(argv):
    """``python -m tools.gpu_check`` in this process: ``(exit status, stdout, stderr)``."""
    return in_process(check.main_cli, argv)


SPEEDS = {"synthetic": 1000.0, "folder": 700.0, "lmdb": 960.0, "dali": 980.0,
          "dali-lmdb": 975.0, "gpudecode": 985.0}


MACHINE = {"python": "3.12.3", "platform": "Linux", "cpu_cores": 16, "torch": "2.11.0",
           "torchvision": "0.26.0", "cuda": "12.8", "cudnn": 91000, "gpu_count": 1,
           "cuda_driver_api": "12.8", "dali": "1.50.0", "lmdb": "3.0.0", "pytest": "9.2.0",
           "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85e9}]}


def fake_gpu_run(self, name, cmd, timeout, env=None):
    """Runner.run as on ``self.machine`` (default :data:`MACHINE`: one H100 with DALI): each
    command 'succeeds' with plausible output."""
    record = {"name": name, "command": " ".join(cmd), "seconds": 1.0, "returncode": 0,
              "status": "passed", **({"env": env} if env else {})}
    self.calls.append(cmd)
    out = ""
    if name == "environment":
        out = json.dumps(getattr(self, "machine", MACHINE))
    elif name.startswith("pytest"):
        out = getattr(self, "pytest_out", "...\n3 passed, 259 deselected in 5.01s\n")
    elif name == "dali-gpu-decode":  # on_cpu: nvJPEG not found, DALI decoded on the CPU
        on_cpu = getattr(self, "dali_on_cpu", False)
        out = json.dumps({"dali": "2.4.0", "output": "TensorListGPU", "shape": [48, 64, 3],
                          "nvimgcodec_gpu": not on_cpu, "libraries": [] if on_cpu else [
                              "/site/nvidia/cu13/lib/libnvjpeg.so.13"]})
    elif name == "gpu-decode-probe":
        out = json.dumps({"decoder_line": "batch windows: nvImageCodec 0.9.0 on cuda:0 (...)",
                          "on_device": 2, "fallback": 0, "max_diff": 2.0, "torchvision": {
                              "on_device": 2, "fallback": 0, "max_diff": 2.0}})
    elif name == "gpu-decode-hardware":
        out = json.dumps({"whole": True, "window": getattr(self, "hardware_windows", True)})
    elif "--benchmark-data" in cmd:  # decoding on the CPU with one thread: 1,000 images/s
        cpu = "--dali-cpu" in cmd or name == "loader-gpudecode-cpu-j1"
        speed = 1000.0 if cpu else 5120.0
        out = ("device: cuda:0; world size 1; decode: batch windows: nvImageCodec 0.9.0 on "
               "cuda:0 (hardware JPEG decoder where present, load 0.65, then CUDA); seed 0\n"
               if "--decode-device" in cmd else "")
        out += json.dumps({"loader": name[7:], "images": 10240, "seconds": 2.0,
                          "images_per_sec": speed, "workers": int(cmd[cmd.index("-j") + 1])
                          if cmd[cmd.index("-j") + 1].isdigit() else 8, "batch_size": 256,
                          "cpu_count": 16, "world_size": 1, "device": "cuda:0"})
    elif "--output-dir" in cmd:
        loader = ("synthetic" if "--dummy" in cmd else "gpudecode" if "--decode-device" in cmd
                  else ("dali-lmdb" if "--lmdb" in cmd else "dali") if "--dali" in cmd
                  else "lmdb" if "--lmdb" in cmd else "folder")
        speed = SPEEDS[loader] * (1.2 if "--compile" in cmd else 1.0) * (
            1.8 if "--train-crop-size" in cmd else 1.0)
        rundir = cmd[cmd.index("--output-dir") + 1]
        os.makedirs(rundir, exist_ok=True)
        with open(os.path.join(rundir, "metrics.jsonl"), "w") as f:
            for epoch in range(int(cmd[cmd.index("--epochs") + 1]) if "--epochs" in cmd else 1):
                f.write(json.dumps({"epoch": epoch, "train_images_per_sec": speed / 2,
                                    "steady_images_per_sec": speed, "val_acc1": 1.0,
                                    "data_time_fraction": 0.01, "host_rss_mib": 9000.0,
                                    "device_memory_mib": 20000.0 + epoch * getattr(
                                        self, "memory_growth_mib", 0.0)}) + "\n")
        group = " (nccl process group)" if name == "distributed" else ""
        batch = (" decode: batch windows: nvImageCodec 0.9.0 on cuda:0 (hardware JPEG decoder "
                 "where present, load 0.65, then CUDA);" if "--decode-device" in cmd else "")
        out = f"device: cuda:0; world size 1{group};{batch} seed 0\n"
    with open(self.log(name, "out"), "w") as f:
        f.write(out)
    if "--decode-device" in cmd and getattr(self, "cpu_fallbacks", 0):
        with open(self.log(name, "err"), "w") as f:  # the batch-decode loader's note
            f.write(f"note: {self.cpu_fallbacks} samples decoded on the CPU this pass (cuda "
                    "batch decoder declined them)\n")
    return record


def fake_host(monkeypatch) -> None:
    """Every command of the check faked as on one H100 host (:func:`fake_gpu_run`), no
    nvidia-smi, and a short epoch (each symlink costs ~0.5 ms here)."""
    from tools.gpu_check import runner
    from tools.gpu_check.rows import measure

    monkeypatch.setattr(runner.Runner, "calls", [], raising=False)
    monkeypatch.setattr(runner.Runner, "run", fake_gpu_run)
    monkeypatch.setattr(measure.shutil, "which", lambda name: None)
    monkeypatch.setattr(measure, "data_batches", lambda s, m: 8)


def fake_wheel(folder, name: str, blob: int = 0) -> str:
    path = os.path.join(folder, f"{name}-1.0-py3-none-any.whl")
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('_', '/', 1) if blob else name}/__init__.py", "VALUE = 42\n")
        if blob:  # a large wheel, stored: its bytes as they are
            zf.writestr(f"{name}.blob", os.urandom(blob), zipfile.ZIP_STORED)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path
