"""A recording mount writes every byte once, into its blob file, and reads it back from
there: the files under it read as written, through overwrites, holes, truncation,
renames and hard links, while the backing files hold sizes and no data."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchchaos.explore.crash.extents import Blobs, Content
from torchchaos.explore.crash.states import lay
from torchchaos.faults.faultfs.mount import Mount, unavailable_reason
from torchchaos.faults.faultfs.recording import Extents
from torchchaos.host.mounts import mounts_under

SPAN = 48  # bytes of file the pure model test works in

ranges = st.tuples(st.integers(0, SPAN), st.integers(0, SPAN)).map(sorted)
operations = st.lists(st.tuples(st.booleans(), ranges, st.integers(0, 3)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_extents_hold_the_last_put_of_every_byte(ops):
    """Put and cut against a byte-by-byte model: every byte maps to the last put that
    covered it (source and offset), and the pieces stay sorted and apart."""
    extents, model = Extents(), [None] * SPAN
    for n, (put, (start, end), source) in enumerate(ops):
        if put:
            extents.put(start, end, source, 1000 * n)
            for at in range(start, end):
                model[at] = (source, 1000 * n + at - start)
        else:
            extents.cut(start, end)
            model[start:end] = [None] * (end - start)
    seen = [None] * SPAN
    for start, end, source, offset in extents.pieces(0, SPAN):
        for at in range(start, end):
            seen[at] = (source, offset + at - start)
    assert seen == model
    assert all(a < b for a, b in zip(extents.starts, extents.ends))
    assert all(b <= c for b, c in zip(extents.ends, extents.starts[1:]))


needs_fuse = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())


@needs_fuse
def test_files_under_a_recording_mount_read_as_written_and_their_bytes_are_kept_once(
        tmp_path: Path):
    rng = random.Random(29)
    blobs = tmp_path / "blobs"
    mount = Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl",
                  record=blobs).start()
    model: dict[str, bytearray] = {}
    written = 0
    try:
        root = mount.mountpoint
        big = rng.randbytes(3 << 20)  # several FUSE requests, and reads across them
        with open(root / "big.pt", "wb") as f:
            f.write(big)
        model["big.pt"], written = bytearray(big), len(big)
        for step in range(300):
            name = rng.choice(["a", "b", "c", "big.pt"])
            action = rng.choice(["write", "write", "write", "truncate", "trunc_open",
                                 "rename", "link", "unlink"])
            path = root / name
            if action == "write":
                offset = rng.randrange(0, len(model.get(name, b"")) + 5000)
                data = rng.randbytes(rng.randrange(1, 70000))
                with open(path, "r+b" if name in model else "wb") as f:
                    f.seek(offset)
                    f.write(data)
                content = model.setdefault(name, bytearray())
                content.extend(bytes(max(0, offset - len(content))))
                content[offset:offset + len(data)] = data
                written += len(data)
            elif action == "truncate" and name in model:
                length = rng.randrange(0, len(model[name]) + 5000)
                os.truncate(path, length)
                model[name] = model[name][:length].ljust(length, b"\0")
            elif action == "trunc_open":
                with open(path, "wb"):
                    model[name] = bytearray()
            elif action == "rename" and name in model:
                to = rng.choice(["a", "b", "c", "d"])
                os.rename(path, root / to)
                model[to] = model.pop(name)
            elif action == "link" and name in model and "l" not in model:
                # the link and the name share one file: a write through one shows in both
                os.link(path, root / "l")
                data = rng.randbytes(100)
                with open(root / "l", "r+b") as f:
                    f.write(data)
                model[name][:100] = data
                model[name].extend(b"")
                os.unlink(root / "l")
                written += len(data)
            elif action == "unlink" and name in model:
                os.unlink(path)  # a new file may be given its number: it starts empty
                del model[name]
            for each, content in model.items():
                assert (root / each).read_bytes() == bytes(content), (step, action, each)
        assert sorted(os.listdir(root)) == sorted(model)
        for name, content in model.items():  # not sparse to whoever looks: bytes are there
            assert (root / name).stat().st_blocks * 512 >= len(content), name
    finally:
        mount.close()
        assert mounts_under(tmp_path) == []
    backing = tmp_path / "mnt"
    for name, content in model.items():  # the sizes, not the bytes: those are in the blob
        assert (backing / name).stat().st_size == len(content)
        assert (backing / name).stat().st_blocks == 0, name
    assert blobs.stat().st_size == written


@needs_fuse
def test_a_crash_state_is_laid_out_under_a_recovery_mount_with_no_copy_of_its_bytes(
        tmp_path: Path):
    """A recovery's folder: the state's files read as the state has them (extents of the
    recording's blob file, a hole, a write at the end), with the state's order of
    modification times, and a write by the recovery shows over them; the backing files
    hold none of those bytes."""
    rng = random.Random(7)
    recording = tmp_path / "recording.blobs"
    recorded = rng.randbytes(5 << 20)
    recording.write_bytes(recorded)
    blobs = Blobs(recording)
    # a file of two writes, the second over the first's middle, a hole, then more at the end
    model = Content.empty(blobs).write(0, 0, 2 << 20).write(1 << 20, 3 << 20, 4096)
    model = model.truncate((3 << 20) + 10).write((3 << 20) + 10, 100, 777)
    expected = bytearray(recorded[:2 << 20])
    expected[1 << 20:(1 << 20) + 4096] = recorded[3 << 20:(3 << 20) + 4096]
    expected += bytes((3 << 20) + 10 - len(expected)) + recorded[100:877]
    image = {"ckpt": ("dir",), "ckpt/model.pt": ("file", model),
             "ckpt/old.pt": ("file", Content.empty(blobs).write(0, 5, 10)),
             "latest": ("link", "ckpt/model.pt")}
    mount = Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl",
                  record=tmp_path / "own.blobs").start()
    try:
        lay(image, mount, recording, order={"ckpt/old.pt": 0, "ckpt/model.pt": 1})
        root = mount.mountpoint
        assert (root / "ckpt" / "model.pt").read_bytes() == bytes(expected)
        assert (root / "latest").read_bytes() == bytes(expected)
        assert (root / "ckpt" / "old.pt").read_bytes() == recorded[5:15]
        newest = max((root / "ckpt").iterdir(), key=lambda p: p.stat().st_mtime_ns)
        assert newest.name == "model.pt"
        with open(root / "ckpt" / "old.pt", "r+b") as f:  # the recovery writes over it
            f.seek(4)
            f.write(b"RECOVERED")
        assert (root / "ckpt" / "old.pt").read_bytes() == recorded[5:9] + b"RECOVERED"
    finally:
        mount.close()
        assert mounts_under(tmp_path) == []
    for name in ("model.pt", "old.pt"):
        assert (tmp_path / "mnt" / "ckpt" / name).stat().st_blocks == 0, name
