"""Parsers for fault parameters (`key=value` text to a value), shared by the kinds.

Each raises ValueError with the reason; the spec parser turns that into a
one-line usage error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torchchaos.rundir.layout import CHAOS_DIR

# Parts of a float's IEEE layout a bit flip may hit (`torchchaos.faults.bits` maps them to bit
# indices per dtype); here, without torch, for help texts and planners.
BIT_CLASSES = ("sign", "exp_high", "exp_low", "mant_high", "mant_low")

def seconds(value: str) -> float:
    number = float(value)
    if not number >= 0:
        raise ValueError(f"needs seconds >= 0, got {value!r}")
    return number


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(f"needs an integer >= 1, got {value!r}")
    return number


def non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(f"needs an integer >= 0, got {value!r}")
    return number


def fraction(value: str) -> float:
    number = float(value)
    if not 0.0 <= number < 1.0:
        raise ValueError(f"needs a fraction in [0, 1), got {value!r}")
    return number


def percentage(value: str) -> float:
    """a percentage above 0, at most 100"""
    number = float(value)
    if not 0 < number <= 100:
        raise ValueError(f"needs a percentage in (0, 100], got {value!r}")
    return number


def choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in options:
            raise ValueError(f"{value!r} is not one of {', '.join(options)}")
        return value

    return parse


def run_relative_dir(value: str) -> str:
    """A folder inside the run directory (never the harness's own `_chaos/`)."""
    path = Path(value)
    if path.is_absolute() or ".." in path.parts or path.parts[:1] == (CHAOS_DIR,):
        raise ValueError(f"needs a folder inside the run directory, got {value!r}")
    return str(path)
