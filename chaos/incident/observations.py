"""What one artefact says: observations, each with where it was read.

A reader turns a file's text into `Observation`s. An observation is a fact
the file states (rank 1 exited with SIGKILL; rank 0's all-reduce timed out
after 3000 ms; the log's last step is 12), never an inference: which fault
that was is `attribute`'s business. Every observation carries its `Source`,
so every field of an imported incident can say where it came from.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

# What an observation can be about. `attribute` reads these; a reader of a new
# format maps its facts onto them.
WHATS = (
    "exit",          # a rank (or the job) ended: exitcode and/or signal
    "error",         # a rank raised: detail is "Type: message", frames the traceback
    "peer_lost",     # a collective failed because a peer closed its connection
    "collective_timeout",  # a collective waited past its timeout
    "stack",         # where a rank was when someone looked (py-spy, faulthandler)
    "step",          # the training log's step counter for a rank
    "resume",        # the job resumed from a checkpoint
    "no_checkpoint",  # the job looked for a checkpoint to resume from and found none
    "save",          # the job said it saved a checkpoint
    "restart",       # the launcher restarted the workers
    "oom_kill",      # the kernel (or a scheduler) killed a process for memory
    "node_lost",     # a scheduler says the node failed or the job was preempted
    "job_state",     # a scheduler's or operator's final word on the job
    "flight",        # a flight-recorder dump: a rank's last collectives
    "checkpoint",    # the checkpoint folder as found: a file that loads or does not
    "pointer",       # a file or link there that names the newest checkpoint (latest.txt)
    "log_file",      # a log was given (detail "empty" when it holds nothing)
    "rank_line",     # a rank printed something: it was a rank of the job
    "signal",        # a rank said it got a signal (its handler's own line): signal
    "launch_command",  # a batch script's line that starts the training script
    "injected",      # this project's own record of a fault (report.json, replay.yaml)
)

# Where a frame puts a rank: the phase words every reader uses.
PHASE_WORDS = ("save", "load", "collective", "data", "step", "init", "exit")


@dataclass(frozen=True)
class Source:
    """A file and a line (1-based) or a key path in it."""

    file: str
    line: int | None = None
    key: str | None = None

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.key}" if self.key else self.file


@dataclass(frozen=True)
class Observation:
    what: str
    source: Source
    rank: int | None = None       # the global rank, where the artefact names it
    host: str | None = None
    pid: int | None = None
    step: int | None = None
    exitcode: int | None = None
    signal: str | None = None     # "SIGKILL", "SIGSEGV", ...
    reason: str | None = None     # a scheduler's or kernel's word: "OOMKilled", "NODE_FAIL"
    detail: str = ""              # the message, in the artefact's words
    phase: str | None = None      # one of PHASE_WORDS, from the frames
    collective: str | None = None  # "all_reduce", "broadcast", ... where named
    seq: int | None = None        # a collective's sequence number where named
    frames: tuple[str, ...] = ()  # innermost last: "func (file:line)"
    time: float | None = None     # seconds since the epoch, where the artefact says
    attempt: int | None = None    # the launcher's restart count, where known
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if self.what not in WHATS:
            raise ValueError(f"unknown observation {self.what!r}")

    def to_dict(self) -> dict[str, Any]:
        found = {k: v for k, v in asdict(self).items() if v not in (None, "", (), {})}
        found["source"] = str(self.source)
        if self.frames:
            found["frames"] = list(self.frames)
        return found


SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS",
           8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2",
           13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM", 19: "SIGSTOP"}


def signal_of_exitcode(code: int | None) -> str | None:
    """The signal an exit status names: -9 (a Popen return code) or 137 (a shell's 128+9)."""
    if code is None:
        return None
    if code < 0:
        return SIGNALS.get(-code, f"signal {-code}")
    if 128 < code < 160:
        return SIGNALS.get(code - 128)
    return None


# A function of a training script that resumes: `resume`, `maybe_resume`,
# `resume_from_checkpoint`, `restore`, `restore_checkpoint`, `load_checkpoint`, `load_ckpt`,
# Hugging Face's `_load_from_checkpoint` (a frame inside one is the resume's load, whatever
# it calls: a manifest's read, safetensors' `load_file`, a wrapper of `torch.load`)
RESUMES = re.compile(r"resume|restore|^_?load_(from_)?(checkpoint|ckpt)")


def function_of(frame: str) -> str:
    """A frame as the readers write it, "func (path:line)": its function."""
    return frame.split(" (", 1)[0].strip()


def path_of(frame: str) -> str:
    """A frame as the readers write it, "func (path:line)": its path."""
    return frame.rpartition(" (")[2].rstrip(")").rpartition(":")[0]


def phase_of_frames(frames: tuple[str, ...] | list[str]) -> str | None:
    """The phase the innermost telling frame puts a rank in, by the function names torch
    and common code use: a save, a load, a collective, the data loader."""
    found = telling_frame(frames)
    return found[1] if found else None


def telling_frame(frames: tuple[str, ...] | list[str]) -> tuple[str, str] | None:
    """(the innermost frame that tells a phase, that phase). A rank held by torchchaos's
    own hang fault (in a replay) has entered no collective, whatever the frames around
    the hold are named: `mode=collective,op=all_reduce` holds it in a stand-in for
    `dist.all_reduce`, called by wrappers that still name the collective."""
    held = False
    for frame in reversed(list(frames)):
        held = held or _held(frame)
        phase = _phase_of_frame(frame)
        if phase and not (held and phase == "collective"):
            return frame, phase
    return None


def _held(frame: str) -> bool:
    return path_of(frame).endswith("faults/hang.py") and function_of(frame) in (
        "_stop", "_hold", "_hold_gil", "_arm_hold.<locals>.held_collective")


# torchchaos's own wrappers of torch.save and torch.load, safetensors' save_file and
# load_file: a fault injected at a save or a load raises from inside them, before the
# real call's frames
WATCHED_IO = {"save": "save", "whole": "save", "save_file": "save", "load": "load",
              "load_file": "load"}


def _phase_of_frame(frame: str) -> str | None:
    name = function_of(frame).lower()
    text = frame.lower()
    if path_of(frame).endswith("iowatch.py") and name in WATCHED_IO:
        return WATCHED_IO[name]
    if name in ("save", "_save", "save_state_dict", "_save_state_dict", "async_save") \
            or "checkpoint/state_dict_saver" in text \
            or re.match(r"_?save_(checkpoint|ckpt)", name) \
            or "torch/serialization.py" in text and "_save" in name \
            or name == "save_file" and "safetensors" in text:
        return "save"
    if name in ("load", "_load", "load_state_dict", "_load_state_dict", "load_file",
                "load_model", "load_accelerator_state", "load_checkpoint") \
            and ("serialization" in text or "checkpoint" in text or "safetensors" in text) \
            or RESUMES.search(name) or "state_dict_loader" in text \
            or name == "load_from_json" and "trainer_callback" in text:  # HF's trainer_state
        return "load"
    if name == "destroy_process_group":
        return "exit"  # the teardown at the script's end, not a collective of training
    if "distributed/checkpoint/utils.py" in text:
        return None  # DCP's own coordination (its all_reduce of every rank's result) is
        # part of the save or load around it, whose frames say which
    if name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
                "all_to_all", "all_gather_into_tensor", "reduce_scatter_tensor", "wait",
                "send", "recv", "monitored_barrier", "_sync_params_and_buffers",
                "_verify_param_shape_across_processes", "allreduce_hook") \
            or "distributed_c10d.py" in text:
        return "collective"
    if name in ("_engine_run_backward", "run_backward", "backward"):
        # DDP's gradient all-reduce runs inside backward: a rank stuck there waits (a
        # frame named backward is `loss.backward()` itself, or a wrapper held in it)
        return "collective"
    if "dataloader.py" in text or "worker.py" in text and "data" in text:
        return "data"
    if "rendezvous" in text or name in ("init_process_group", "init_distributed"):
        return "init"
    return None


def collective_of_frames(frames: tuple[str, ...] | list[str]) -> str | None:
    for frame in reversed(list(frames)):
        name = function_of(frame)
        if name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
                    "all_to_all", "all_gather_into_tensor", "reduce_scatter_tensor", "send",
                    "recv", "monitored_barrier"):
            return name
    return None


# torchrun's folder per worker (--log-dir, TORCHELASTIC_ERROR_FILE): attempt, local rank
ATTEMPT_PATH = re.compile(r"attempt_(\d+)/(\d+)/[^/]*$")


def worker_of(name: str) -> tuple[int, int] | None:
    """(attempt, local rank) of a file in torchrun's folder per worker
    (`.../attempt_1/0/stderr.log`): what its untagged lines belong to."""
    m = ATTEMPT_PATH.search(name)
    return (int(m.group(1)), int(m.group(2))) if m else None
