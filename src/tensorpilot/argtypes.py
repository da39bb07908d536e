"""argparse ``type=`` functions for the options of every command: a value out of range ends in
argparse's own one-line usage error (exit 2) before any work starts. Standard library only."""

from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ["integer", "number", "port"]


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An integer in [low, high] ("1e3" is accepted as 1000)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = math.nan
            if not (math.isfinite(f) and f.is_integer()):
                raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
            value = int(f)
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer {_range(low, high)}, got {value}")
        return value

    parse.__name__ = "integer"      # argparse names the type in its message
    return parse


def number(low: float | None = None, high: float | None = None) -> Callable[[str], float]:
    """A finite number in [low, high] (nan and inf are refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected a number {_range(low, high)}, got {value:g}")
        return value

    parse.__name__ = "number"
    return parse


port = integer(0, 65535)


def _range(low, high) -> str:
    if low is not None and high is not None:
        return f"from {low:,} to {high:,}"
    return f">= {low:,}" if low is not None else f"<= {high:,}"
