"""Structured logs: a JSON object per line, told in the words the training log reads.

A platform that ships its logs to a log store writes records, not sentences:
`{"event": "ckpt_save_end", "path": "ckpts/ckpt-000010.pt", "step": 10, "rank": 0}`.
Each record becomes the sentence `trainlog` would have read had the script printed
one ("saved checkpoint ckpts/ckpt-000010.pt step 10"), by the words of its event's
name: a checkpoint (`ckpt`) saved or begun, a resume or a load, none found, a
SIGTERM. A record whose name says none of these keeps its name, with its step.
"""

from __future__ import annotations

import json
import re
from typing import Any

# where a record names what happened, and the step it happened at
NAME_KEYS = ("event", "msg", "message", "action", "name", "type")
STEP_KEYS = ("step", "global_step", "iteration", "iter", "train_step")
PATH_KEYS = ("path", "checkpoint", "ckpt", "file", "dir")

DONE = {"end", "ended", "done", "finish", "finished", "complete", "completed", "saved",
        "written", "committed", "success", "succeeded"}
BEGUN = {"begin", "began", "start", "started", "starting", "saving"}
RESUMED = {"resume", "resumed", "resuming", "restore", "restored", "load", "loaded"}
NONE_FOUND = {"not", "none", "missing", "absent", "notfound", "no"}
FAILED = {"fail", "failed", "failure", "error", "errored"}  # said as it is, not read


def record_of(line: str) -> dict[str, Any] | None:
    """The JSON object a line is, or None."""
    line = line.strip()
    if not (line.startswith("{") and line.endswith("}")):
        return None
    try:
        found = json.loads(line)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def is_record_log(lines: list[str]) -> bool:
    """Whether a file that opens with "{" is a log of records (its first two lines are
    each a JSON object) rather than one JSON document (a manifest, a config)."""
    first = [line for line in lines[:50] if line.strip()][:2]
    return len(first) == 2 and all(record_of(line) is not None for line in first)


def as_sentence(record: dict[str, Any]) -> tuple[str, int | None]:
    """(the sentence the record stands for, the rank it names or None)."""
    name = next((record[k] for k in NAME_KEYS if isinstance(record.get(k), str)), "")
    step = next((record[k] for k in STEP_KEYS if _is_int(record.get(k))), None)
    path = next((record[k] for k in PATH_KEYS if isinstance(record.get(k), str)), "")
    rank = record.get("rank") if _is_int(record.get("rank")) else None
    sentence = _said(name, record) or name
    if path and sentence != name:
        sentence += f" {path}"
    if step is not None:
        sentence += f" step {step}"
    return sentence, rank


def _said(name: str, record: dict[str, Any]) -> str | None:
    words = {"checkpoint" if w in ("ckpt", "ckpts", "checkpoints") else w
             for w in re.split(r"[^a-z0-9]+", name.lower()) if w}
    if "sigterm" in words or record.get("signal") in (15, "15", "SIGTERM"):
        return "received SIGTERM"
    if words & FAILED:
        return None
    saving = "checkpoint" in words or words & {"save", "saved", "saving"}
    if "checkpoint" in words and words & NONE_FOUND:
        return "no checkpoint found"
    if words & RESUMED and ("checkpoint" in words or words & {"resume", "resumed", "resuming"}):
        return "resumed from checkpoint"
    if saving and words & DONE:
        return "saved checkpoint"
    if saving and words & BEGUN:
        return "saving checkpoint"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
