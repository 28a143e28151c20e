"""A damaged sample is tried once per run: remembered in flags the DataLoader workers share
(fork and spawn), never drawn again in later epochs or validation passes, named once on stderr,
and counted once against ``--max-bad-share`` (distinct samples of the split, not attempts)."""
import os
import pickle

import pytest
import torch

import loaders
from loaders import DataError, DistInfo
from loaders.pipelines.bad_samples import BadSamples, UnreadableSet, fetch_readable
from tests.helpers.loading import loader_settings, to_uint8
from tools.datagen import label_from_pixels, make_split

# Train: 14 good + 6 bad = 20 files (the "6 bad files of 20"); bad0/bad1 and
# bad3/bad4 sort next to each other, so a replacement draw for one hits the other.
TRAIN_BAD = {"n00000000": ["bad0", "bad1"], "n00000001": ["bad2"],
             "n00000002": ["bad3", "bad4"], "n00000003": ["bad5"]}
VAL_BAD = {"n00000001": ["vbad0", "vbad1"], "n00000003": ["vbad2"]}


def _write_bad(root, bad):
    names = []
    for k, (wnid, stems) in enumerate(sorted(bad.items())):
        for j, stem in enumerate(stems):
            path = os.path.join(root, wnid, f"{wnid}_{stem}.JPEG")
            good = os.path.join(root, wnid, f"{wnid}_0.JPEG")
            kind = (k + j) % 3
            with open(path, "wb") as f:
                if kind == 0:
                    f.write(b"<html>not an image</html>")
                elif kind == 1:
                    f.write(open(good, "rb").read()[:150])  # truncated JPEG
                # kind 2: empty file
            names.append(os.path.basename(path))
    return names


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("damaged"))
    make_split(os.path.join(root, "train"), 4, 4, seed=0)
    for wnid in ("n00000002", "n00000003"):  # 14 good training files
        os.remove(os.path.join(root, "train", wnid, f"{wnid}_3.JPEG"))
    make_split(os.path.join(root, "val"), 4, 2, seed=1)  # 8 good + 3 bad
    train_bad = _write_bad(os.path.join(root, "train"), TRAIN_BAD)
    val_bad = _write_bad(os.path.join(root, "val"), VAL_BAD)
    return root, train_bad, val_bad


def _check_batches(batches):
    """Every delivered image is a good one: its pixels give its label."""
    for images, labels in batches:
        assert [label_from_pixels(image, 4) for image in to_uint8(images)] == labels.tolist()


def _run(train, val, epochs=3, val_passes=2):
    seen = 0
    for epoch in range(epochs):
        train.set_epoch(epoch)
        batches = list(train)
        assert len(batches) == len(train)
        _check_batches(batches)
        seen += sum(len(labels) for _, labels in batches)
        if epoch < val_passes:
            val_batches = list(val)
            _check_batches(val_batches)
            assert sum(len(labels) for _, labels in val_batches) == 11  # each position once
    return seen


def _assert_reported_once(err, names):
    for name in names:
        assert err.count(name) == 1, (name, err)
    assert err.count("skipping unreadable sample") == len(names)


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_folder_bad_files_are_reported_once_and_counted_once(damaged, capfd, context):
    root, train_bad, val_bad = damaged
    # 6 distinct of 20 is 30%: allowed at 0.3 even though 3 epochs draw them many times.
    train, val = loaders.build_loaders(loader_settings(
        "folder", data=root, workers=2, batch_size=4, max_bad_share=0.3), DistInfo())
    for loader in (train, val):
        loader.loader.multiprocessing_context = context
    # spawned workers import torch anew (seconds each): training's only, validation's flags
    # being the same shared memory
    val_passes = 2 if context == "fork" else 0
    assert _run(train, val, val_passes=val_passes) == 3 * 5 * 4
    _assert_reported_once(capfd.readouterr().err, train_bad + (val_bad if val_passes else []))
    assert train.unreadable.count() == len(train_bad) == 6
    assert val.unreadable.count() == (len(val_bad) if val_passes else 0) and len(val_bad) == 3


def test_max_bad_share_counts_distinct_samples_of_the_split(damaged, capfd):
    root, train_bad, _ = damaged
    # 6 distinct > 25% of 20 = 5: stops, naming 6 (not the attempts).
    train, _ = loaders.build_loaders(loader_settings(
        "folder", data=root, workers=2, batch_size=4, max_bad_share=0.25), DistInfo())
    with pytest.raises(DataError, match=r"samples failed to decode \(distinct unreadable "
                                        r"samples of the split's 20\)"):
        for epoch in range(3):
            train.set_epoch(epoch)
            list(train)
    assert train.unreadable.count() > 5
    capfd.readouterr()


class Counting(torch.utils.data.Dataset):
    """Samples ``bad`` raise; counts decode attempts per index (workers=0: one process)."""

    def __init__(self, size, bad):
        self.size, self.bad, self.tries = size, set(bad), [0] * size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        self.tries[index] += 1
        if index in self.bad:
            raise ValueError("broken")
        return index, index

    def name_of(self, index):
        return f"sample{index:03d}"


def test_a_bad_sample_is_decoded_once_and_replaced(capfd):
    data = Counting(20, bad=[3, 4, 5, 19])
    bad = BadSamples(20, data.name_of)

    def fetch(index, bad=bad):
        return fetch_readable(data.__getitem__, index, bad)

    for _ in range(3):
        items = [fetch(i) for i in range(20)]
        assert all(image not in data.bad for (image, _), _ in items)
    assert [data.tries[i] for i in (3, 4, 5, 19)] == [1, 1, 1, 1]
    assert fetch(3)[0] == (6, 6) and fetch(19)[0] == (0, 0)  # next readable, wrapping
    assert bad.unreadable.count() == 4
    err = capfd.readouterr().err
    for name in ("sample003", "sample004", "sample005", "sample019"):
        assert err.count(name) == 1
    # found counts only the samples an item newly found unreadable (fresh flags: 3, 4, 5).
    assert fetch(3, BadSamples(20, data.name_of))[1] == 3 and fetch(3)[1] == 0
    capfd.readouterr()


def test_unreadable_set_pickles_with_its_shared_flags():
    flags = UnreadableSet(8, shared=True)
    assert flags.flags.is_shared()
    assert flags.mark(2) and not flags.mark(2) and flags.known(2)
    clone = pickle.loads(pickle.dumps(flags))
    assert clone.known(2) and clone.count() == 1 and clone.next_readable(2) == 3
    everything = UnreadableSet(2)
    everything.mark(0), everything.mark(1)
    with pytest.raises(DataError, match="all 2 samples"):
        everything.next_readable(0)


def test_dali_bad_files_are_reported_once_and_counted_once(damaged, capfd):
    pytest.importorskip("nvidia.dali")
    root, train_bad, val_bad = damaged
    train, val = loaders.build_loaders(loader_settings(
        "dali", data=root, workers=2, batch_size=4, max_bad_share=0.3), DistInfo())
    assert _run(train, val, epochs=2, val_passes=2) == 2 * 5 * 4
    _assert_reported_once(capfd.readouterr().err, train_bad + val_bad)
    assert train.unreadable.count() == 6 and val.unreadable.count() == 3
    strict, _ = loaders.build_loaders(loader_settings(
        "dali", data=root, workers=2, batch_size=4, max_bad_share=0.25), DistInfo())
    with pytest.raises(DataError, match="distinct unreadable samples of the split's 20"):
        for epoch in range(2):
            strict.set_epoch(epoch)
            list(strict)
    capfd.readouterr()
