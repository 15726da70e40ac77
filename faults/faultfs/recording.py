"""Recording mounts: every write's bytes kept once, in the blob file, and served from there.

A recording mount (the recording run of `torchchaos crashpoints`, and each
crash state's recovery) keeps the bytes of every write in one blob file, for
crash states to be rebuilt from (`torchchaos.explore.extents`). Writing them
to the file under the mount as well cost a second copy of every checkpoint:
at 1 GB per rank the recording of the bundled target's two saves took 16.5 s,
written once 12.3 s, the same job under plain torchrun 10.2 s
(`bench/write_once.py`, bench/README.md).

So a file under a recording mount is its *backing file* (the real file under
the mountpoint: sized right, a hole where this mount wrote) overlaid by the
*extents* this mount wrote: ranges of the file whose bytes lie in a source
file, the mount's own blob file or a recording's blob that a recovery's image
is laid from (`Recorder.lay`). A read takes the backing file's bytes and puts
the extents over them.

Extents are keyed by the backing file's inode: a rename or a hard link keeps
them, and a file created through the mount starts with none (the number of a
file that is gone may be given to a new one). After the unmount a backing file
holds the right size and none of the bytes the mount wrote: the recording's
history and blob file hold those, and nothing reads them from the folder.
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
from pathlib import Path

from torchchaos.rundir.history import HistoryWriter

OWN = 0  # the source number of the mount's own blob file


class Extents:
    """The ranges of one file that the overlay holds, sorted and never overlapping:
    parallel lists of start, end, source and offset in that source."""

    __slots__ = ("starts", "ends", "sources", "offsets")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.sources: list[int] = []
        self.offsets: list[int] = []

    def put(self, start: int, end: int, source: int, offset: int) -> None:
        """Bytes [start, end) are now at `offset` in `source`; what they covered goes."""
        if start >= end:
            return
        if not self.ends or start >= self.ends[-1]:  # a write at the end: how saves go
            self._insert(len(self.starts), start, end, source, offset)
            return
        self.cut(start, end)
        self._insert(bisect.bisect_left(self.starts, start), start, end, source, offset)

    def cut(self, start: int, end: int) -> None:
        """Forget bytes [start, end): a piece that crosses a border keeps its outer part."""
        first = bisect.bisect_right(self.ends, start)
        last = bisect.bisect_left(self.starts, end)
        if first >= last:
            return
        kept = []
        if self.starts[first] < start:
            kept.append((self.starts[first], start, self.sources[first], self.offsets[first]))
        if self.ends[last - 1] > end:
            shift = end - self.starts[last - 1]
            kept.append((end, self.ends[last - 1], self.sources[last - 1],
                         self.offsets[last - 1] + shift))
        for column in (self.starts, self.ends, self.sources, self.offsets):
            del column[first:last]
        for at, piece in enumerate(kept):
            self._insert(first + at, *piece)

    def pieces(self, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """(start, end, source, offset) of each held piece within [start, end), clipped."""
        found = []
        for n in range(bisect.bisect_right(self.ends, start), len(self.starts)):
            lo, hi = max(start, self.starts[n]), min(end, self.ends[n])
            if lo >= hi:
                break
            found.append((lo, hi, self.sources[n], self.offsets[n] + lo - self.starts[n]))
        return found

    def _insert(self, at: int, start: int, end: int, source: int, offset: int) -> None:
        self.starts.insert(at, start)
        self.ends.insert(at, end)
        self.sources.insert(at, source)
        self.offsets.insert(at, offset)


class Recorder:
    """Recording mode: keeps the bytes of every write once (appended to the blob file;
    the `fs` event names their place) and serves them from there, and notes each time
    the job looked at a path (`fs_read`: stat, list or read), so that a crash state can
    be rebuilt from the history and a recovery's view of the folder told apart from
    another's."""

    def __init__(self, blobs: Path) -> None:
        self.blobs = open(blobs, "ab")  # noqa: SIM115 - open for the mount's life
        self.sources = [os.open(blobs, os.O_RDONLY)]  # OWN, then blobs an image is laid from
        self.files: dict[int, Extents] = {}  # backing inode -> what the overlay holds
        self.lock = threading.Lock()

    def write(self, fd: int, data: bytes, offset: int) -> list[int]:
        """Write `data` at `offset` of the open file `fd`: into the blob file only, the
        backing file grown to hold it. Returns [offset in the blob file, length]."""
        with self.lock:
            kept = self.blobs.tell()
            self.blobs.write(data)
            self.blobs.flush()  # to the kernel: a read through `sources` sees it
            st = os.fstat(fd)
            end = offset + len(data)
            if end > st.st_size:
                os.ftruncate(fd, end)
            else:  # its mtime moves as a write's would: a job may pick files by it, and
                os.utime(fd)  # the kernel's cache of its other names goes (auto_cache)
            self.files.setdefault(st.st_ino, Extents()).put(offset, end, OWN, kept)
        return [kept, len(data)]

    def read(self, fd: int, size: int, offset: int) -> bytes:
        st = os.fstat(fd)
        length = max(min(offset + size, st.st_size) - offset, 0)
        with self.lock:
            extents = self.files.get(st.st_ino)
            pieces = extents.pieces(offset, offset + length) if extents is not None else []
        if not pieces:
            return os.pread(fd, size, offset)
        if sum(stop - start for start, stop, _, _ in pieces) == length:
            # all in the overlay (the backing file is a hole here): a load's read of a
            # checkpoint spans one or two writes' bytes, joined with one copy
            return b"".join(self._read(*piece) for piece in pieces)
        out = bytearray(os.pread(fd, length, offset).ljust(length, b"\0"))
        for piece in pieces:
            out[piece[0] - offset:piece[1] - offset] = self._read(*piece)
        return bytes(out)

    def _read(self, start: int, stop: int, source: int, at: int) -> bytes:
        data = os.pread(self.sources[source], stop - start, at)
        if len(data) != stop - start:
            raise OSError(f"a recording's blob file ends before byte {at + stop - start}")
        return data

    def truncated(self, ino: int, length: int) -> None:
        """The backing file `ino` was cut or grown to `length` (truncate, O_TRUNC)."""
        with self.lock:
            extents = self.files.get(ino)
            if extents is not None:
                extents.cut(length, sys.maxsize)

    def created(self, ino: int) -> None:
        """A new file: nothing held for a file gone before it that had its number."""
        with self.lock:
            self.files.pop(ino, None)

    def lay(self, blobs: Path, files: dict[int, list[tuple[int, int, int]]]) -> None:
        """An image laid over backing files already sized: `files` maps an inode to
        (file offset, length, offset in `blobs`) pieces; a recovery reads its crash
        state's checkpoint from the recording without a copy of it."""
        with self.lock:
            source = len(self.sources)
            self.sources.append(os.open(blobs, os.O_RDONLY))
            for ino, pieces in files.items():
                extents = self.files[ino] = Extents()  # a new file: nothing of an old one
                for start, length, at in pieces:
                    if length:
                        extents.put(start, start + length, source, at)

    def looked_at(self, op: str, path: str, log: HistoryWriter, pid: int) -> None:
        log.record("fs_read", op=op, path=path, pid=pid)
