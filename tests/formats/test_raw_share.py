"""The raw-pixel share (formats/raw_share.py, --raw-budget): budgets, the cost model and the
choice by decode time saved per extra byte; LMDBs and shards written with it (version 2, raw
records equal to the JPEGs' decoded pixels, within the budget, verified, resumed as an
uninterrupted run); stores written without it byte for byte as before."""
import json
import math
import os
import sys

import pytest
import torch

import folder2lmdb
import formats.lmdb as codec
from decode import decode
from decode.raw import is_raw
from formats import raw_share
from formats.raw_share import Budget, CostModel, RawChoice, parse_budget
from formats.images import check_image
from formats.shards import convert as convert_shards, verify as verify_shards
from formats.sources import list_sources
from tests.helpers import warm
from tests.helpers.paths import REPO
from tests.helpers.stores import raw_records, store_digest

# Digests of the real sample converted by the code before raw records existed (commit 36c0b74:
# folder2lmdb --shuffle-seed 0, folder2shards --max-per-shard 100, no cap: byte-exact records,
# so they depend on the sample's files alone).
# The stores of the real sample's train/ as written without a raw share (the shards' index.json
# records formats.images.RULES_VERSION; an LMDB's meta does not).
BEFORE = {"lmdb": "07e85fcc2f0420301437943920e393148148cfe2ecf258967e244738c1883867",
          "shards": "cd4a13ac28024105ccc64ac96269d98adb101dc689612d00b8d501206efd1e7d"}


def test_budgets_parse_as_a_share_or_a_size():
    assert parse_budget("1.5x") == Budget("1.5x", share=1.5)
    assert parse_budget(" 2.7X ").share == 2.7
    assert parse_budget("200M").size == parse_budget("200MB").size == 200 << 20
    assert parse_budget("1.5G").size == int(1.5 * (1 << 30))
    assert parse_budget("1000").size == 1000
    for bad in ("1x", "0.5x", "x", "-3M", "lots", "0"):
        with pytest.raises(ValueError, match="--raw-budget"):
            parse_budget(bad)


def test_the_cost_model_fits_non_negative_terms():
    pixels = [100_000, 200_000, 150_000, 300_000]
    jpeg = [40_000, 60_000, 90_000, 100_000]
    saved = [1e-4 + 2e-9 * p + 3e-9 * j for p, j in zip(pixels, jpeg)]
    model = CostModel.fit(pixels, jpeg, saved)
    assert model.saved(250_000, 70_000) == pytest.approx(1e-4 + 2e-9 * 250_000 + 3e-9 * 70_000)
    negative = CostModel.fit(pixels, jpeg, [2e-9 * p - 1e-3 for p in pixels])
    assert min(negative.a, negative.b, negative.c) >= 0 and negative.sampled == 4


def test_images_go_raw_by_saving_per_extra_byte_and_the_budget_holds():
    model = CostModel(0.0, 1e-9, 0.0)  # saving proportional to pixels
    # (pixels, jpeg bytes, raw bytes): the second saves as much for fewer extra bytes
    rows = [(100, 50, 300), (100, 250, 300), (100, 100, 300), (10, 5, 30)]
    level = raw_share.threshold(Budget("2x", share=2.0), model, rows, len(rows))
    choice = RawChoice(Budget("2x", share=2.0), model, level)
    assert choice.candidate(100, 250, 300) and not choice.candidate(100, 50, 300)
    taken = [choice.take(j, r if choice.candidate(p, j, r) else None, p, i + 1, 4)
             for i, (p, j, r) in enumerate(rows)]
    assert taken[1] and not taken[0]
    assert choice.stored <= 2.0 * choice.jpeg and choice.jpeg == 405
    assert raw_share.ratio(model, 100, 400, 300) == math.inf  # raw no larger: always worth it
    sized = RawChoice(Budget("1000", size=1000), model, 0.0)
    # pro rata: after 1 of 4 files the store may hold 250 bytes
    assert not sized.take(50, 300, 100, 1, 4) and sized.take(50, 300, 100, 3, 4)


