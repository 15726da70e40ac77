"""The checkpoint folder as it was found: which files would load, what a save left behind.

Not a reader of one file but of a folder: `gather` hands it every folder that
holds checkpoint-like files. Nothing is loaded with torch (a dump may be
gigabytes, and unpickling runs code): a torch.save file is a zip whose central
directory sits at its end, so a file cut short has none; a safetensors file
says its own length in its header. A temporary file (`*.tmp`, `tmp*`,
`*.partial`) left beside them is a save that never finished, and a DCP folder
with `.distcp` shards and no `.metadata` is one that never committed.

A file that one rank wrote says so in its name (DCP's `__1_0.distcp`,
`rank_1.pt`, `model_rank1.pt`): its observation carries that rank, so a job
whose launcher named only some ranks still shows how many it had. A model- or
pipeline-parallel index (`mp_rank_01`) is not a global rank and is not taken.
A file's step is the one its name calls a step, else its step folder's
(`step-000010/__1_0.distcp`), never a rank's or a shard's number.

What the bytes say is read three more ways, for the checkpoints users resume from
first: a DCP shard shorter than the extent its folder's `.metadata` gives it (the
metadata read by an unpickler that builds no object of the file's: every class it
names is a stand-in); a file of a format with no trailer to check much shorter than
its siblings of other steps (`compare_with_siblings`, across the job's folders); and
the pointer a writer keeps to its newest checkpoint (a small text file or a link
that names an entry of the folder: `latest.txt`, DeepSpeed's `latest`), so a torn
file the pointer names is the one a resume read.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import struct
import zipfile
from pathlib import Path

from torchchaos.incident.observations import Observation, Source

WEIGHTS = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".distcp", ".tar")
TEMP = re.compile(r"(\.tmp\b|^tmp|\.partial$|\.part$|\.incomplete$|\.inprogress$|~$)")
STEP_IN_NAME = re.compile(r"(\d+)(?!.*\d)")
NAMED_STEP = re.compile(r"(?:step|iter|iteration)[-_=]?(\d+)", re.I)  # step-0010, step=10
# a folder per checkpoint, named by its step: step-000010, step_20, checkpoint-10, iter_100
STEP_FOLDER = re.compile(r"(?:step|checkpoint|ckpt|iter|iteration)[-_=]?(\d+)$", re.I)
RANDOM_TEMP = re.compile(r"^\.?tmp[-_]?[a-z0-9_]{6,8}$")  # tempfile.mkstemp's names
DCP_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")  # FileSystemWriter: __{rank}_{n}.distcp
RANK_IN_NAME = re.compile(r"(?:^|[._-])((?:[a-z]{2}_)?)rank[_-]?(\d+)(?=[._-]|$)")
PARALLEL_INDEX = ("mp_", "pp_", "tp_", "dp_", "ep_", "cp_")  # an index inside one group


def looks_like_checkpoint(path: Path) -> bool:
    name = path.name
    return name.endswith(WEIGHTS) or name == ".metadata" or TEMP.search(name) is not None \
        and any(name.split(".tmp")[0].endswith(w) or w in name for w in WEIGHTS)


def is_checkpoint_folder(folder: Path) -> bool:
    try:
        return any(p.is_file() and looks_like_checkpoint(p) for p in folder.iterdir())
    except OSError:
        return False


def read_with_the_folder(path: Path) -> bool:
    """Whether a file of a checkpoint folder is one `read_folder` tells of: a checkpoint,
    or a temporary file beside them, which is a save's whatever its name ("tmp-x.part")."""
    return looks_like_checkpoint(path) or TEMP.search(path.name) is not None


