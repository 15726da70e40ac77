"""Exact, bitwise-sensitive digests of tensors, computed where the tensors live.

- CPU tensors: their raw bytes go straight into xxh3-128 (no copy for
  contiguous tensors); that runs at memory bandwidth, about 20 GB/s per core.
  A plain contiguous tensor's bytes are read in place through its data
  pointer: with no torch call in between, a small tensor costs about 1 us
  instead of 3 (a step of a small model digests hundreds of them).
- Tensors on an accelerator: their bits are viewed as integers of the same
  width (32 bits at most) and reduced on the device with exact integer
  arithmetic, in one pass that copies nothing (a plain sum and a
  position-weighted sum, `_device_sums`); only the small per-tensor sums cross
  to the host, once per device.

Either way the digest is equal across runs exactly when the bits (and the
dtypes and shapes) are equal: the plain sum changes with any single flipped
bit, the weighted sum when elements trade places, the hash with both.
"""

from __future__ import annotations

import ctypes
import pickle
import random
import sys
from collections.abc import Iterable
from typing import Any

import torch
import xxhash

# Each element's bits as integer words of 32 bits or fewer: an 8-byte element is read as
# its two 32-bit halves (a 64-bit word times a weight would overflow int64).
_WORD_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int32}
_WEIGHT_PERIOD = 251  # word i weighs i % 251 + 1 (a prime: no common row width repeats it)
_weights: dict[torch.device, torch.Tensor] = {}
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a subclass such as DTensor
_headers: dict[tuple[torch.dtype, torch.Size], bytes] = {}
_arrays: dict[int, type[ctypes.Array[ctypes.c_char]]] = {}  # a ctypes array type per size


def _column_weights(device: torch.device) -> torch.Tensor:
    if device not in _weights:
        _weights[device] = torch.arange(1, _WEIGHT_PERIOD + 1, device=device, dtype=torch.int64)
    return _weights[device]


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements, contiguous and one-dimensional, in a real dtype.

    A DTensor (FSDP2, tensor parallel) contributes this rank's shard."""
    to_local = getattr(t, "to_local", None)
    flat = (to_local() if callable(to_local) else t).detach()
    if flat.is_conj() or flat.is_neg():
        flat = flat.resolve_conj().resolve_neg()
    flat = flat.reshape(-1) if flat.is_contiguous() else flat.contiguous().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(torch.uint8) if flat.dtype == torch.bool else flat


# Up to this many words a weighted sum of the column sums cannot overflow int64
# (|column| <= 2**31 * rows, times a weight <= 251, over 251 columns: < 2**47 * rows).
_EXACT_WORDS = 251 << 16


def _device_sums(flat: torch.Tensor) -> torch.Tensor:
    """Exact integer sums of one tensor's words, in one pass over them on their device:
    their sum, and their sum weighted by position (word i weighs i % 251 + 1).

    The words are laid out as rows of 251 and summed down the columns: a column holds
    every word of one weight, so the weighted sum is a sum of 251 column sums times their
    weights. No copy of the words is made (an earlier version widened every word to int64
    and multiplied it by a weight: about 13 bytes of memory traffic per byte digested),
    and a small tensor costs as few kernel launches as before (six). Past _EXACT_WORDS
    words the column sums are weighted in two halves (low 32 bits, the rest), so nothing
    overflows up to 2**32 words a tensor (16 GiB); beyond that the sums wrap.
    """
    words = flat.view(_WORD_VIEW[flat.element_size()])
    count = words.numel()
    body = count - count % _WEIGHT_PERIOD
    columns = words[:body].view(-1, _WEIGHT_PERIOD).sum(dim=0, dtype=torch.int64)
    if body < count:  # the last, partial row
        columns[: count - body].add_(words[body:])
    weights = _column_weights(columns.device)
    if count <= _EXACT_WORDS:
        return torch.stack([columns.sum(), (columns * weights).sum()])
    halves = torch.stack([columns & 0xFFFFFFFF, columns >> 32])
    return torch.cat([columns.sum().reshape(1), (halves * weights).sum(dim=1)])


def _host_sums(device_tensors: list[torch.Tensor]) -> list[list[int]]:
    """Per-tensor integer sums of accelerator tensors, one transfer per device."""
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(device_tensors):
        by_device.setdefault(t.device, []).append(i)
    result: list[list[int]] = [[] for _ in device_tensors]
    for indices in by_device.values():
        parts = [_device_sums(device_tensors[i]) for i in indices]
        host = torch.cat(parts).tolist()
        offset = 0
        for i, part in zip(indices, parts):
            result[i] = host[offset : offset + part.numel()]
            offset += part.numel()
    return result


def _header(t: torch.Tensor) -> bytes:
    key = (t.dtype, t.shape)
    header = _headers.get(key)
    if header is None:
        if len(_headers) > 4096:  # shapes that keep changing (a growing sequence)
            _headers.clear()
        header = _headers[key] = f"{t.dtype}{t.shape};".encode()
    return header


def _bytes_in_place(t: torch.Tensor) -> ctypes.Array[ctypes.c_char] | None:
    """The raw bytes of a plain, dense, contiguous CPU tensor, read where they lie.

    The same bytes `_flat(t).view(torch.uint8).numpy()` gives, without the
    torch calls. None for anything else (a view with lazy conj/neg bits, a
    subclass, another device or layout), which takes the general path."""
    if (type(t) not in _PLAIN or not t.is_cpu or t.layout != torch.strided
            or not t.is_contiguous() or t.is_conj() or t.is_neg()):
        return None
    size = t.nbytes
    array = _arrays.get(size)
    if array is None:  # making an array type costs more than reading a small tensor
        if len(_arrays) > 4096:
            _arrays.clear()
        array = _arrays[size] = ctypes.c_char * size
    return array.from_address(t.data_ptr())


def digest_tensors(tensors: Iterable[torch.Tensor]) -> str:
    """A 32-hex-digit digest of an ordered collection of tensors."""
    # (an empty tensor's zero bytes take the general path too: the same digest)
    flats = [(t, _bytes_in_place(t) or _flat(t)) for t in tensors]
    remote = [flat for _, flat in flats if isinstance(flat, torch.Tensor) and not flat.is_cpu]
    sums = iter(_host_sums(remote))
    h = xxhash.xxh3_128()
    for t, flat in flats:
        h.update(_header(t))
        if not isinstance(flat, torch.Tensor):
            h.update(flat)
        elif flat.is_cpu:
            h.update(flat.view(torch.uint8).numpy())
        else:
            h.update(repr(next(sums)).encode())
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
    h = xxhash.xxh3_128(digest_tensors(tensors_in(obj)).encode())
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
    return xxhash.xxh3_128(data).hexdigest()


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
