"""Bit-level corruption of one tensor element, the same code on CPU and CUDA.

A float element is viewed as a signed integer of the same width and one bit is
xor-ed in place, on the tensor's own device; nothing crosses to the host but
the two values kept for the history. Bit classes name parts of the IEEE
layout: `sign`, the high and low halves of the exponent (`exp_high`,
`exp_low`) and of the mantissa (`mant_high`, `mant_low`); a seeded pick
chooses one bit inside the class.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from torchchaos.faults.params import BIT_CLASSES

# dtype -> (exponent bits, mantissa bits); the sign is the top bit
LAYOUT: dict[torch.dtype, tuple[int, int]] = {
    torch.float64: (11, 52),
    torch.float32: (8, 23),
    torch.float16: (5, 10),
    torch.bfloat16: (8, 7),
}
# the widest float dtype: a bit index from here up exists in none
MAX_WIDTH = max(exponent + mantissa + 1 for exponent, mantissa in LAYOUT.values())
_SIGNED = {8: torch.int64, 4: torch.int32, 2: torch.int16}
VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def bit_range(dtype: torch.dtype, bit_class: str) -> range:
    """The bit indices (0 = least significant) a class covers for a float dtype."""
    if dtype not in LAYOUT:
        raise ValueError(f"bit flips need a float tensor (float64/32/16, bfloat16), got {dtype}")
    exponent, mantissa = LAYOUT[dtype]
    top = exponent + mantissa
    exp_mid = mantissa + exponent // 2
    mant_mid = mantissa // 2
    ranges = {
        "sign": range(top, top + 1),
        "exp_high": range(exp_mid, top),
        "exp_low": range(mantissa, exp_mid),
        "mant_high": range(mant_mid, mantissa),
        "mant_low": range(0, mant_mid),
    }
    if bit_class not in ranges:
        raise ValueError(f"unknown bit class {bit_class!r} (known: {', '.join(BIT_CLASSES)})")
    return ranges[bit_class]


def class_of(dtype: torch.dtype, bit: int) -> str:
    """The class an exact bit index belongs to."""
    for name in BIT_CLASSES:
        if bit in bit_range(dtype, name):
            return name
    raise ValueError(f"bit {bit} does not exist in {dtype} ({width_of(dtype)} bits)")


def width_of(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size() * 8


def choose_bit(dtype: torch.dtype, bit: int | str, rng: random.Random) -> int:
    """An exact index (checked against the width) or a seeded pick inside a class."""
    if isinstance(bit, int):
        if not 0 <= bit < width_of(dtype):
            raise ValueError(f"bit {bit} does not exist in {dtype} ({width_of(dtype)} bits)")
        return bit
    return rng.choice(bit_range(dtype, bit))


@dataclass(frozen=True)
class Flip:
    """What was done to one element, for the history."""

    index: int  # flat element index
    bit: int | None  # None for an injected value
    before: float
    after: float

    def to_dict(self) -> dict[str, object]:
        return {"index": self.index, "bit": self.bit, "before": _json_float(self.before),
                "after": _json_float(self.after)}


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)


def local_data(t: torch.Tensor) -> torch.Tensor:
    """The storage a flip writes to: a DTensor's local shard, without autograd."""
    to_local = getattr(t, "to_local", None)
    return (to_local() if callable(to_local) else t).detach()


def flip_bit(t: torch.Tensor, index: int, bit: int) -> Flip:
    """Xor bit `bit` of element `index` (flat) of `t`, in place."""
    data = local_data(t)
    if not data.is_contiguous():
        raise ValueError("bit flips need a contiguous tensor")
    flat = data.view(-1)
    width = data.element_size() * 8
    ints = flat.view(_SIGNED[data.element_size()])
    mask = -(1 << bit) if bit == width - 1 else 1 << bit  # the top bit as a signed value
    before = float(flat[index])
    ints[index : index + 1].bitwise_xor_(mask)
    return Flip(index, bit, before, float(flat[index]))


def set_value(t: torch.Tensor, index: int, value: float) -> Flip:
    """Overwrite element `index` of `t` with `value` (NaN / inf injection), in place."""
    flat = local_data(t).view(-1)
    before = float(flat[index])
    flat[index] = value
    return Flip(index, None, before, float(flat[index]))