def read_folder(folder: Path, shown: str) -> list[Observation]:
    """One observation per checkpoint-like file (does it load, is it a leftover), one for
    a DCP folder that never committed, and one per pointer to a checkpoint."""
    found = []
    files = sorted(p for p in folder.iterdir() if p.is_file() and read_with_the_folder(p))
    extents = _dcp_extents(folder / ".metadata")
    for path in files:
        name = f"{shown}/{path.name}"
        if TEMP.search(path.name):
            found.append(Observation("checkpoint", Source(name), detail="a temporary file left:"
                                     " a save that never finished", step=step_of(path),
                                     extra={"temp": True, "loads": None}))
            continue
        size = _size(path)
        problem, checked = _problem(path, size)
        if problem is None and path.name in extents and size is not None \
                and size < extents[path.name]:
            problem, checked = (f"cut short: {size:,} bytes, where .metadata gives it"
                                f" {extents[path.name]:,}"), True
        found.append(Observation("checkpoint", Source(name), step=step_of(path),
                                 detail=problem or "loads", rank=rank_of(path.name),
                                 extra={"temp": False, "loads": problem is None,
                                        "size": size, "checked": checked}))
    if any(p.suffix == ".distcp" for p in files) and not (folder / ".metadata").exists():
        found.append(Observation("checkpoint", Source(shown), detail="DCP shards without"
                                 " .metadata: a save that never committed",
                                 extra={"temp": True, "loads": False}))
    return found + pointers(folder, shown)


# what a pointer to the newest checkpoint is called, where it holds only a step number
# (Megatron's latest_checkpointed_iteration.txt: "1000" for iter_0001000/)
POINTER_NAME = re.compile(r"latest|last|newest|current|iteration|checkpoint", re.I)
POINTER_MAX = 4096  # bytes: a pointer is one short line


def pointers(folder: Path, shown: str) -> list[Observation]:
    """The files and links in `folder` that name one of its entries: a link to it, or a
    short text file whose one line is its name (or a path ending in it), or, in a file
    named as a pointer is, the step number of exactly one entry."""
    entries = {p.name: p for p in folder.iterdir()}
    found = []
    for name, path in sorted(entries.items()):
        target = _pointed_at(path, entries)
        if target is not None and target != name:
            found.append(Observation("pointer", Source(f"{shown}/{name}"),
                                     detail=f"names {target}", step=step_of(entries[target]),
                                     extra={"target": f"{shown}/{target}"}))
    return found


def _pointed_at(path: Path, entries: dict[str, Path]) -> str | None:
    if path.is_symlink():
        target = Path(str(path.readlink())).name
        return target if target in entries else None
    if not path.is_file() or looks_like_checkpoint(path) or path.stat().st_size > POINTER_MAX:
        return None
    try:
        words = path.read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(words) != 1:
        return None
    word = words[0].rstrip("/").rsplit("/", 1)[-1]
    if word in entries:
        return word
    if word.isdigit() and POINTER_NAME.search(path.name):
        stepped = [n for n, p in entries.items() if p != path and step_of(p) == int(word)]
        return stepped[0] if len(stepped) == 1 else None
    return None


# a file at most this part of its siblings' size is cut short, where its format has no
# trailer to tell (DCP's shards, a legacy pickle): saves of one model differ by bytes
SHORT = 0.5


def sibling_key(o: Observation) -> tuple[str, int | None]:
    """What a checkpoint file's siblings share: its path with every number blanked
    (`step_#/rank#.pt`, `model_#.pt`) and its rank; their steps differ."""
    return re.sub(r"\d+", "#", o.source.file), o.rank


def compare_with_siblings(observations: list[Observation]) -> list[Observation]:
    """`observations`, with each checkpoint file whose format could not be checked and
    that is of the newest step among its siblings (the files named as it is, numbers
    aside, of the same rank, in other steps) and under SHORT of the smallest of them
    told as cut short."""
    files = [o for o in observations if o.what == "checkpoint" and o.extra.get("loads")
             and o.extra.get("size") is not None and o.step is not None]
    groups: dict[tuple[str, int | None], list[Observation]] = {}
    for o in files:
        groups.setdefault(sibling_key(o), []).append(o)
    short = {}
    for group in groups.values():
        newest = max(group, key=lambda o: o.step or 0)
        others = [o for o in group if o.step != newest.step]
        if newest.extra.get("checked") or not others:
            continue
        smallest = min(others, key=lambda o: o.extra["size"])
        if newest.extra["size"] < SHORT * smallest.extra["size"]:
            short[id(newest)] = (f"much shorter than its siblings of other steps:"
                                 f" {newest.extra['size']:,} bytes, where"
                                 f" {smallest.source.file.rsplit('/', 1)[-1]} of step"
                                 f" {smallest.step} is {smallest.extra['size']:,}: cut short")
    return [dataclasses.replace(o, detail=short[id(o)], extra={**o.extra, "loads": False})
            if id(o) in short else o for o in observations]


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def step_of(path: Path) -> int | None:
    """The step a checkpoint file is of: the one its name calls a step (`step-0010.pt`,
    `epoch=1-step=10.ckpt`); else its folder's, where the folder is one step's
    (`step-000010/__1_0.distcp`, `step_20/rank_1.pt`, `checkpoint-10/rng_state_1.pth`);
    else the last number of its name that is no rank's or shard's (`ckpt_100.pt`);
    None where none names one."""
    stem = path.stem
    if named := NAMED_STEP.search(stem):
        return int(named.group(1))
    if folder := STEP_FOLDER.search(path.parent.name):
        return int(folder.group(1))  # every file of a step's folder is of that step
    if DCP_SHARD.match(path.name) or path.name == ".metadata" or RANDOM_TEMP.match(path.name):
        return None  # its numbers are a rank's, a shard's or tempfile's random letters
    number = STEP_IN_NAME.search(RANK_IN_NAME.sub("", stem.lower()))  # no rank's, mp_rank's
    return int(number.group(1)) if number else None


