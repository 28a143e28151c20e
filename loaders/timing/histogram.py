"""The stage logs' figures without per-image values: fixed log-spaced millisecond histograms
(a median or p90 per image over an epoch) and the percentiles of a short list of seconds."""
from __future__ import annotations

import numpy as np

# Histogram bins (ms): 1 us to 100 s in steps of 10**(1/40), 5.9% wide, so a median or p90 read
# from the bins (geometric middle of the bin) is within 3% of the exact one.
EDGES_MS = 10.0 ** np.arange(-3.0, 5.0 + 1e-9, 1 / 40)
MIDDLES_MS = np.sqrt(EDGES_MS[:-1] * EDGES_MS[1:])


def ms_bins(seconds: np.ndarray) -> np.ndarray:
    """The histogram bin of each of ``seconds`` (any shape; off 1 us - 100 s: the end bins)."""
    bins = np.searchsorted(EDGES_MS, seconds * 1e3, side="right") - 1
    return np.clip(bins, 0, len(MIDDLES_MS) - 1)


def quantiles(counts: np.ndarray, qs=(0.5, 0.9)) -> list[float | None]:
    """The ``qs`` quantiles (ms) of one histogram row (bin middles); None if it is empty."""
    total = counts.sum()
    if total == 0:
        return [None] * len(qs)
    cumulative = np.cumsum(counts)
    return [float(MIDDLES_MS[np.searchsorted(cumulative, q * total, side="left")]) for q in qs]


def p50_p90(seconds: list) -> dict:
    """``{"p50", "p90"}`` in ms of ``seconds``; None values when empty."""
    ms = np.array(seconds) * 1e3
    return {"p50": float(np.median(ms)) if len(ms) else None,
            "p90": float(np.percentile(ms, 90)) if len(ms) else None}