def test_the_threshold_is_set_on_every_sampled_image_the_model_on_the_timed_ones(tiny,
                                                                                monkeypatch):
    """plan(): decode time is measured on the ``timed`` images only (the costly part), the
    threshold from the sizes of all of them; the 64 timed images are a subset of the 1,024."""
    stored = [check_image(open(s.path, "rb").read()).data
              for s in list_sources(os.path.join(tiny.root, "train")).files]
    timed = []
    monkeypatch.setattr(raw_share, "time_saving",
                        lambda jpeg, raw: timed.append(jpeg) or 1e-3)
    choice = raw_share.plan(Budget("2x", share=2.0), stored, len(stored), [0, 2])
    assert timed == [stored[0], stored[2]]
    rows = [raw_share._sizes(data) for data in stored]
    assert choice.threshold == raw_share.threshold(Budget("2x", share=2.0), choice.model, rows,
                                                   len(stored))
    for count in (50, 2000, 1_281_167):
        assert set(raw_share.sample_indices(count)) <= set(
            raw_share.sample_indices(count, raw_share.SIZE_SAMPLE))


def _convert(src, out, budget, **kwargs):
    return folder2lmdb.convert(src, out, progress=False, raw_budget=parse_budget(budget),
                               **kwargs)


def test_an_lmdb_with_a_raw_share_holds_the_jpegs_pixels_within_its_budget(tiny, tmp_path):
    src = os.path.join(tiny.root, "train")
    plain, mixed = str(tmp_path / "plain"), str(tmp_path / "mixed")
    folder2lmdb.convert(src, plain, progress=False)
    summary = _convert(src, mixed, "8x")
    meta = codec.read_meta(mixed)
    kinds = raw_records(mixed)
    assert meta.version == codec.RAW_VERSION and meta.raw["records"] == sum(kinds)
    assert 0 < sum(kinds) < len(kinds), "the tiny set mixes both kinds at 8x"
    assert "raw pixels:" in summary.line() and "per epoch" in summary.line()
    assert summary.bytes <= 8 * meta.raw["jpeg"]
    assert meta.raw["jpeg"] == summary.bytes - meta.raw["extra"]
    with codec.open_readonly(plain).begin() as a, codec.open_readonly(mixed).begin() as b:
        for i in range(meta.count):
            jpeg, label = codec.decode_record(a.get(codec.record_key(i)))
            data, same_label = codec.decode_record(b.get(codec.record_key(i)))
            assert label == same_label
            if is_raw(data):
                assert torch.equal(decode(data), decode(jpeg))
            else:
                assert data == jpeg
    result = folder2lmdb.verify(mixed, src)
    assert result.total == 0, result.problems


def test_verify_finds_a_damaged_raw_record(tiny, tmp_path):
    import lmdb

    out = str(tmp_path / "mixed")
    _convert(os.path.join(tiny.root, "train"), out, "8x")
    index = raw_records(out).index(True)
    codec.close_readonly(out)
    env = lmdb.open(out, subdir=True)
    with env.begin(write=True) as txn:
        data, label = codec.decode_record(txn.get(codec.record_key(index)))
        txn.put(codec.record_key(index), codec.encode_record(data[:-3], label))
    env.close()
    problems = folder2lmdb.verify(out).problems
    assert any("malformed raw record" in p for p in problems)
    assert any("checksum mismatch" in p for p in problems)


def test_shards_with_a_raw_share_are_version_2_and_verify(tiny, tmp_path):
    src, out = os.path.join(tiny.root, "train"), str(tmp_path / "shards")
    summary = convert_shards(src, out, progress=False, max_per_shard=10,
                             raw_budget=parse_budget("8x"))
    with open(os.path.join(out, "index.json")) as f:
        index = json.load(f)
    assert index["version"] == 2 and index["raw"]["records"] > 0
    idx = "".join(open(os.path.join(out, n)).read() for n in sorted(os.listdir(out))
                  if n.endswith(".idx"))
    assert idx.count(".ppm ") == index["raw"]["records"] and ".jpg " in idx
    assert "raw pixels:" in summary.line()
    result = verify_shards(out, src)
    assert result.total == 0, result.problems


