"""What a checkpoint folder holds, read from its bytes: which files are cut short and
which pointer names a checkpoint that is not whole.

A failed resume says what it raised (`CheckpointException`, `OSError: [Errno 22]`);
an engineer then opens the folder and finds the reason: `latest` names `step_8/`,
which has no `.metadata`; the tracker says 20, and `global_step_20/` holds one rank's
file of two; `model.pt` is half a zip. This module is that look, without torch:

- a torch zip (`torch.save`'s format) must end with the zip's end record;
- a safetensors file's header length and its tensors' offsets must fit in the file;
- a DCP folder (one with `.distcp` files) must have its `.metadata`, and no empty shard;
- a file with a checkpoint's suffix must not be empty;
- a pointer is a symlink, or a small text file that holds a step number or a name
  (`latest`, `latest_checkpointed_iteration.txt`, `checkpoint`): it must name
  something that exists, and what it names must be whole by the rules above.

Only what a pointer names is judged as a checkpoint: a torn temporary file beside a
published one is what a correct protocol leaves, no defect (`Finding.named_by`
tells which pointer, None for an entry judged because a resume read it).
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".distcp", ".npy",
                       ".pkl", ".tar")
ZIP_HEAD, ZIP_END = b"PK\x03\x04", b"PK\x05\x06"
ZIP_END_REACH = 22 + 65535  # the end record and the longest comment it may carry
POINTER_MAX_BYTES = 256
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Finding:
    path: str  # relative to the run directory
    what: str  # what is wrong with it, with sizes
    named_by: str | None = None  # the pointer that names it (relative), if one does

    def describe(self) -> str:
        if self.named_by is None:
            return f"{self.path} is {self.what}"
        return f"{self.named_by} named {self.path}, which is {self.what}"


def defect(path: Path, contents: bool = True) -> str | None:
    """What is wrong with one file or folder, None where nothing is. Without `contents`
    only names and sizes are read (a crash state's recovery folder holds its files as
    sized holes, their bytes in the recording)."""
    try:
        if path.is_dir():
            return _folder_defect(path, contents)
        return _file_defect(path, contents)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"


def _file_defect(path: Path, contents: bool = True) -> str | None:
    size = path.stat().st_size
    if size == 0:
        return "an empty file" if path.name.endswith(CHECKPOINT_SUFFIXES) else None
    if not contents:
        return None
    with open(path, "rb") as f:
        head = f.read(8)
        if head.startswith(ZIP_HEAD):
            f.seek(max(0, size - ZIP_END_REACH))
            if ZIP_END not in f.read():
                return f"a torch zip without its end record ({size} bytes: cut short)"
        elif path.suffix == ".safetensors":
            return _safetensors_defect(f, head, size)
    return None


def _safetensors_defect(f, head: bytes, size: int) -> str | None:
    if len(head) < 8:
        return f"a safetensors file of {size} bytes, shorter than its header's length"
    length = struct.unpack("<Q", head)[0]
    if 8 + length > size:
        return f"a safetensors file whose {length}-byte header runs past its end ({size} bytes)"
    try:
        header = json.loads(f.read(length))
    except ValueError:
        return "a safetensors file whose header is not JSON (cut short or overwritten)"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"
            and isinstance(t, dict) and "data_offsets" in t]
    need = 8 + length + max(ends, default=0)
    if need > size:
        return f"a safetensors file of {size} bytes whose tensors need {need}"
    return None


def _folder_defect(folder: Path, contents: bool = True) -> str | None:
    names = os.listdir(folder)
    shards = [n for n in names if n.endswith(".distcp")]
    if not names:
        return "an empty folder"
    if shards and ".metadata" not in names:
        return f"a DCP folder without .metadata ({len(shards)} .distcp file(s))"
    for name in sorted(names):
        if (folder / name).is_dir():
            continue
        if (why := _file_defect(folder / name, contents)) is not None:
            return f"a folder whose {name} is {why}"
    return None


def pointed_at(pointer: Path, contents: bool = True) -> list[Path] | None:
    """What a pointer names (None: it is no pointer). A symlink names its target; a
    small text file (read only with `contents`) a sibling by name, or the siblings
    whose names hold its number."""
    if pointer.is_symlink():
        return [pointer.parent / os.readlink(pointer)]
    if not contents or not pointer.is_file() or pointer.name.endswith(CHECKPOINT_SUFFIXES):
        return None
    try:
        if pointer.stat().st_size > POINTER_MAX_BYTES:
            return None
        text = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text or "\n" in text or "\0" in text:
        return None
    if text.isdigit():
        step = int(text)
        return [p for p in sorted(pointer.parent.iterdir()) if p != pointer
                and step in map(int, _NUMBER.findall(p.name))]
    if "/" not in text.strip("./") and (pointer.parent / text).exists():
        return [pointer.parent / text]
    return None


def inspect(run_dir: Path, roots: list[str], read: list[str] = (),
            contents: bool = True) -> list[Finding]:
    """The defects of what the pointers in the folders `roots` (relative to `run_dir`)
    name, and of the files in `read` (what a resume read): each once. Without
    `contents`, by names and sizes alone (see `defect`)."""
    found: dict[str, Finding] = {}
    for root in roots:
        for pointer in _pointers(run_dir / root):
            named = pointed_at(pointer, contents)
            if named is None:
                continue
            shown = _rel(pointer, run_dir)
            if not named:
                found.setdefault(shown, Finding(shown, f"a pointer holding"
                                                f" {pointer.read_text().strip()!r} that no"
                                                " entry beside it names"))
            for target in named:
                if not os.path.lexists(target):
                    found.setdefault(_rel(target, run_dir), Finding(
                        _rel(target, run_dir), "missing", shown))
                elif (why := defect(target, contents)) is not None:
                    found.setdefault(_rel(target, run_dir),
                                     Finding(_rel(target, run_dir), why, shown))
    for path in read:
        target = run_dir / path
        if path not in found and target.exists() and (
                why := defect(target, contents)) is not None:
            found[path] = Finding(path, why)
    return list(found.values())


def _pointers(folder: Path) -> list[Path]:
    """The entries of a checkpoint folder and of its sub-folders one level down that
    can be pointers (a pointer sits beside what it names)."""
    if not folder.is_dir() or folder.is_symlink():
        return []
    entries = sorted(folder.iterdir())
    below = [p for sub in entries if sub.is_dir() and not sub.is_symlink()
             for p in sorted(sub.iterdir()) if p.is_symlink()]
    return [p for p in entries if p.is_symlink() or p.is_file()] + below


def _rel(path: Path, run_dir: Path) -> str:
    return os.path.normpath(os.path.relpath(path, run_dir))
