"""argparse types every command line shares (distill, chat, bench, the tree tools).

A value out of range stops the command before anything loads, with argparse's one error line naming the flag:
`error: argument --top-p: must be a number in (0, 1], got 1.5`.
"""

from __future__ import annotations

import argparse
import math


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def int_at_least(low: int):
    """An integer >= low."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def non_negative_float(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def float_in(low: float, high: float, *, low_open: bool = False, high_open: bool = False):
    """A finite number in [low, high], either end open."""
    shown = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        value = _float(text)
        if value < low or value > high or (low_open and value == low) or (high_open and value == high):
            raise argparse.ArgumentTypeError(f"must be a number in {shown}, got {text}")
        return value

    parse.__name__ = f"number in {shown}"
    return parse


top_p = float_in(0.0, 1.0, low_open=True)  # nucleus mass: 0 would keep nothing
min_prob = float_in(0.0, 1.0, high_open=True)  # EAGLE tree cut-off: 1 would cut every node


def int_or_auto(text: str) -> str:
    """'auto' or an integer >= 1, kept as text (sps --gamma)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or 'auto', got {text!r}")
    return text
