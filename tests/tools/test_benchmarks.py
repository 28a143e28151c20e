"""The benchmark scripts run end to end on small data and report what they promise."""
import json
import os

import pytest

from benchmarks import runner
from benchmarks.loading import stage_cost, throughput, transforms
from decode import jpeg
from tests.helpers import warm


@pytest.fixture(autouse=True)
def warm_processes(monkeypatch):
    """The benchmarks' ``main.py --benchmark-data`` and ``-m benchmarks...`` processes
    (``runner.run_json_process``) start warm: tests.helpers.warm stands in for ``subprocess``."""
    monkeypatch.setattr(runner, "subprocess", warm)


def test_loading_throughput_writes_report_and_chart(tiny, tmp_path, capsys):
    out = tmp_path / "bench"
    assert throughput.main_cli(["--data", tiny.root, "--out", str(out), "-b", "4", "-j", "1",
                                   "--repeat", "2", "--batches", "3", "--warmup", "1",
                                   "--rounds", "1", "--only", "stock", "decode-only", "folder",
                                   "lmdb", "shards", "shards-http"]) == 0
    report = json.loads((out / "report.json").read_text())
    names = [r["loader"] for r in report["results"]]
    assert names == ["stock", "decode-only", "folder", "lmdb", "shards", "shards-http"]
    for result in report["results"]:
        assert result["images"] == 3 * 4 and result["images_per_sec"] > 0
        assert result["ratio_vs_stock"] > 0 and result["share_of_decode_only"] > 0
        # ours carry main.py's stage figures, the baselines none
        if result["loader"] in ("stock", "decode-only"):
            assert result["stages"] == {}
        else:
            assert result["stages"]["stages_decode_ms_p50"] > 0
            assert throughput.top_stage(result["stages"]).split()[0] in (
                "read", "window", "decode", "resize", "augment", "write")
    # ours are timed through main.py itself, so docs/performance.md can quote the command
    commands = {r["loader"]: r.get("command") for r in report["results"]}
    assert commands["stock"] is None
    assert commands["lmdb"].startswith("main.py --lmdb DATA-LMDB ")
    assert commands["folder"].endswith("--benchmark-data")
    assert commands["shards-http"].startswith("main.py --loader shards http://127.0.0.1:PORT ")
    assert (out / "chart.png").read_bytes()[:4] == b"\x89PNG"
    assert "| folder |" in capsys.readouterr().out


