"""The artefacts a user names, read: every file by the readers that know its format.

A file named on the command line must be one some reader knows; in a folder,
files no reader knows are passed over and listed (a config, a tokenizer). A
file a reader claims but cannot read (a cut-off error file) stops the import:
every such file is named, one line each, and nothing is written.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from torchchaos.errors import UsageError
from torchchaos.incident import script_source
from torchchaos.incident.formats import checkpoints, text
from torchchaos.incident.observations import Observation, Source, worker_of
from torchchaos.incident.readers import BadArtefact, Reader, all_readers

LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
# a text file no reader takes is a launch only by these: a .txt beside logs is often notes
LAUNCH_SUFFIXES = (".log", ".out", ".err")
MAX_READ = 256 << 20  # a log past this is read from its last MAX_READ bytes
# Folders no artefact of a failed job lives in: caches, and a torchchaos run's own
# bookkeeping (an import of a run must see only what the job and its launcher left).
SKIP_DIRS = {"__pycache__", ".git", "history", "fired", "beats", "weights", "snapshot"}
# and in a run's `_chaos/`: the faults the harness planned (its steps are the injected
# faults', not the job's), its record of what it stopped, and its fault filesystem's
# own folder (a control socket, the shadow copy of the files the job wrote)
HARNESS_OWN = {"schedule.json", "stopped", "faultfs"}
# Pages and plots (torchchaos's report, postmortem and timeline among them): they quote
# the lines they were drawn from, which the logs beside them hold
PAGES = (".html", ".htm", ".svg")


@dataclass
class Gathered:
    observations: list[Observation] = field(default_factory=list)
    read: dict[str, list[str]] = field(default_factory=dict)  # shown name -> reader names
    passed_over: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the script files the tracebacks quote, read where they still say what was quoted
    sources: dict[str, list[str]] = field(default_factory=dict)


def gather(paths: list[Path], script: Path | None = None) -> Gathered:
    """Read every named file and folder; UsageError (one line per bad file) on a file
    that cannot be read, on an unknown file named on its own, or when nothing is known.
    The script files the tracebacks point into are read too (`script` stands in for a
    path that does not exist here), never written."""
    readers = all_readers()
    found, problems = Gathered(), []
    for path in paths:
        if not path.exists():
            problems.append(f"{path}: no such file or folder")
        elif path.is_dir():
            for file, shown in _walk(path, found):
                problems += _read_file(file, shown, readers, found, named=False)
        elif path.name.lower().endswith(PAGES):
            problems.append(f"{path}: a page or a plot, not an artefact of the job (name the"
                            " logs it was drawn from)")
        else:
            problems += _read_file(path, path.name, readers, found, named=True)
    if problems:
        head = "an artefact cannot be read" if len(problems) == 1 else \
            f"{len(problems)} artefacts cannot be read"
        raise UsageError(f"{head} (nothing was written):\n  " + "\n  ".join(problems))
    if not found.read:
        raise UsageError(f"nothing torchchaos can read in {', '.join(map(str, paths))}"
                         f" (it reads: {', '.join(r.name for r in readers)}, and checkpoint"
                         " folders)")
    found.observations = checkpoints.compare_with_siblings(found.observations)
    codes = [c for o in found.observations for c in o.extra.get("code", ())]
    found.sources = script_source.read_sources(codes, script)
    return found


def _walk(root: Path, found: Gathered) -> list[tuple[Path, str]]:
    files: list[tuple[Path, str]] = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        own = HARNESS_OWN if here.name == "_chaos" else set()
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS | own
                         and not d.startswith(("torchinductor", "triton")))
        names = [n for n in names if n not in own and not n.lower().endswith(PAGES)]
        shown = str(here.relative_to(root.parent))
        holds_checkpoints = checkpoints.is_checkpoint_folder(here)
        if holds_checkpoints:
            read = checkpoints.read_folder(here, shown)
            found.read[shown + "/"] = ["checkpoints"]
        elif any(checkpoints.is_checkpoint_folder(here / d) for d in dirs):
            # a folder of step folders may hold the pointer to the newest (`latest`)
            read = checkpoints.pointers(here, shown)
        else:
            read = []
        found.observations += read
        pointers = {o.source.file for o in read if o.what == "pointer"}
        for name in sorted(names):
            path = here / name
            if not path.is_file():
                continue  # a socket, a pipe or a dangling link: nothing a job left to read
            if holds_checkpoints and checkpoints.read_with_the_folder(path):
                continue  # the folder's observations cover it
            if f"{shown}/{name}" in pointers:
                found.read[f"{shown}/{name}"] = ["checkpoints (a pointer)"]
                continue
            files.append((path, f"{shown}/{name}"))
    return files


def _read_file(path: Path, shown: str, readers: list[Reader], found: Gathered,
               named: bool) -> list[str]:
    try:
        data = _contents(path, found, shown)
    except OSError as exc:
        return [f"{shown}: cannot be read: {exc.strerror or exc}"]
    if not data.strip():
        if named:
            return [f"{shown}: empty"]
        if _launch_log(path, shown, LOG_SUFFIXES):  # a launch that said nothing
            found.observations.append(Observation("log_file", Source(shown), detail="empty"))
            found.read[shown] = ["(empty log)"]
        return []
    claimed = [r for r in readers if _sniffs(r, data, shown)]
    structured = [r for r in claimed if r.structured]
    if structured:
        claimed = structured[:1]  # a document is one format's, whole
    if not claimed:
        if named:
            what = "text" if text.is_text(data) else "binary"
            return [f"{shown}: {what}, and no reader knows its format (they read:"
                    f" {', '.join(r.name for r in readers)})"]
        found.passed_over.append(shown)
        if _launch_log(path, shown, LAUNCH_SUFFIXES):  # a launch whose lines no reader takes
            found.observations.append(dataclasses.replace(_log_file(data, shown, []),
                                                          detail="nothing read"))
        return []
    observations = []
    for reader in claimed:
        try:
            observations += reader.read(data, shown)
        except BadArtefact as exc:
            return [f"{shown}: {exc} (read as {reader.name})"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            return [f"{shown}: not a well-formed {reader.name} artefact"
                    f" ({type(exc).__name__}: {exc})"[:300]]
    if path.suffix in LOG_SUFFIXES and not any(r.structured for r in claimed) \
            and not {r.name for r in claimed} <= DUMPS:
        observations.append(_log_file(data, shown, observations))
    found.observations += observations
    found.read[shown] = [r.name for r in claimed]
    return []


# readers of what a tool took apart from the job (py-spy's or a watchdog's stacks, the
# kernel's log): a file only they read is no launch's log, to compare with a relaunch's
DUMPS = {"stacks", "kernel"}

# how many of a log's first step lines are kept, to tell a relaunch that started over
OPENING_STEPS = 20


def _log_file(data: bytes, shown: str, observations: list[Observation]) -> Observation:
    """A log's own observation: the kinds of lines it printed, and its first step lines
    as printed (a relaunch that printed them again, word for word, started over); in a
    log with no step line, its save lines that carry a number ("Epoch 1 | Training
    snapshot saved at ..."; "Saved checkpoint to last.pt", said alike by a fresh start
    and a resume, tells neither)."""
    stepped = sorted({o.source.line for o in observations if o.step is not None
                      and o.what in ("step", "save") and o.source.line is not None}) \
        or sorted({o.source.line for o in observations if o.what == "save"
                   and o.source.line is not None and re.search(r"\d", o.detail)})
    shapes, opening = text.outline(data, set(stepped[:OPENING_STEPS]))
    return Observation("log_file", Source(shown), detail="log",
                       extra={"shapes": shapes, "opening": opening,
                              "step_lines": len(stepped)})


def _launch_log(path: Path, shown: str, suffixes: tuple[str, ...]) -> bool:
    """Whether a file that says nothing a reader takes may still be a launch's log: not an
    empty stack dump, nor a worker's own file in torchrun's --log-dir."""
    return path.suffix in suffixes and path.parent.name != "stacks" and worker_of(shown) is None


def _sniffs(reader: Reader, data: bytes, shown: str) -> bool:
    try:
        return reader.sniff(data, shown)
    except Exception:  # a plug-in's sniff that breaks claims nothing
        return False


def _contents(path: Path, found: Gathered, shown: str) -> bytes:
    """The bytes the readers are shown. A binary file that is neither a pickle nor a JSON
    document (a data set, a model blob a folder holds) is shown its head only: no reader
    of text takes a file whose first 8 KiB are binary, so reading on is wasted."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8192)
        if not text.is_text(head) and not head.lstrip().startswith((b"\x80", b"{")):
            return head
        f.seek(0)
        if size <= MAX_READ:
            return f.read()
        f.seek(size - MAX_READ)
        found.notes.append(f"{shown}: {size >> 20} MiB; its last {MAX_READ >> 20} MiB were read")
        return f.read()
