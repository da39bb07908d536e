"""The planner's input limits, and the two checks that enforce them with one sentence each.

Every bound is far beyond any real run, so a user meets one only through a typo or on purpose;
it keeps absurd input from ending in float overflow, ``inf``/``NaN`` in the output, or a search
through billions of device counts:

- devices: the largest training clusters hold ~10^5 accelerators (Llama 3: 16,384 H100s);
- sequences per batch: the largest global batches hold ~10^4 sequences;
- tokens per sequence: the longest published contexts are ~10^7 tokens;
- model shapes: 2^24 (16.8M) is ~1000x the widest published model (hidden 16384, Llama 3.1
  405B) and ~60x the largest vocabulary (262,144);
- tokens to train, price and grid intensity: with at most 10^30 tokens and $10^6 per device-hour
  every time, cost and energy stays a finite number; the dirtiest grids emit ~1,100 g CO2/kWh.
"""

from __future__ import annotations

import math

from tensorpilot.errors import ConfigError

__all__ = ["MAX_DEVICES", "MAX_DIM", "MAX_GRID_G_PER_KWH", "MAX_PRICE_PER_HOUR", "MAX_SEQ_LEN", "MAX_SEQUENCES",
           "MAX_STACK_EFFICIENCY", "MAX_TOKENS", "check_count", "check_number", "shown"]

MAX_DEVICES = 10**7
MAX_SEQUENCES = 10**9
MAX_SEQ_LEN = 10**9
MAX_DIM = 2**24
MAX_TOKENS = 1e30
MAX_PRICE_PER_HOUR = 1e6
MAX_GRID_G_PER_KWH = 1e4
# a stack that beats the planner's tuned-stack rates by more than 4x is a mismeasurement
MAX_STACK_EFFICIENCY = 4.0


def check_count(what: str, value, high: int, low: int = 1) -> None:
    """``value`` must be an int (not a bool) in [low, high]; else one sentence naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be a whole number, got {shown(value)}.")
    if not low <= value <= high:
        raise ConfigError(f"{what} must be between {low:,} and {high:,}, got {value:,}.")


def check_number(what: str, value, high: float, low: float = 0.0, *, above_low: bool = False) -> None:
    """``value`` must be a finite number in [low, high] (``above_low``: in (low, high])."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number, got {shown(value)}.")
    if value < low or (above_low and value == low) or value > high:
        bound = "above" if above_low else "at least"
        raise ConfigError(f"{what} must be {bound} {_num(low)} and at most {_num(high)}, got {_num(value)}.")


def _num(x: float) -> str:
    """1000000.0 -> '1,000,000'; 1e30 -> '1e+30'; 0.5 -> '0.5'."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def shown(value, limit: int = 40) -> str:
    """A user's value for a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
