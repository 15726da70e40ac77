"""Exact, bitwise-sensitive digests of tensors, computed where the tensors live.

- CPU tensors: their raw bytes go straight into xxh3-128 (no copy for
  contiguous tensors); that runs at memory bandwidth, about 20 GB/s per core.
  A small model's step costs in torch calls, not in bytes: called between a
  step's kernels, each torch call costs about ten times what it costs in a
  loop (0.1 -> 1.2 us for `is_cpu`: its code has left the caches). So a plain
  tensor is read through one `numpy()` call, a parameter's bytes through its
  data pointer, and `RepeatedDigest` keeps what the parameters' digest needs
  (headers, addresses) from step to step.
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
    return _array_at(t)


def _array_at(t: torch.Tensor) -> ctypes.Array[ctypes.c_char]:
    size = t.nbytes
    array = _arrays.get(size)
    if array is None:  # making an array type costs more than reading a small tensor
        if len(_arrays) > 4096:
            _arrays.clear()
        array = _arrays[size] = ctypes.c_char * size
    return array.from_address(t.data_ptr())


def _local_bytes(t: torch.Tensor) -> Any:
    """The raw bytes of a CPU tensor, with as few torch calls as can be: in a training
    step each costs about ten times what it costs in a loop (its code is out of the
    caches the kernels used), and `_flat`'s path takes twenty.

    A plain tensor that needs no gradient is read through numpy (one torch call; a
    strided view such as a slice of a batch is copied there in logical order, as
    `.contiguous()` would). Anything numpy does not take (a parameter, bfloat16, another
    device or layout, a lazy conjugate bit) is read in place if `_bytes_in_place` can,
    None otherwise."""
    if type(t) is torch.Tensor:
        try:
            array = t.numpy()
        except Exception:  # TypeError or RuntimeError, each saying why
            return _bytes_in_place(t)
        return array if array.flags.c_contiguous else sys.modules["numpy"].ascontiguousarray(array)
    return _bytes_in_place(t)


def _digest(tensors: list[torch.Tensor], local: list[Any]) -> str:
    """The digest of `tensors`, given the bytes of those read in place (None: the others).

    The headers (dtype and shape of each) come first, in one piece, then the bytes of each
    tensor, or the integer sums of one on an accelerator: the headers fix how long each
    part is, so the sequence reads back one way only."""
    headers = b"".join(map(_header, tensors))
    if all(part is not None for part in local):  # all on the host, read directly
        return _hash_parts(headers, local)
    h = xxhash.xxh3_128(headers)
    others = [None if part is not None else _flat(t) for t, part in zip(tensors, local)]
    remote = [flat for flat in others if flat is not None and not flat.is_cpu]
    sums = iter(_host_sums(remote))
    for part, flat in zip(local, others):
        if part is not None:
            h.update(part)
        elif flat.is_cpu:
            h.update(flat.view(torch.uint8).numpy())
        else:
            h.update(repr(next(sums)).encode())
    return h.hexdigest()


def _hash_parts(headers: bytes, parts: list[Any]) -> str:
    """The digest of tensors whose bytes are all at hand (`_digest`'s quick path)."""
    h = xxhash.xxh3_128(headers)
    for part in parts:
        h.update(part)
    return h.hexdigest()


def digest_tensors(tensors: Iterable[torch.Tensor]) -> str:
    """A 32-hex-digit digest of an ordered collection of tensors."""
    tensors = list(tensors)
    return _digest(tensors, [_local_bytes(t) for t in tensors])


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return t.data_ptr(), t.shape, t.stride(), t.dtype


class RepeatedDigest:
    """`digest_tensors` of a list made of the same tensors from call to call (a model's
    parameters), with the same result at less than half its cost on a small model.

    What a tensor's digest needs besides its bytes (its header, where its bytes lie) is
    worked out once and kept while the list holds the same tensor objects and each one
    read in place still has its bytes at the same address in the same shape, strides and
    dtype (an assignment to `.data` changes those: FSDP and ZeRO swap views in and out).
    Only the current tensors' layouts are compared, so none is kept alive here: a model
    deleted is freed. A lazy conjugate or negative bit set later on the same bytes
    (`.data = p.data.conj()`) is not seen."""

    def __init__(self) -> None:
        self._ids: tuple[int, ...] = ()
        self._local: list[Any] = []
        self._positions: list[int] = []  # of the tensors read in place
        self._layouts: list[tuple[Any, ...]] = []
        self._headers = b""

    def __call__(self, tensors: list[torch.Tensor]) -> str:
        ids = tuple(map(id, tensors))
        if ids != self._ids or self._layouts_of(tensors) != self._layouts:
            self._plan(tensors, ids)
        if len(self._positions) < len(tensors):  # some on an accelerator, or subclasses
            return _digest(tensors, self._local)
        return _hash_parts(self._headers, self._local)

    def _layouts_of(self, tensors: list[torch.Tensor]) -> list[tuple[Any, ...]]:
        if len(self._positions) == len(tensors):
            return list(map(_layout, tensors))
        return [_layout(tensors[i]) for i in self._positions]

    def _plan(self, tensors: list[torch.Tensor], ids: tuple[int, ...]) -> None:
        self._ids = ids
        self._local = [_bytes_in_place(t) for t in tensors]
        self._positions = [i for i, part in enumerate(self._local) if part is not None]
        self._layouts = self._layouts_of(tensors)
        self._headers = b"".join(map(_header, tensors))


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
