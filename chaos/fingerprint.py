"""Exact, bitwise-sensitive digests of tensors, computed on their own device.

A tensor's raw bits are viewed as integers of the same width and reduced with
integer arithmetic (a plain sum and a position-weighted sum), so the digest is
identical across runs exactly when the bits are identical, and costs a few
memory-bandwidth-bound passes. Per-tensor partial sums are stacked and moved
to the host once, then folded with a cryptographic hash so that digests of
different tensor sets do not collide by accident.

Why two sums: the plain sum changes on any single-bit change of one element;
the weighted sum also changes when elements trade places. Both are exact in
int64 for up to 2**24 elements per chunk, so tensors are reduced in chunks.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import sys
from collections.abc import Iterable
from typing import Any

import torch

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 24
_WEIGHT_PERIOD = 251  # weights 1..251 keep x*w well inside int64
_weights: dict[tuple[torch.device, int], torch.Tensor] = {}


def _weights_for(device: torch.device, n: int) -> torch.Tensor:
    key = (device, n)
    if key not in _weights:
        _weights[key] = (torch.arange(n, device=device, dtype=torch.int64) % _WEIGHT_PERIOD) + 1
    return _weights[key]


def _as_int64_words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as a flat int64 tensor of 32-bit-or-smaller words."""
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    width = flat.element_size()
    if flat.dtype.is_floating_point or width in (1, 2, 4):
        flat = flat.view(_INT_VIEW[width])
    words = flat.to(torch.int64)
    if width == 8:  # split 64-bit words so the weighted sum cannot overflow
        words = torch.cat([words & 0xFFFFFFFF, words >> 32])
    return words


def _partial_sums(t: torch.Tensor) -> torch.Tensor:
    words = _as_int64_words(t)
    sums = [torch.tensor([words.numel()], device=words.device, dtype=torch.int64)]
    for start in range(0, max(words.numel(), 1), _CHUNK):
        chunk = words[start : start + _CHUNK]
        sums.append(chunk.sum().reshape(1))
        sums.append((chunk * _weights_for(chunk.device, chunk.numel())).sum().reshape(1))
    return torch.cat(sums)


def digest_tensors(tensors: Iterable[torch.Tensor]) -> str:
    """A 16-hex-digit digest of an ordered collection of tensors."""
    h = hashlib.blake2b(digest_size=8)
    per_device: dict[torch.device, list[torch.Tensor]] = {}
    order: list[tuple[torch.device, int]] = []
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        sums = per_device.setdefault(t.device, [])
        order.append((t.device, len(sums)))
        sums.append(_partial_sums(t))
    host = {dev: [s.tolist() for s in torch.cat(parts).split([p.numel() for p in parts])]
            for dev, parts in per_device.items() if parts}
    for dev, i in order:
        h.update(repr(host[dev][i]).encode())
    return h.hexdigest()


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside nested lists / tuples / dicts, in a stable order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for key in sorted(obj, key=repr) for t in tensors_in(obj[key])]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in tensors_in(item)]
    return []


def digest_object(obj: Any) -> str:
    """Digest of a nested structure: its tensors bitwise, everything else by pickle."""
    h = hashlib.blake2b(digest_size=8)
    h.update(digest_tensors(tensors_in(obj)).encode())
    h.update(pickle.dumps(_without_tensors(obj), protocol=4))
    return h.hexdigest()


def _without_tensors(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return "<tensor>"
    if isinstance(obj, dict):
        return sorted((repr(k), _without_tensors(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return [_without_tensors(v) for v in obj]
    return repr(obj)


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def digest_rng() -> dict[str, str]:
    """One digest per global RNG: torch CPU, CUDA (if initialised), numpy, python.

    Kept apart so a generator the target never seeds (and never uses) can be
    told from one whose restore was forgotten.
    """
    digests = {"torch": digest_tensors([torch.get_rng_state()]),
               "python": _hash(repr(random.getstate()).encode())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        digests["cuda"] = digest_tensors(torch.cuda.get_rng_state_all())
    numpy = sys.modules.get("numpy")  # only if the target imported it
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        digests["numpy"] = _hash(keys.tobytes() + repr((kind, pos, has_gauss, cached)).encode())
    return digests
