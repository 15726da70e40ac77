"""Fingerprints are exact: equal bits give equal digests, any flipped bit changes them."""

from __future__ import annotations

import gc
import random
import weakref

import numpy as np
import pytest
import torch

from torchchaos.rank.fingerprint import digest_object, digest_rng, digest_tensors

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
          torch.int8, torch.uint8, torch.bool]


def _sample(dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(257, generator=gen) > 0.5
    if dtype.is_floating_point:
        return torch.randn(257, generator=gen).to(dtype)
    return torch.randint(0, 100, (257,), generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_single_bit_flip_changes_the_digest(dtype):
    tensor = _sample(dtype)
    base = digest_tensors([tensor])
    assert digest_tensors([tensor.clone()]) == base
    raw = tensor.view(torch.uint8) if dtype != torch.bool else tensor.view(torch.uint8)
    for byte in (0, raw.numel() // 2, raw.numel() - 1):
        for bit in range(8 if dtype != torch.bool else 1):
            flipped = raw.clone()
            flipped[byte] ^= 1 << bit
            assert digest_tensors([flipped.view(dtype)]) != base, (byte, bit)


def test_digest_sees_order_shape_and_negative_zero():
    a = torch.arange(6, dtype=torch.float32)
    assert digest_tensors([a]) != digest_tensors([a.flip(0)])
    assert digest_tensors([a]) != digest_tensors([a.reshape(2, 3)])
    assert digest_tensors([a[:3], a[3:]]) != digest_tensors([a[3:], a[:3]])
    assert digest_tensors([torch.tensor([0.0])]) != digest_tensors([torch.tensor([-0.0])])


def test_digest_of_non_contiguous_and_empty_tensors():
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert digest_tensors([a.t()]) == digest_tensors([a.t().contiguous()])
    assert digest_tensors([torch.empty(0)]) == digest_tensors([torch.empty(0)])


def test_object_digest_covers_tensors_and_plain_values():
    state = {"step": 3, "exp_avg": torch.ones(4)}
    assert digest_object(state) == digest_object({"exp_avg": torch.ones(4), "step": 3})
    assert digest_object(state) != digest_object({"step": 4, "exp_avg": torch.ones(4)})


def test_rng_digest_follows_each_global_generator_apart():
    base = digest_rng()
    assert digest_rng() == base and {"torch", "numpy", "python"} <= set(base)
    for draw, name in ((lambda: torch.rand(1), "torch"), (np.random.rand, "numpy"),
                       (random.random, "python")):
        before = digest_rng()
        draw()
        after = digest_rng()
        assert [k for k in after if after[k] != before[k]] == [name]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_accelerator_path_sees_every_flip_too(dtype):
    """The integer-sum path used on GPUs, exercised here on CPU tensors."""
    from torchchaos.rank.fingerprint import _device_sums, _flat

    tensor = _sample(dtype)
    base = _device_sums(_flat(tensor)).tolist()
    raw = tensor.view(torch.uint8)
    for byte in (0, raw.numel() - 1):
        for bit in range(8 if dtype != torch.bool else 1):
            flipped = raw.clone()
            flipped[byte] ^= 1 << bit
            assert _device_sums(_flat(flipped.view(dtype))).tolist() != base, (byte, bit)
    swapped = tensor.clone()
    swapped[[0, 1]] = tensor[[1, 0]]
    if not torch.equal(swapped, tensor):
        assert _device_sums(_flat(swapped)).tolist() != base


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_are_digested_on_the_device():
    cpu = torch.randn(1 << 20)
    gpu = cpu.cuda()
    assert digest_tensors([gpu]) == digest_tensors([gpu.clone()])
    flipped = gpu.clone()
    flipped.view(torch.int32)[123] ^= 1
    assert digest_tensors([flipped]) != digest_tensors([gpu])


def _exact_sums(words: torch.Tensor) -> tuple[int, int]:
    """The sum and the position-weighted sum of integer words, in Python's exact ints."""
    values = words.tolist()
    return sum(values), sum(v * (i % 251 + 1) for i, v in enumerate(values))


@pytest.mark.parametrize("count", [0, 1, 250, 251, 252, 1000])
def test_the_accelerator_path_sums_exactly_what_it_says(count):
    """One pass down columns of 251 words gives the plain and the weighted sum exactly,
    for every length: a whole number of rows, a partial last row, no row at all."""
    from torchchaos.rank.fingerprint import _device_sums

    words = torch.randint(-2**31, 2**31, (count,), dtype=torch.int64,
                          generator=torch.Generator().manual_seed(count)).to(torch.int32)
    assert _device_sums(words).tolist() == list(_exact_sums(words))


def test_the_accelerator_path_does_not_overflow_at_a_gigabyte():
    """2**28 words of the largest value (a 1 GiB tensor of int32): the weighted sum is
    about 2**67, past int64, and still comes out exact (in two halves, low 32 bits and the
    rest of the column sums, each weighted)."""
    from torchchaos.rank.fingerprint import _device_sums

    count, value = 1 << 28, 2**31 - 1
    words = torch.full((count,), value, dtype=torch.int32)
    total, low, high = _device_sums(words).tolist()
    rows, rest = divmod(count, 251)
    weights = rows * sum(range(1, 252)) + sum(range(1, rest + 1))
    assert total == count * value
    assert low + (high << 32) == weights * value


def test_the_one_weighted_sum_is_exact_up_to_its_bound():
    """The largest tensor weighted in one sum (the smallest int32 in every word)."""
    from torchchaos.rank.fingerprint import _EXACT_WORDS, _device_sums

    value = -2**31
    words = torch.full((_EXACT_WORDS,), value, dtype=torch.int32)
    rows = _EXACT_WORDS // 251
    assert _device_sums(words).tolist() == [_EXACT_WORDS * value,
                                            rows * sum(range(1, 252)) * value]


def _general_path(tensors: list[torch.Tensor]) -> str:
    """The digest through `_flat` only, with no tensor read in place or copied by numpy."""
    from torchchaos.rank.fingerprint import _digest

    return _digest(tensors, [None] * len(tensors))


def _layouts(dtype: torch.dtype) -> list[torch.Tensor]:
    base = _sample(dtype)[:256].reshape(16, 16)
    return [base, base.t(), base[:, :-1], base[::2], base[0, 3],
            base[:1].expand(4, 16), base[:0], base.clone().requires_grad_(dtype.is_floating_point)]


@pytest.mark.parametrize("dtype", [*DTYPES, torch.complex64])
def test_the_quick_paths_digest_what_the_general_path_does(dtype):
    for tensor in _layouts(dtype):
        assert digest_tensors([tensor]) == _general_path([tensor]), (tensor.shape, tensor.stride())
    if dtype.is_complex:
        lazy = _sample(torch.float32)[:256].to(dtype).conj()
        assert digest_tensors([lazy]) == _general_path([lazy])
        assert digest_tensors([lazy]) == digest_tensors([lazy.resolve_conj()])


def test_a_repeated_digest_follows_every_change_of_its_tensors():
    from torchchaos.rank.fingerprint import RepeatedDigest

    params = [torch.nn.Parameter(torch.randn(8, 8)) for _ in range(3)]
    repeated = RepeatedDigest()
    seen = set()

    def check() -> None:
        digest = repeated(params)
        assert digest == digest_tensors(params) == _general_path(params)
        seen.add(digest)

    check()
    with torch.no_grad():
        params[0].add_(1)  # the same bytes' place, new values
    check()
    before = repeated(params)
    params[1].data = params[1].data.clone()  # the same values elsewhere: the same digest
    check()
    assert repeated(params) == before
    params[1].data = params[1].data.t()  # the same place, laid out otherwise
    check()
    params[2].data = params[2].data.to(torch.bfloat16)
    check()
    params[2].data = params[2].data.view(torch.float16)  # the same bytes, another dtype
    check()
    params[2].data = torch.empty(0)  # freed, as ZeRO-3 and FSDP do between uses
    check()
    params[2].data = torch.randn(8, 8)
    check()
    params.append(torch.nn.Parameter(torch.randn(2)))  # another list
    check()
    assert len(seen) == 8  # every change of bytes, layout or dtype seen
    gone = weakref.ref(params[0])
    del params[:]
    gc.collect()
    assert gone() is None  # the digest keeps no tensor alive (a model deleted is freed)
