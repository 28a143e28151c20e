"""Advice for a data-bound run: pure rules over an epoch's stage figures, the
:class:`~engine.report.bounds.Machine` ``m`` and :class:`~engine.report.bounds.Steps` (None for
``--benchmark-data``), each giving None or ``(gain, line)``: a command-line change to paste and
its effect estimated from the measured stages (images/s, ratio to the loader's)."""
from __future__ import annotations

IDLE_FOR_WORKER = 0.5  # idle cores (this process tree's share) that make one more worker pay
WORKER_CPU_SHARE = 0.6  # workers below this CPU / wall share waited for a core
CAP_SHARE = 0.3  # this share of images stored above CAP_SIDE makes a cap worth advising
CAP_SIDE = 512  # FFCV's and the converters' MAX_SIDE
RAW_1_5X_DECODE_SAVED = 0.20  # decode time a raw share at 1.5x the disk saves (docs/raw-share.md)
DATA_BOUND_WAIT = 0.10  # waiting this share of the epoch for data makes a run data-bound
DOMINANT = 0.40  # a stage taking this share of a worker's time "dominates": its advice applies

_STAGE_NAMES = ("read", "window", "decode", "resize", "augment", "write")


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:,.0f}"


def _present(loader: dict) -> list[str]:
    """The stages the loader measured (a batch pipeline's others are None)."""
    return [s for s in _STAGE_NAMES if loader["stages"].get(s) is not None]


def shares(loader: dict) -> dict:
    """Each stage's share of the stages' summed mean ms per image (0 for one the loader lacks)."""
    total = _per_image_ms(loader)
    return {s: loader["stages"][s]["mean"] / total if total > 0 and s in _present(loader)
            else 0.0 for s in _STAGE_NAMES}


def _per_image_ms(loader: dict) -> float:
    return sum(loader["stages"][s]["mean"] for s in _present(loader))


def _effect(capacity: float, gain: float, steps) -> str:
    """``"about N images/s (G x)"``, N capped at what the model takes in a training run."""
    estimate = capacity * gain
    model = steps.model_images_per_sec if steps is not None else None
    if model is not None and estimate > model:
        return (f"about {_rate(model)} images/s, what the model takes (the loader could give "
                f"{_rate(estimate)}, {gain:.2f}x)")
    return f"about {_rate(estimate)} images/s ({gain:.2f}x)"


def _more_workers(loader, steps, m):
    """Idle cores: more workers (``-j``), on a GPU at most cores - 1 (SPDL found a loader taking
    the whole host slowing the training process's kernel launches)."""
    limit = m.cores - 1 if m.device == "cuda" else m.cores
    if m.busy_cores is None or m.workers >= limit or m.pipeline == "dali":
        return None
    idle = m.cores - m.busy_cores
    if idle < IDLE_FOR_WORKER:
        return None
    n = min(limit, m.workers + max(1, round(idle)))
    gain = n / max(m.workers, 1)
    decoder = (loader.get("batch_decoder") or {}).get("images_per_sec")
    if decoder:  # --decode-device: more workers read faster, the decode thread stays as fast
        readers = sum(w["images_per_sec"] or 0 for w in loader["workers"])
        gain = min(readers * gain, decoder) / loader["loader_images_per_sec"]
        if gain < 1.05:
            return None
    per = sum(w["images_per_sec"] or 0 for w in loader["workers"]) / max(m.workers, 1)
    cpu = [w["cpu_share"] for w in loader["workers"] if w["cpu_share"] is not None]
    shared = (f"; the workers got {sum(cpu) / len(cpu):.0%} of their cores (other processes "
              "share them)" if cpu and sum(cpu) / len(cpu) < WORKER_CPU_SHARE else "")
    kept = ", the training process keeps one" if m.device == "cuda" else ""
    effect = _effect(loader["loader_images_per_sec"], gain, steps)
    return gain, (f"-j {n} (now {m.workers}): {effect}"
                  f" from {n} workers at {_rate(per)} images/s each; this process and its workers "
                  f"kept {m.busy_cores:.1f} of the {m.cores} cores busy, {idle:.1f} idle"
                  f"{kept}{shared}")


def _gpu_decode(loader, steps, m):
    """Decode dominates and a GPU is there: ``--decode-device cuda``."""
    if m.device != "cuda" or m.pipeline != "workers":
        return None
    st, t = loader["stages"], _per_image_ms(loader)
    if shares(loader)["decode"] < DOMINANT:
        return None
    rest = t - st["decode"]["mean"] - st["resize"]["mean"]
    gain = t / rest if rest > 0 else 1.0
    return gain, (f"--decode-device cuda: the workers then only read and draw windows "
                  f"({rest:.2f} of {t:.2f} ms per image), the GPU decodes and resizes: up to "
                  f"{_effect(loader['loader_images_per_sec'], gain, steps)} from the workers "
                  "(the GPU decoder's own rate is not measured here)")