def test_loading_stage_cost_times_both_settings_and_the_coverage(tiny, tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert stage_cost.main_cli(["--data", tiny.root, "--rounds", "1", "--copies", "2",
                                      "-b", "4", "-j", "1", "--batches", "2", "--warmup", "1",
                                      "--blocks", "2", "--block-batches", "1", "--overhead",
                                      "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [len(report["images_per_sec"][s]) for s in ("on", "off")] == [1, 1]
    assert report["cost"] == 1 - report["median_on"] / report["median_off"]
    (coverage,) = report["worker_coverage"]  # one worker, one run with the stages on
    assert 0 < coverage <= 1 + 1e-9  # inside the wall time (how much of it: the report's)
    assert len(report["blocks"]["ratios"]) == 2 and all(r > 0 for r in report["blocks"]["ratios"])
    assert report["overhead"]["worker_us_per_image"] > 0
    assert report["overhead"]["main_us_per_image"] > 0
    printed = capsys.readouterr().out
    assert "stages on " in printed and "alternating blocks" in printed
    assert "us of CPU per image in a worker" in printed


def test_loading_throughput_bad_data_is_one_line(tmp_path, capsys):
    assert throughput.main_cli(["--data", str(tmp_path / "nope")]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_loading_transforms_prints_each_step(tiny, capsys):
    transforms.main(["--data", tiny.root])
    out = capsys.readouterr().out
    assert "whole training transform, ours" in out and "decode, PIL" in out
    if jpeg.region.available():  # both sides of the crop + scale comparison, with figures
        for name in ("train transform 160 px", "train transform 224 px", "val transform 256/224"):
            line = next(x for x in out.splitlines() if f"{name}, ours" in x)
            assert float(line.split()[-1]) > 0
        assert out.count("the same, crop + scale off") == 3
    else:
        assert jpeg.region.status() in out


def test_pipelines_dali_cpu_prints_each_stage(tiny, capsys):
    import pytest

    pytest.importorskip("nvidia.dali")
    from benchmarks.pipelines import dali_cpu

    assert dali_cpu.main_cli(["--data", tiny.root, "-b", "8", "-j", "2",
                                      "--batches", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for stage in ("read", "decode whole image", "decode crop window", "antialiased",
                  "our --dali loader, 2 1-thread pipelines",
                  "our --dali loader, 1 pipeline of 2 threads"):
        assert stage in out
    speeds = [float(line.split()[-3]) for line in out.splitlines() if "our --dali" in line]
    assert len(speeds) == 2 and all(speed > 0 for speed in speeds)


def test_pipelines_dali_cpu_bad_data_is_one_line(tmp_path, capsys):
    from benchmarks.pipelines import dali_cpu

    assert dali_cpu.main_cli(["--data", str(tmp_path / "nope")]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_converters_speed_times_the_converter_against_decode_only(tiny, tmp_path, capsys):
    from benchmarks.converters import speed

    out = tmp_path / "convert.json"
    assert speed.main_cli(["--data", os.path.join(tiny.root, "train"), "--copies", "2",
                                   "--rounds", "1", "--memory-records", "40", "80",
                                   "--tmp", str(tmp_path), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    names = [r["name"] for r in report["speed"]["results"]]
    assert names == ["decode-only", "decode-only, luma", "convert --check full",
                     "convert --check header"]
    assert report["speed"]["files"] == 2 * 4 * 8
    for result in report["speed"]["results"]:
        assert result["images_per_sec"] > 0 and result["per_core"] > 0
    memory = report["memory"]
    assert [r["records"] for r in memory["runs"]] == [40, 80] and memory["extrapolated"]
    assert all(r["peak_rss"] > 10 * (1 << 20) for r in memory["runs"])
    printed = capsys.readouterr().out
    assert "convert --check full" in printed and "1281167 records" in printed


def test_converters_speed_bad_data_is_one_line(tmp_path, capsys):
    from benchmarks.converters import speed

    assert speed.main_cli(["--data", str(tmp_path / "nope"), "--rounds", "1",
                                   "--tmp", str(tmp_path)]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_converters_downloads_times_every_layout_against_the_folder(sample_images, tmp_path,
                                                                   capsys):
    from benchmarks.converters import downloads

    out = tmp_path / "report.json"
    images = len(os.listdir(os.path.join(sample_images, "train")))  # one per class
    assert downloads.main(["--sample", sample_images, "--copies", "1", "--rounds", "1",
                                 "--layouts", "folder", "official", "hf-parquet",
                                 "--tmp", str(tmp_path), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["images"] == images and [r["layout"] for r in report["results"]] == \
        ["folder", "official", "hf-parquet"]
    by_layout = {r["layout"]: r for r in report["results"]}
    assert by_layout["folder"]["ratio_to_first"] == 1.0
    assert by_layout["official"]["extra_mib_per_1000"] == 0  # read in place: output only
    assert by_layout["hf-parquet"]["extra_mib_per_1000"] > 50  # the staged copy
    assert 50 < by_layout["official"]["mib_per_1000"] < 200
    assert os.listdir(tmp_path) == ["report.json"]  # replicas and output deleted
    assert "vs folder" in capsys.readouterr().out


def test_decoders_scaled_above_and_below_the_threshold(tiny, tmp_path, capsys):
    from benchmarks.decoders import scaled

    args = ["--data", tiny.root, "--sizes", "16", "--draws", "2", "--rounds", "1",
            "--libturbojpeg", str(tmp_path / "missing.so")]
    assert scaled.main(args) == 0
    assert scaled.main(args + ["--below"]) == 0
    out = capsys.readouterr().out
    assert "tj3: not usable (" in out  # one line, and the other candidates still run
    assert "windows decoded scaled (1/2:" in out and "windows under the threshold" in out
    rows = [line for line in out.splitlines() if "ms/window" in line]
    assert len(rows) >= 4 and all("same on a second pass" in line for line in rows)
    # today's path below the threshold decodes the window exactly as a full decode does
    window_rows = [line for line in rows if line.lstrip().startswith("window, full scale")]
    assert "max |diff|   0" in window_rows[-1]


@pytest.mark.slow
def test_pipelines_dali_feed_reports_feed_time_speed_and_memory(tiny, tmp_path, capsys):
    """DALI's CPU figures through main.py's own loader, against a base checkout (this
    one): per-batch time on the training thread, images/s and RSS per epoch, every round."""
    import pytest

    pytest.importorskip("nvidia.dali")
    from benchmarks.pipelines import dali_feed

    out = tmp_path / "rounds.json"
    assert dali_feed.main_cli(["--data", tiny.root, "--base", dali_feed.__file__
                                     .rsplit("/benchmarks/", 1)[0], "--repeat", "4", "-b", "16",
                                     "--batches", "2", "--warmup", "1", "--epochs", "2",
                                     "--rounds", "1", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("  new:") and lines[1].startswith(" base:")
    assert "ms (median; target <= 2.0)" in lines[0] and lines[2].startswith("new vs base")
    rounds = json.loads(out.read_text())["rounds"]
    for code in ("new", "base"):
        (row,) = rounds[code]
        assert row["images_per_sec"] > 0 and 0 < row["feed_ms_median"] <= row["feed_ms_mean"] * 4
        assert len(row["rss_mib"]) == 2 and all(m > 0 for m in row["rss_mib"])
    assert dali_feed.main_cli(["--data", str(tmp_path / "nope")]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.slow
def test_training_recipes_prints_every_target(tiny, tmp_path, capsys):
    """Every part on tiny data: the throughput pair, torchvision's pixels, the costs table,
    and torchvision's command on 2 ranks (test-sized further by --command-extra)."""
    from benchmarks.training import recipes

    out = tmp_path / "recipes.json"
    extra = ("--model resnet18 --train-batches 2 --train-crop-size 32 --val-resize-size 32 "
             "--val-crop-size 32")
    assert recipes.main_cli([
        "--data", tiny.root, "--copies", "8", "--crop", "32", "-b", "4", "-j", "1",
        "--batches", "2", "--warmup", "1", "--rounds", "1", "--draws", "3", "--images", "4",
        "--command-batch", "8", "--command-extra", extra, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ratio" in printed and "identical pixels everywhere (target): met" in printed
    report = json.loads(out.read_text())
    assert report["throughput"]["plain"] > 0 and report["throughput"]["augmented"] > 0
    assert all(r["differ"] == 0 for r in report["exact"].values())
    assert len(report["costs"]["recipes"]) == 7 and "Equalize" in report["costs"]["ops"]
    assert report["command"]["met"] and report["command"]["train_images"] == 2 * 2 * 8


def test_training_recipes_bad_data_is_one_line(tmp_path, capsys):
    from benchmarks.training import recipes

    assert recipes.main_cli(["--data", str(tmp_path / "nope")]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_pipelines_gpu_decode_prints_both_pipelines_from_every_source(tiny, tmp_path, capsys):
    """The batch-decode figures here: the CPU loaders beside the batch-decode pipeline on
    nvImageCodec's CPU backend, from folder, LMDB and shards, through main.py."""
    import pytest

    pytest.importorskip("nvidia.nvimgcodec")
    from benchmarks.pipelines import gpu_decode

    out = tmp_path / "rounds.json"
    assert gpu_decode.main_cli(["--data", tiny.root, "--repeat", "2", "-b", "8",
                                      "--batches", "2", "--warmup", "1", "--rounds", "1",
                                      "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| folder | cpu-nvimgcodec | 2 | 224 |" in printed and "not measured here" in printed
    results = json.loads(out.read_text())["results"]
    assert {(r["source"], r["decode_device"]) for r in results} == {
        (s, d) for s in ("folder", "lmdb", "shards") for d in ("cpu", "cpu-nvimgcodec")}
    assert all(r["images_per_sec"] > 0 and r["cpu_ms_per_image"] is not None for r in results)
    assert gpu_decode.main_cli(["--data", str(tmp_path / "nope")]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_top_stage_takes_a_batch_pipelines_own_stages():
    """--decode-device and DALI write keys for their own stages only (no write stage)."""
    assert throughput.top_stage({"stages_read_ms_mean": 1.0, "stages_decode_ms_mean": 3.0}) \
        == "decode 75%"
    assert throughput.top_stage({}) == "-"


def test_chart_puts_ffcv_beside_ours_when_bench_ffcv_timed_the_same_images(tmp_path, monkeypatch):
    """make bench's chart gains FFCV's panel only from a make bench-ffcv report of the same
    DATA (all images): another image set, a bucket or --larger-than leave it out."""
    data = str(tmp_path / "imagenet")
    ffcv = {"image_set": {"data": data, "bucket": "all", "larger_than": None}, "repeat": 8,
            "rounds": 3, "median": {"160": {"lmdb-512": 900.0, "beton-512": 700.0},
                                    "224": {"lmdb-512": 600.0, "beton-512": 500.0,
                                            "beton-example": 800.0}}}
    (tmp_path / "out" / "ffcv").mkdir(parents=True)
    path = tmp_path / "out" / "ffcv" / "report.json"
    assert throughput.ffcv_beside(str(tmp_path / "out"), data) is None  # none written yet
    path.write_text(json.dumps(ffcv))
    assert throughput.ffcv_beside(str(tmp_path / "out"), data) == ffcv
    assert throughput.ffcv_beside(str(tmp_path / "out"), str(tmp_path / "other")) is None
    path.write_text(json.dumps({**ffcv, "image_set": {**ffcv["image_set"], "larger_than": 512}}))
    assert throughput.ffcv_beside(str(tmp_path / "out"), data) is None
    report = {"results": [{"loader": "stock", "images_per_sec": 300.0, "ratio_vs_stock": 1.0},
                          {"loader": "lmdb", "images_per_sec": 650.0, "ratio_vs_stock": 2.17}],
              "machine": {"cpu_count": 2, "device": "cpu"},
              "config": {"data": data, "repeat": 16, "images": 250, "batch_size": 64,
                         "workers": 2, "rounds": 5}}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = []
    real_savefig = plt.Figure.savefig

    def savefig(fig, target, **kwargs):
        titles.append([ax.get_title() for ax in fig.axes])
        return real_savefig(fig, target, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", savefig)
    throughput.write_chart(report, str(tmp_path / "alone.png"))
    throughput.write_chart(report, str(tmp_path / "both.png"), ffcv)
    assert titles[0] == ["Training loaders on imagenet (250 training JPEGs x16): -b 64 -j 2, "
                         "5 rounds, 2 cores (cpu)"]
    assert len(titles[1]) == 2 and "224 px" in titles[1][1] and "FFCV 1.0.2" in titles[1][1]
    for name in ("alone.png", "both.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_loading_throughput_http_server_is_quiet_when_a_client_closes_early(tmp_path, capfd):
    import socket
    import struct
    import threading
    import time

    (tmp_path / "shard.tar").write_bytes(bytes(16 << 20))
    before = set(threading.enumerate())
    server = throughput.serve_http(str(tmp_path))
    try:
        for _ in range(8):  # as a loader's stream closes at the end of its batches
            client = socket.create_connection(server.server_address)
            client.sendall(b"GET /shard.tar HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            client.recv(4096)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # a reset, not a FIN: the server's next write fails
        deadline = time.monotonic() + 30
        while len(set(threading.enumerate()) - before) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # every request's thread has ended (the serving thread remains)
        assert len(set(threading.enumerate()) - before) == 1
    finally:
        server.shutdown()
        server.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err[-2000:]


def test_loading_throughput_http_server_sends_whole_files(tmp_path):
    import urllib.request

    data = os.urandom(3 << 20)  # several sendfile chunks
    (tmp_path / "shard.tar").write_bytes(data)
    server = throughput.serve_http(str(tmp_path))
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/shard.tar"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.read() == data
    finally:
        server.shutdown()
        server.server_close()
