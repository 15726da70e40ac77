"""Bit rot in a checkpoint file: which file to hit, and flipping bits in it.

Shared by the fault filesystem's bit rot (which flips the backing file) and
the in-process `bitflip:tensor=checkpoint` (which flips the file in place).
Plain file I/O only: no torch, no FUSE.
"""

from __future__ import annotations

import random
from pathlib import Path


def newest_big_file(files: list[Path]) -> Path:
    """The newest of the big files (at least half the size of the largest): the data
    of the latest checkpoint rather than its small pointer or manifest."""
    largest = max(p.stat().st_size for p in files)
    big = [p for p in files if p.stat().st_size * 2 >= largest]
    return max(big, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def seeded_bit_offsets(size: int, rng: random.Random, bits: int) -> list[int]:
    """`bits` distinct bit offsets in a file of `size` bytes, in order."""
    return sorted(rng.sample(range(size * 8), min(bits, size * 8)))


def flip_file_bits(path: Path, offsets: list[int]) -> None:
    """Flip the bits at the given offsets (bit 0 is the lowest bit of byte 0)."""
    with open(path, "r+b") as file:
        for bit in offsets:
            file.seek(bit // 8)
            byte = file.read(1)[0]
            file.seek(bit // 8)
            file.write(bytes([byte ^ (1 << (bit % 8))]))
