"""The training script's own lines, where a traceback points into them.

A script that prints no step and no save still leaves its peers' tracebacks:
a surviving rank quotes the line it waited on (`dist.barrier()`). What that
line means, a barrier after a checkpoint save or a training step's collective,
is in the script around it. This module reads those lines, and only where the
file at hand still says what the traceback quoted (a fixed script whose lines
moved is not read as the one that failed).
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_SCRIPT = 4 << 20  # a training script, not a data file
SAVE_CALL = re.compile(r"\b(?:torch\.save|dcp\.save|async_save|save_checkpoint|save_state_dict"
                       r"|save_pretrained|save_model|save_state|save_ckpt|save)\s*\(")
COLLECTIVE_CALL = re.compile(r"\b(?:barrier|monitored_barrier|all_reduce|broadcast|all_gather"
                             r"|all_gather_object|broadcast_object_list|reduce_scatter"
                             r"|wait_for_everyone)\s*\(")
# How far a fence is looked for after a save, and a save before a fence (lines)
NEAR = 8

Lines = list[str]


def read_sources(codes: list[tuple[str, int, str]], script: Path | None) -> dict[str, Lines]:
    """Each file the tracebacks quote, read where it exists and still says what they quote;
    a file not found at its path is looked for as `script` when the names match."""
    sources: dict[str, Lines] = {}
    for path in sorted({c[0] for c in codes}):
        candidates = [Path(path)]
        if script is not None and Path(path).name == script.name:
            candidates.append(script)
        for candidate in candidates:
            lines = _read(candidate)
            quoted = [c for c in codes if c[0] == path and c[2]]
            if lines is not None and quoted and all(
                    0 < n <= len(lines) and lines[n - 1].strip() == text
                    for _, n, text in quoted):
                sources[path] = lines
                break
    return sources


def _read(path: Path) -> Lines | None:
    try:
        if path.suffix != ".py" or not path.is_file() or path.stat().st_size > MAX_SCRIPT:
            return None
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def save_before(lines: Lines, number: int) -> int | None:
    """The line (1-based) of a save call in the block that leads to line `number` (the
    lines above it at its indentation or deeper, up to the block's head)."""
    own = _indent(lines[number - 1])
    for n in range(number - 1, max(0, number - 1 - NEAR), -1):
        line = lines[n - 1]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if _indent(line) < own:
            return None
        if SAVE_CALL.search(line) and not line.lstrip().startswith("def "):
            return n
    return None


def fenced_save(lines: Lines) -> tuple[int, int] | None:
    """A save call that the script follows with a collective every rank joins (a barrier
    after the writer's save) and no more file work after it in its block: (the save's
    line, the fence's line), the first one found. A barrier in the middle of a save
    (every rank's file written, then rank 0 alone writes a `latest` marker and prunes)
    fences nothing: the other ranks train on while the writer still saves."""
    for n, line in enumerate(lines, 1):
        if not SAVE_CALL.search(line) or line.lstrip().startswith(("def ", "#")):
            continue
        for m in range(n + 1, min(len(lines), n + NEAR) + 1):
            after = lines[m - 1]
            if after.lstrip().startswith(("def ", "class ")):
                break
            if COLLECTIVE_CALL.search(after) and save_before(lines, m) == n:
                return (n, m) if not _file_work_after(lines, m) else None
    return None


# What a save's code does to files (the writes, renames, removals of a checkpoint)
FILE_WORK = re.compile(r"\b(?:open|os\.replace|os\.rename|os\.remove|os\.unlink|rmtree|fsync"
                       r"|torch\.save|save_file|makedirs|mkdir|cleanup\w*|prune\w*)\s*\(|"
                       r"\.write\(")


def _file_work_after(lines: Lines, number: int) -> bool:
    """Whether the rest of line `number`'s block (the lines after it at its indentation
    or deeper) works on files."""
    own = _indent(lines[number - 1])
    for line in lines[number:]:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if _indent(line) < own:
            return False
        if FILE_WORK.search(line):
            return True
    return False
