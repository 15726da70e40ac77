"""A file's content in a crash state, as pieces of the recording's blob file.

The recording filesystem appends the bytes of every write to one blob file
(`faults/faultfs/recording.py`, `Recorder`). A file as a crash left it is therefore a
list of extents: (offset in the blob file, length), or (ZERO, length) for a
hole, never a copy of the bytes. Checkpoints are hundreds of MB to GB per rank
and a save has thousands of crash states: every state refers to the same blob
file, so memory grows with the number of writes, not with their bytes.

A `Content` never changes once made. Writes at the end (how every common
checkpoint writer works: torch.save, DCP, safetensors) share one growing list
of pieces, each content seeing its own prefix of it, so a write costs O(1) and
the content after it knows the one it extends (`base`). Its digest then
continues the hash of its base: the digests of every prefix of a 1 GB file cost
one pass over its bytes, not one per prefix.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

ZERO = -1  # an extent's offset for a hole: zeros, nothing in the blob file
CHUNK = 8 << 20  # bytes read from the blob file at once (hashing, copying)
Extent = tuple[int, int]  # (offset in the blob file or ZERO, length)


class Blobs:
    """The blob file of a recording, read in place with pread (never loaded whole).
    `Blobs.of_bytes` wraps bytes already in memory (tests, small synthetic records)."""

    def __init__(self, path: Path | None = None, data: bytes = b"") -> None:
        self.path = path
        self._data = data
        self._fd = os.open(path, os.O_RDONLY) if path is not None else None

    @classmethod
    def of_bytes(cls, data: bytes) -> Blobs:
        return cls(data=data)

    def read(self, offset: int, size: int) -> bytes:
        if self._fd is None:
            return self._data[offset:offset + size]
        return os.pread(self._fd, size, offset)

    def copy_into(self, out_fd: int, offset: int, size: int) -> None:
        """Append `size` bytes from `offset` to `out_fd`: in the kernel where it can
        (copy_file_range, a reflink on filesystems that share extents)."""
        while size > 0:
            if self._fd is not None:
                done = os.copy_file_range(self._fd, out_fd, min(size, 1 << 30), offset)
            else:
                done = os.write(out_fd, self._data[offset:offset + min(size, CHUNK)])
            if done <= 0:
                raise OSError(f"the blob file {self.path} ends before byte {offset + size}")
            offset, size = offset + done, size - done

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


class Content:
    """A file's bytes: the first `count` extents of `pieces` (a list other contents may
    share and extend, never change). `base`: the content this one extends by
    appending (None where it was rebuilt), so a digest can continue base's hash."""

    __slots__ = ("blobs", "pieces", "count", "size", "base", "_hash")

    def __init__(self, blobs: Blobs, pieces: list[Extent], count: int, size: int,
                 base: Content | None = None) -> None:
        self.blobs = blobs
        self.pieces = pieces
        self.count = count
        self.size = size
        self.base = base
        self._hash: hashlib._Hash | None = None

    @classmethod
    def empty(cls, blobs: Blobs) -> Content:
        return cls(blobs, [], 0, 0)

    def extents(self) -> list[Extent]:
        return self.pieces[:self.count]

    def same(self, other: Content | None) -> bool:
        """Certainly the same bytes (the same extents); False may still be equal bytes."""
        return other is not None and (other is self or (
            other.size == self.size and other.extents() == self.extents()))

    # -- what operations make of it -------------------------------------------
    def write(self, offset: int, blob: int, size: int) -> Content:
        """The content after writing `size` bytes kept at `blob` at `offset`."""
        if offset >= self.size:
            grown = self._append((ZERO, offset - self.size)) if offset > self.size else self
            return grown._append((blob, size)) if size else grown
        head, tail = _slice(self.extents(), 0, offset), _slice(self.extents(), offset + size,
                                                                self.size)
        pieces = [*head, (blob, size), *tail]
        return Content(self.blobs, pieces, len(pieces), max(self.size, offset + size))

    def truncate(self, length: int) -> Content:
        if length > self.size:
            return self._append((ZERO, length - self.size))
        if length == self.size:
            return self
        pieces = _slice(self.extents(), 0, length)
        return Content(self.blobs, pieces, len(pieces), length)

    def _append(self, piece: Extent) -> Content:
        if self.count == len(self.pieces):
            pieces = self.pieces  # nobody extended this prefix yet: share the list
            pieces.append(piece)
        else:  # another content extended it first (a torn write, another state): fork
            pieces = [*self.extents(), piece]
        return Content(self.blobs, pieces, self.count + 1, self.size + piece[1], base=self)

    # -- reading it -------------------------------------------------------------
    def digest(self) -> str:
        return self._hasher().hexdigest()

    def _hasher(self) -> hashlib._Hash:
        """sha256 of the bytes, continued from the nearest base already hashed."""
        chain: list[Content] = []
        found = self
        while found._hash is None and found.base is not None:
            chain.append(found)
            found = found.base
        if found._hash is None:
            found._hash = self._hashed(hashlib.sha256(), found.extents())
        hashed = found._hash
        for content in reversed(chain):
            hashed = content._hashed(hashed.copy(),
                                     content.pieces[content.base.count:content.count])
            content._hash = hashed
        return hashed

    def _hashed(self, hasher: hashlib._Hash, pieces: list[Extent]) -> hashlib._Hash:
        for chunk in self.chunks(pieces):
            hasher.update(chunk)
        return hasher

    def chunks(self, pieces: list[Extent] | None = None):  # noqa: ANN201 - a generator
        """The bytes, at most CHUNK at a time."""
        for offset, length in self.extents() if pieces is None else pieces:
            for start in range(0, length, CHUNK):
                size = min(CHUNK, length - start)
                yield bytes(size) if offset == ZERO else self.blobs.read(offset + start, size)

    def read(self) -> bytes:
        """All of it in memory: for small files and tests only."""
        return b"".join(self.chunks())

    def write_to(self, path: Path) -> None:
        """Write the content as a new file at `path`: extents copied in the kernel,
        holes left sparse."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for offset, length in self.extents():
                if offset == ZERO:
                    os.lseek(fd, length, os.SEEK_CUR)
                else:
                    self.blobs.copy_into(fd, offset, length)
            os.ftruncate(fd, self.size)  # a hole at the end
        finally:
            os.close(fd)


def _slice(extents: list[Extent], start: int, end: int) -> list[Extent]:
    """The extents that hold bytes [start, end) of a content made of `extents`."""
    found: list[Extent] = []
    at = 0
    for offset, length in extents:
        lo, hi = max(start, at), min(end, at + length)
        if lo < hi:
            found.append((ZERO if offset == ZERO else offset + lo - at, hi - lo))
        at += length
        if at >= end:
            break
    return found