def rank_of(name: str) -> int | None:
    """The global rank that wrote a per-rank file, where its name says one."""
    if m := DCP_SHARD.match(name):
        return int(m.group(1))
    m = RANK_IN_NAME.search(name.lower())
    if m is None or m.group(1) in PARALLEL_INDEX:
        return None
    return int(m.group(2))


def _problem(path: Path, size: int | None) -> tuple[str | None, bool]:
    """(why the file of `size` bytes would not load or None, whether its format let that
    be checked)."""
    try:
        if size is None:
            size = path.stat().st_size  # raises what made the size unknown
        if size == 0:
            return "empty", True
        with path.open("rb") as f:
            head = f.read(8)
        if path.suffix == ".safetensors":
            return _safetensors_problem(path, size, head), True
        if head[:2] == b"PK":  # torch.save's zip format
            with zipfile.ZipFile(path) as z:
                z.infolist()
            return None, True
        if path.suffix in (".distcp", ".bin", ".tar") or path.name == ".metadata":
            return None, False  # formats without a trailer to check: taken as they are
        if head[:1] == b"\x80":  # torch.save's legacy (pickle) format
            return None, False
        return "neither a zip (torch.save) nor a pickle: not a checkpoint torch.load reads", True
    except zipfile.BadZipFile:
        return "cut short or overwritten: its zip directory is missing (torch.load fails)", True
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}", True


class _StandIn:
    """Any class a DCP `.metadata` pickle names: it takes the arguments and state it is
    given and runs nothing of the class it stands in for."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args = args

    def __setstate__(self, state: object) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) of a slotted class
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)


class _MetadataReader(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> type:
        return type(name, (_StandIn,), {})


METADATA_MAX = 64 << 20


def _dcp_extents(metadata: Path) -> dict[str, int]:
    """{shard file name: the bytes `.metadata` says it holds (its items' furthest end)};
    {} where there is no metadata or it cannot be read this way."""
    try:
        if not metadata.is_file() or metadata.stat().st_size > METADATA_MAX:
            return {}
        with metadata.open("rb") as f:
            root = _MetadataReader(f).load()
    except Exception:  # a pickle this reader cannot build: the extents are not known
        return {}
    extents: dict[str, int] = {}
    for info in (getattr(root, "storage_data", None) or {}).values():
        path, offset, length = (getattr(info, k, None) for k in ("relative_path", "offset",
                                                                 "length"))
        if isinstance(path, str) and isinstance(offset, int) and isinstance(length, int):
            extents[path] = max(extents.get(path, 0), offset + length)
    return extents


def _safetensors_problem(path: Path, size: int, head: bytes) -> str | None:
    if len(head) < 8:
        return "cut short: no header"
    length = struct.unpack("<Q", head)[0]
    if 8 + length > size:
        return "cut short: the header runs past the end"
    with path.open("rb") as f:
        f.seek(8)
        try:
            header = json.loads(f.read(length))
        except ValueError:
            return "the header is not JSON"
    ends = [v["data_offsets"][1] for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v]
    if ends and 8 + length + max(ends) > size:
        return "cut short: tensors run past the end"
    return None
