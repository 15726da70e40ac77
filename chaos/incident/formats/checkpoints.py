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
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path

from torchchaos.incident.observations import Observation, Source

WEIGHTS = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".distcp", ".tar")
TEMP = re.compile(r"(\.tmp\b|^tmp|\.partial$|\.incomplete$|\.inprogress$|~$)")
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


def read_folder(folder: Path, shown: str) -> list[Observation]:
    """One observation per checkpoint-like file (does it load, is it a leftover) and
    one for a DCP folder that never committed."""
    found = []
    files = sorted(p for p in folder.iterdir() if p.is_file() and looks_like_checkpoint(p))
    for path in files:
        name = f"{shown}/{path.name}"
        if TEMP.search(path.name):
            found.append(Observation("checkpoint", Source(name), detail="a temporary file left:"
                                     " a save that never finished", step=step_of(path),
                                     extra={"temp": True, "loads": None}))
            continue
        problem = _problem(path)
        found.append(Observation("checkpoint", Source(name), step=step_of(path),
                                 detail=problem or "loads", rank=rank_of(path.name),
                                 extra={"temp": False, "loads": problem is None}))
    if any(p.suffix == ".distcp" for p in files) and not (folder / ".metadata").exists():
        found.append(Observation("checkpoint", Source(shown), detail="DCP shards without"
                                 " .metadata: a save that never committed",
                                 extra={"temp": True, "loads": False}))
    return found


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


def _problem(path: Path) -> str | None:
    """Why the file would not load, or None."""
    try:
        size = path.stat().st_size
        if size == 0:
            return "empty"
        with path.open("rb") as f:
            head = f.read(8)
        if path.suffix == ".safetensors":
            return _safetensors_problem(path, size, head)
        if head[:2] == b"PK":  # torch.save's zip format
            with zipfile.ZipFile(path) as z:
                z.infolist()
            return None
        if path.suffix in (".distcp", ".bin", ".tar") or path.name == ".metadata":
            return None  # formats without a trailer to check: taken as they are
        if head[:1] == b"\x80":  # torch.save's legacy (pickle) format
            return None
        return "neither a zip (torch.save) nor a pickle: not a checkpoint torch.load reads"
    except zipfile.BadZipFile:
        return "cut short or overwritten: its zip directory is missing (torch.load fails)"
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"


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