def test_an_interrupted_raw_share_resumes_as_the_uninterrupted_run(tiny, tmp_path, monkeypatch):
    """The choice (model, threshold, totals) comes from the resume state, not a new timing."""
    src = os.path.join(tiny.root, "train")
    whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
    _convert(src, whole, "8x", batch_size=5)
    choice = RawChoice.from_state(codec.read_meta(whole).raw)
    planned = RawChoice(choice.budget, choice.model, choice.threshold)
    monkeypatch.setattr(raw_share, "plan", lambda *a: RawChoice(planned.budget, planned.model,
                                                                planned.threshold))
    from formats.lmdb import _convert as lmdb_convert

    real = lmdb_convert._commit_after
    calls = []

    def failing(previous, writer, puts, *rest):
        calls.append(1)
        if len(calls) == 4:
            raise OSError("interrupted")
        return real(previous, writer, puts, *rest)

    monkeypatch.setattr(lmdb_convert, "_commit_after", failing)
    with pytest.raises(OSError):
        _convert(src, cut, "8x", batch_size=5)
    monkeypatch.setattr(lmdb_convert, "_commit_after", real)
    monkeypatch.setattr(raw_share, "plan", lambda *a: pytest.fail("re-planned on resume"))
    summary = _convert(src, cut, "8x", batch_size=5)
    assert summary.resumed_at > 0
    assert store_digest(cut) == store_digest(whole)


def test_stores_without_a_raw_share_are_byte_for_byte_as_before(sample, tmp_path):
    train = os.path.join(sample, "train")
    lmdb_out, shards_out = str(tmp_path / "lmdb"), str(tmp_path / "shards")
    folder2lmdb.convert(train, lmdb_out, progress=False, shuffle_seed=0, workers=2)
    convert_shards(train, shards_out, progress=False, workers=2, max_per_shard=100)
    assert store_digest(lmdb_out) == BEFORE["lmdb"]
    assert store_digest(shards_out) == BEFORE["shards"]


def test_without_a_raw_share_nothing_of_it_is_written(tiny, tmp_path):
    src = os.path.join(tiny.root, "train")
    folder2lmdb.convert(src, str(tmp_path / "db"), progress=False)
    meta = codec.read_meta(str(tmp_path / "db"))
    assert meta.version == codec.BASE_VERSION == 1 and meta.raw == {}
    assert not any(raw_records(str(tmp_path / "db")))
    convert_shards(src, str(tmp_path / "shards"), progress=False)
    index = json.load(open(tmp_path / "shards" / "index.json"))
    assert index["version"] == 1 and "raw" not in index


def test_a_bad_budget_is_one_line(tiny, tmp_path):
    run = warm.run([sys.executable, "folder2lmdb.py", "-d", os.path.join(tiny.root, "train"),
                          "-o", str(tmp_path / "db"), "--raw-budget", "lots"],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("folder2lmdb.py: error: --raw-budget 'lots'"), run.stderr
    assert "Traceback" not in run.stderr


def test_interrupted_shards_resume_with_the_choice_of_their_last_finished_shard(tiny, tmp_path,
                                                                                 monkeypatch):
    """Shards finished before an interruption keep their raw choice, and the rest are written
    with the model, threshold and totals of the last finished one: the same shards as before."""
    src, out = os.path.join(tiny.root, "train"), str(tmp_path / "shards")
    convert_shards(src, out, progress=False, max_per_shard=5, raw_budget=parse_budget("8x"))
    expected = store_digest(out)
    progress_path = os.path.join(out, "progress.json")
    with open(progress_path) as f:
        progress = json.load(f)
    assert all("raw" in shard for shard in progress["shards"])
    progress["shards"] = progress["shards"][:2]  # as if killed while writing the third shard
    with open(progress_path, "w") as f:
        json.dump(progress, f)
    os.remove(os.path.join(out, "index.json"))
    monkeypatch.setattr(raw_share, "plan", lambda *a: pytest.fail("re-planned on resume"))
    summary = convert_shards(src, out, progress=False, max_per_shard=5,
                             raw_budget=parse_budget("8x"))
    assert summary.resumed_at == progress["shards"][-1]["done"] > 0
    assert store_digest(out) == expected