def _cap(loader, steps, m):
    """Decode dominates and most images are stored above 512 px: a size cap."""
    sizes, t = loader["sizes"], _per_image_ms(loader)
    if sizes is None:  # a batch pipeline: no per-image decode time by size
        return None
    big = sizes["gt512"]
    small = sizes["le512"]["decode_ms"] or sizes["le256"]["decode_ms"]
    if shares(loader)["decode"] < DOMINANT or big["share"] < CAP_SHARE or small is None \
            or big["decode_ms"] is None:
        return None
    new = t - big["share"] * max(0.0, big["decode_ms"] - small)
    gain = t / new
    return gain, (f"store images capped at {CAP_SIDE} px: `make convert-imagenet IMAGENET=... "
                  f"OUT=... MAX_SIDE={CAP_SIDE} QUALITY=90` (folder2lmdb.py --max-side "
                  f"{CAP_SIDE} --quality 90), then --lmdb: {big['share']:.0%} of the images are "
                  f"above {CAP_SIDE} px and decode in {big['decode_ms']:.2f} ms vs {small:.2f} "
                  f"at or below; {_effect(loader['loader_images_per_sec'], gain, steps)}")


def _raw_share(loader, steps, m):
    """Decode dominates and no raw share is there yet: ``RAW_BUDGET``."""
    raw = loader["decoders"].get("raw", {}).get("share", 0)
    if m.pipeline != "workers":  # docs/raw-share.md's figure is the CPU decoders'
        return None
    if shares(loader)["decode"] < DOMINANT or raw > 0.05:  # a store with a raw share already
        return None
    t = _per_image_ms(loader)
    gain = t / (t - RAW_1_5X_DECODE_SAVED * loader["stages"]["decode"]["mean"])
    return gain, (f"if the disk holds 1.5x the JPEGs, a raw share: `make convert-imagenet "
                  f"IMAGENET=... OUT=... RAW_BUDGET=1.5x` (folder2lmdb.py --raw-budget 1.5x), "
                  f"about {RAW_1_5X_DECODE_SAVED:.0%} of the decode time gone (docs/raw-share.md): "
                  f"{_effect(loader['loader_images_per_sec'], gain, steps)}")


def _read(loader, steps, m):
    """Reading dominates: block order and readahead, or a local copy."""
    if shares(loader)["read"] < DOMINANT:
        return None
    t, read = _per_image_ms(loader), loader["stages"]["read"]["mean"]
    gain = t / max(t - read, 1e-9)
    if m.source == "lmdb" and m.lmdb_order != "block":
        change = "--lmdb-order block --lmdb-readahead on (mostly sequential reads)"
    else:
        change = ("a copy of the dataset on a local disk (or an LMDB: folder2lmdb.py, then "
                  "--lmdb)" if m.source != "lmdb" else "a copy of the LMDB on a local disk")
    return gain, (f"{change}: reading takes {read:.2f} of {t:.2f} ms per image; with free reads "
                  f"up to {_effect(loader['loader_images_per_sec'], gain, steps)}")


def _augment(loader, steps, m):
    """The ``--auto-augment`` policy dominates: a lighter one."""
    if m.auto_augment is None or shares(loader)["augment"] < DOMINANT:
        return None
    t, aug = _per_image_ms(loader), loader["stages"]["augment"]["mean"]
    gain = t / max(t - aug, 1e-9)
    return gain, (f"drop --auto-augment {m.auto_augment} (or a lighter policy): it takes "
                  f"{aug:.2f} of {t:.2f} ms per image; without it up to "
                  f"{_effect(loader['loader_images_per_sec'], gain, steps)}")


RULES = (_more_workers, _gpu_decode, _cap, _raw_share, _read, _augment)
MIN_GAIN = 1.05  # advice that would change the loader's rate by less is left out


def advise(loader: dict | None, steps, machine,
           limit: int = 2) -> list[str]:
    """At most ``limit`` lines of :data:`RULES`' advice, largest estimated gain first; none
    without stage figures or when ``steps`` show a run that is not data-bound."""
    if loader is None or not loader["images"] or not loader.get("loader_images_per_sec"):
        return []
    if steps is not None and steps.wait_share < DATA_BOUND_WAIT:
        return []
    found = [r for r in (rule(loader, steps, machine) for rule in RULES) if r is not None]
    found = sorted((r for r in found if r[0] >= MIN_GAIN), key=lambda r: -r[0])
    return [line for _, line in found[:limit]]
