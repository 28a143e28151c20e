"""main.py's settings and presets, and the engine's pieces: the command line's namespace is never
written, presets are checked as the command line is, one preset key picks the backend, the
checkpoint records what the user typed (older per-process configs still resume), and the
progress wrapper keeps the pass's timing."""
import copy
import json
import os

import pytest
import torch

import main
from engine.distributed.processes import Job
from engine.loop import EpochSums
from engine.report.progress import Progress
from engine.settings import resolve_backend, resolve_settings
from loaders import DistInfo
from tests.helpers.runs import SMALL, cli_in_process, read_metrics

DUMMY = ["--dummy", "-b", "4", "--train-batches", "2", "--val-batches", "1",
         "--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32", "-p", "0",
         "-j", "0"]


def test_a_run_never_writes_the_parsed_arguments(tmp_path):
    args = main.parse_args([*DUMMY, "--epochs", "1", "--output-dir", str(tmp_path)])
    before = copy.deepcopy(vars(args))
    main.main_worker(args)
    assert vars(args) == before and args.seed is None  # drawn, but not written back
    ckpt = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert ckpt["config"] == before  # what the user typed
    assert isinstance(ckpt["seed"], int)  # the seed the run drew, to resume with


def test_spawned_process_settings_divide_the_node_totals_once(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    args = main.parse_args([str(tmp_path), "-b", "8", "-j", "3", "--benchmark-data",
                            "--train-batches", "6", "--seed", "2"])
    before = copy.deepcopy(vars(args))
    s = resolve_settings(args, Job(DistInfo(), processes_per_node=2, spawned=True), None)
    assert (s.loader.batch_size, s.loader.workers, s.seed) == (4, 2, 2)
    assert s.loader.train_path == str(tmp_path / "train")
    assert s.loader.train_batches is None  # --benchmark-data times past a capped epoch
    assert vars(args) == before


@pytest.mark.parametrize("text, message", [
    ("loader: lmbd\n", "argument --loader: invalid choice: 'lmbd'"),
    ("batch_size: many\n", "argument -b/--batch-size: expected a positive number, got 'many'"),
    ("amp: 1\n", "amp: expected true or false"),
    ("dali: true\n", "dali: write loader: dali"),
    ("learning_rat: 0.1\n", "unknown key(s) learning_rat"),
])
def test_bad_preset_value_is_one_line_naming_the_file(tmp_path, text, message, capfd):
    preset = tmp_path / "p.yaml"
    preset.write_text(text)
    result = cli_in_process(["-c", str(preset), "--dummy", "--epochs", "1"], capfd)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [f"main.py: error: --config {preset}: {lines[0].split(': ', 3)[-1]}"]
    assert message in lines[0]


def test_preset_values_become_flags_and_the_command_line_wins(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("loader: dali\nlmdb: true\namp: false\nworkers: 3\nweight-decay: 1.0e-4\n"
                      "data: /presets/data\n")
    args = main.parse_args(["-c", str(preset), "--amp", "-j", "auto"])
    assert (args.amp, args.workers, args.weight_decay, args.data) == (True, "auto", 1e-4,
                                                                     "/presets/data")
    assert resolve_backend(args) == ("dali", True)  # DALI reading the LMDBs
    assert main.parse_args(["-c", str(preset), "/cli"]).data == "/cli"


@pytest.mark.parametrize("argv, expected", [
    ([], ("folder", False)), (["--lmdb"], ("lmdb", True)), (["--loader", "lmdb"], ("lmdb", True)),
    (["--dali"], ("dali", False)), (["--dali", "--lmdb"], ("dali", True)),
    (["--loader", "dali", "--lmdb"], ("dali", True)), (["--dummy", "--lmdb"], ("synthetic", False)),
])
def test_backend_is_resolved_once_from_the_flags(argv, expected):
    assert resolve_backend(main.parse_args(argv)) == expected


def test_lmdb_with_a_backend_that_cannot_read_it_is_refused():
    with pytest.raises(main.ConfigError, match="--lmdb conflicts with --loader synthetic"):
        resolve_backend(main.parse_args(["--lmdb", "--loader", "synthetic"]))


def test_older_checkpoint_with_per_process_config_resumes(tmp_path, capsys):
    """Before RunSettings, ``config`` held the namespace as each process rewrote it (per-process
    -b and -j, the drawn seed) and there was no ``seed`` key: resuming uses its seed."""
    out = str(tmp_path / "out")
    main.main([*DUMMY, "--epochs", "1", "--output-dir", out, "--seed", "1234"])
    path = os.path.join(out, "checkpoint.pth.tar")
    ckpt = torch.load(path, weights_only=True)
    ckpt.pop("seed")
    ckpt["config"].update(batch_size=2, workers=1, dist_url="tcp://127.0.0.1:1")
    torch.save(ckpt, path)
    capsys.readouterr()
    main.main([*DUMMY, "--epochs", "2", "--output-dir", out, "--resume", path])
    printed = capsys.readouterr().out
    assert "seed 1234" in printed and "resumed from" in printed
    assert [r["epoch"] for r in read_metrics(out)] == [0, 1]


def test_progress_counts_images_and_waiting_time(capsys):
    """The carried counts go on: images added, and the waits for each batch (a loader that
    takes at least 0.05 s per batch) added to the carried 0.5 s, within the pass's time."""
    import time

    def batches():
        for size in (3, 2):
            time.sleep(0.05)
            yield torch.zeros(size, 1), torch.zeros(size)

    progress = Progress(2, "Test: ", "val", 1, True)
    progress.carry(images=10, data_time=0.5, seconds=1.0)
    steps = [step for step, _ in progress.log_every(batches(), lambda: {"loss": 1.0}, 4)]
    assert steps == [4, 5] and progress.images == 15
    assert len(progress.waits) == 2 and all(wait >= 0.05 for wait in progress.waits)
    assert progress.data_time == pytest.approx(0.5 + sum(progress.waits))
    assert 0.5 + 0.1 <= progress.data_time <= progress.elapsed() - 0.5
    assert capsys.readouterr().out.count("Test: [") == 2


def test_epoch_sums_keep_the_checkpoint_partial_keys():
    partial = {"loss_sum": 1.5, "correct": 3, "images": 8, "data_time": 0.25, "seconds": 2.0}
    assert EpochSums.from_dict(partial).to_dict() == partial
    assert EpochSums.from_dict(None) == EpochSums()


def test_small_flags_still_train(tiny, tmp_path):
    """The shared SMALL flags through main_worker: metrics written, args untouched."""
    args = main.parse_args([tiny.root, *SMALL, "--epochs", "1", "--output-dir", str(tmp_path)])
    before = copy.deepcopy(vars(args))
    main.main_worker(args)
    assert vars(args) == before and len(read_metrics(str(tmp_path))) == 1


def test_metrics_writer_tensorboard_without_threads(tmp_path):
    """Scalars reach a TensorBoard event file that TensorBoard reads back, and no writer thread
    runs (DataLoader workers fork from this process: see engine.report.progress.EventFile)."""
    import threading

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from engine.report.progress import MetricsWriter

    before = threading.active_count()
    writer = MetricsWriter(str(tmp_path))
    writer.scalar("step/loss", 2.5, 7)
    writer.write({"epoch": 0, "val_acc1": 12.5, "train_loss": 3.0, "skipped": None})
    assert threading.active_count() == before
    writer.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["epoch/train_loss", "epoch/val_acc1", "step/loss"]
    (loss,) = events.Scalars("step/loss")
    assert (loss.step, loss.value) == (7, 2.5)
    assert events.Scalars("epoch/val_acc1")[0].value == 12.5
    assert [json.loads(line)["val_acc1"] for line in open(tmp_path / "metrics.jsonl")] == [12.5]


def test_main_threads_policy():
    """1 thread while the main process only feeds a GPU or --benchmark-data; the node's cores
    shared by its processes when the model runs on the CPU; OMP_NUM_THREADS always wins."""
    from engine.settings import main_threads

    cores = len(os.sched_getaffinity(0))
    assert main_threads("cuda", runs_model=True, environ={}) == 1
    assert main_threads("cpu", runs_model=False, environ={}) == 1
    assert main_threads("cpu", runs_model=True, environ={}) == cores
    assert main_threads("cpu", runs_model=True, processes_per_node=cores * 2, environ={}) == 1
    assert main_threads("cpu", runs_model=False, environ={"OMP_NUM_THREADS": "3"}) is None


def test_benchmark_data_runs_one_main_thread(tiny, capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    try:
        main.main([tiny.root, "--benchmark-data", "-b", "4", "-j", "1", "--train-batches", "2",
                   "--benchmark-warmup", "0", "--seed", "0"])
        assert torch.get_num_threads() == 1
        assert "1 torch thread(s) in the main process" in capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)
