"""What one observation, or a log's lines, say to every rule: an echo of another rank's
failure or an error of a rank's own, an error a checkpoint that does not load raises, the
saves a log said done."""

from __future__ import annotations

import math
import re

from torchchaos.incident.observations import Observation
from torchchaos.log_lines import PEER_LOST

FATAL = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL")


# An error that reports another rank's failure, not one of its own. The last line is
# torchchaos's own hang fault releasing a held rank when its peer exits.
ECHO = re.compile(PEER_LOST.pattern + r"|Timed out waiting|Watchdog caught|"
                  r"Application timeout caused pair closure|"
                  r"exited while this rank was in|"
                  r"Signal \d+ \(SIG\w+\) received|ChildFailedError|ProcessExitedException|"
                  r"SignalException|KeyboardInterrupt|NCCL communicator was aborted|"
                  r"DistBackendError|DistNetworkError|ncclRemoteError|the remote worker|"
                  # DCP's wrapper of the failed ranks' own errors, which it relays after it
                  r"CheckpointException ranks:",
                  re.I)


# a word of a line that may be a path: "ckpt/checkpoint-10", '/runs/model.pt' (its last
# part is matched against the checkpoint folder's files and folders)
PATH_WORD = re.compile(r"[^\s'\"(),;]+")


LOAD_ERROR = re.compile(r"PytorchStreamReader|central directory|Ran out of input|"
                        r"invalid load key|unpickling|checksum|sha256|corrupt|truncated|"
                        r"safetensors|UnpicklingError|EOFError", re.I)


def a_load_error(e: Observation) -> bool:
    """An error raised loading a checkpoint: in a load's frames, or with a message a
    checkpoint that does not load raises, unless its frames are the data pipeline's (a
    truncated image, a corrupt sample)."""
    return e.phase == "load" or bool(LOAD_ERROR.search(e.detail)) and e.phase != "data"


# A restart's error that says the checkpoint it read is bad or not there: a file that
# does not load, a missing file or key, a state that does not fit the model
BAD_DATA = re.compile(LOAD_ERROR.pattern + r"|FileNotFoundError|No such file|KeyError|"
                      r"Missing key|Unexpected key|size mismatch|JSONDecodeError|"
                      r"valid checkpoint", re.I)  # the Trainer: "Can't find a valid checkpoint"


def is_failure(o: Observation, stopped: set[int | None]) -> bool:
    if o.what in ("collective_timeout", "peer_lost", "oom_kill", "node_lost"):
        return True
    if o.what == "exit":
        return o.reason != "stopped by the launcher" and o.pid not in stopped and \
            (o.signal is not None or bool(o.exitcode))
    return o.what == "error" and not ECHO.search(o.detail) and not _deliberate_exit(o)


def _deliberate_exit(o: Observation) -> bool:
    """A SystemExit's traceback (a SIGTERM handler's `sys.exit(143)` that landed in an
    atexit callback, which Python prints as "Exception ignored"): no error of the rank's,
    whose exit status the launcher tells."""
    return o.detail.startswith("SystemExit")


def own_errors(obs: list[Observation]) -> list[Observation]:
    return [o for o in obs if o.what in ("error", "exit") and o.detail
            and not ECHO.search(o.detail) and not o.detail.startswith(("faulthandler", "Signal"))
            and not _deliberate_exit(o) and ":" in o.detail
            and o.reason != "stopped by the launcher" and not _survived(o, obs)]


def _survived(error: Observation, obs: list[Observation]) -> bool:
    """A traceback the script printed and went on from (a bad sample it logged and
    skipped): its log says the run finished after it, with no launcher's word of a failed
    worker between."""
    if error.what != "error" or error.source.line is None:
        return False
    after = [o for o in obs if o.source.file == error.source.file
             and (o.source.line or 0) > error.source.line]
    finished = min((o.source.line for o in after if o.what == "job_state"
                    and o.reason == "finished"), default=None)
    return finished is not None and not any(
        o.what == "exit" and "local_rank" in o.extra and o.source.line < finished for o in after)


# a save the log says is done (not one begun: "saving checkpoint to ..."), as "saved
# checkpoint ...", "checkpoint ... committed", "Finished saving the checkpoint in 0.05 s"
SAVE_DONE = re.compile(r"\b(saved|wrote|written|committed|finished|completed?)\b", re.I)


def save_number(step: int | None, interval: int | None) -> int | None:
    """Which save of a launch that started at step 0 the save of `step` is, where saves
    come every `interval` steps; None where either is not known."""
    if step is None or not interval or step % interval:
        return None
    return step // interval


def saves_said_done(obs: list[Observation], log: str) -> list[Observation]:
    """The lines of `log` that say a save is done, in the log's order."""
    return sorted((o for o in obs if o.what == "save" and o.source.file == log
                   and SAVE_DONE.search(o.detail)), key=lambda o: o.source.line or 0)


def saves_in(obs: list[Observation], log: str):
    """([(step, line)] of the saves `log` says are done, the save it began last and never
    said done, or None). A done line with no step of its own finishes the save begun
    just before it ("Saving the checkpoint at step 10 ...", then "Finished saving the
    checkpoint in 0.05 seconds")."""
    done, begun = [], None
    lines = sorted((o for o in obs if o.what == "save" and o.source.file == log),
                   key=lambda o: o.source.line or 0)
    for o in lines:
        if not SAVE_DONE.search(o.detail):
            begun = o
            continue
        step = o.step if o.step is not None else begun.step if begun is not None else None
        if step is not None:
            done.append((step, o))
        begun = None
    return done, begun


def writer_rank(obs: list[Observation]) -> int | None:
    """The rank that writes checkpoints: the lowest that logged a save; None if none did."""
    return min((o.rank for o in obs if o.what == "save" and o.rank is not None), default=None)


def save_interval(obs: list[Observation]) -> int | None:
    """Steps between checkpoints, from the steps the checkpoint files and save lines name
    (their greatest common divisor); None where fewer than two are known."""
    steps = sorted({o.step for o in obs if o.what in ("checkpoint", "save")
                    and o.step is not None and o.step > 0})
    if len(steps) < 2:
        return None
    return math.gcd(*steps) or None


# torch's destroy_process_group when the default group is already gone: a group aborted
# under a rank that trained on (DDP keeps its own handle) is found missing at the end
TEARDOWN_FOUND_NONE = re.compile(r"Process group cannot be None")


def stepped_first(candidates: list[Observation], obs: list[Observation]) -> list[Observation]:
    """`candidates`, those in a log with step lines first: of two records of one event
    (slurmstepd's line in the job's output, `scontrol show job`'s JobState), the one among
    the steps places it after them."""
    stepped = {o.source.file for o in obs if o.what == "step"}
    return sorted(candidates, key=lambda o: o.source.file not in stepped)
