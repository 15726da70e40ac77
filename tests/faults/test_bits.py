"""Bit-level corruption: exactly the requested bit of exactly one element, every dtype."""

from __future__ import annotations

import math
import random

import pytest
import torch

from torchchaos.faults import bits

DTYPES = list(bits.LAYOUT)
SIGNED = {8: torch.int64, 4: torch.int32, 2: torch.int16}


def changed_bits(before: torch.Tensor, after: torch.Tensor) -> list[tuple[int, int]]:
    """(element, bit) pairs that differ between two tensors of one float dtype."""
    width = before.element_size() * 8
    xor = (before.view(SIGNED[before.element_size()])
           ^ after.view(SIGNED[after.element_size()])).tolist()
    return [(i, b) for i, x in enumerate(xor) for b in range(width) if (x >> b) & 1]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_bit_of_each_dtype_flips_alone(dtype):
    original = torch.tensor([1.5, -2.25, 0.1, 3e-3], dtype=dtype)
    for bit in range(bits.width_of(dtype)):
        t = original.clone()
        flip = bits.flip_bit(t, 2, bit)
        assert changed_bits(original, t) == [(2, bit)]
        assert flip.index == 2 and flip.bit == bit
        assert flip.before == float(original[2]) and (flip.after == float(t[2])
                                                      or math.isnan(flip.after))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bit_classes_split_the_word_into_sign_exponent_and_mantissa(dtype):
    ranges = [bits.bit_range(dtype, c) for c in bits.BIT_CLASSES]
    every = sorted(b for r in ranges for b in r)
    assert every == list(range(bits.width_of(dtype)))  # disjoint and complete
    exponent, mantissa = bits.LAYOUT[dtype]
    assert list(bits.bit_range(dtype, "sign")) == [exponent + mantissa]
    assert max(bits.bit_range(dtype, "exp_high")) == exponent + mantissa - 1
    assert min(bits.bit_range(dtype, "mant_low")) == 0
    for c in bits.BIT_CLASSES:
        bit = bits.choose_bit(dtype, c, random.Random(3))
        assert bits.class_of(dtype, bit) == c


def test_the_classes_do_what_their_names_say():
    one = torch.tensor([1.0])
    bits.flip_bit(one, 0, bits.choose_bit(torch.float32, "sign", random.Random(0)))
    assert one.item() == -1.0
    big = torch.tensor([1.0])
    bits.flip_bit(big, 0, 30)  # the top exponent bit: 1.0 becomes 2**128 = inf
    assert big.item() == math.inf
    tiny = torch.tensor([1.0])
    bits.flip_bit(tiny, 0, 0)  # the lowest mantissa bit: one ulp
    assert tiny.item() == 1.0 + 2**-23


def test_values_can_be_injected_and_bad_requests_are_refused():
    t = torch.zeros(3, dtype=torch.bfloat16)
    assert math.isnan(bits.set_value(t, 1, math.nan).after) and math.isnan(float(t[1]))
    assert bits.set_value(t, 0, -math.inf).to_dict()["after"] == "-inf"
    with pytest.raises(ValueError, match="does not exist"):
        bits.choose_bit(torch.float16, 16, random.Random(0))
    with pytest.raises(ValueError, match="float tensor"):
        bits.bit_range(torch.int32, "sign")
    with pytest.raises(ValueError, match="unknown bit class"):
        bits.bit_range(torch.float32, "exponent")


def test_a_view_is_flipped_in_its_base_storage():
    base = torch.zeros(4, 4)
    row = base[1]
    bits.flip_bit(row, 2, 31)
    assert str(base[1, 2].item()) == "-0.0"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_tensors_flip_through_the_same_code(dtype):
    original = torch.tensor([1.5, -2.25, 0.1, 3e-3], dtype=dtype, device="cuda")
    for bit in range(bits.width_of(dtype)):
        t = original.clone()
        bits.flip_bit(t, 3, bit)
        assert changed_bits(original.cpu(), t.cpu()) == [(3, bit)]
