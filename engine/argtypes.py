"""argparse ``type=`` functions of ``main.py``'s numeric flags: a bad value is argparse's one
``main.py: error: argument ...`` line before anything else runs (presets pass through them too)."""
from __future__ import annotations

import argparse


def positive_int(value) -> int:
    """An argparse type: an int >= 1 (batch sizes, pixel sizes, batch caps)."""
    return _int_at_least(value, 1, "a positive number")


def non_negative_int(value) -> int:
    """An argparse type: an int >= 0 (epochs, step counts; 0 turns a feature off)."""
    return _int_at_least(value, 0, "0 or a positive number")


def seconds(value) -> float:
    """An argparse type: a finite number of seconds >= 0 (waits, delays)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not 0 <= number < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), got {value!r}")
    return number


def _int_at_least(value, least: int, what: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = least - 1
    if number < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
    return number


def workers_type(value) -> int | str:
    """``-j`` value: a non-negative int or ``auto``."""
    if value == "auto" or (isinstance(value, int) and value >= 0):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got {value!r}")
