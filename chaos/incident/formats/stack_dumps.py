"""Where a rank was: py-spy dumps and Python's faulthandler tracebacks.

py-spy (`py-spy dump --pid N`):

    Process 3233: python train.py
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 3233 (active): "MainThread"
        all_reduce (torch/distributed/distributed_c10d.py:3252)
        main (train.py:16)

faulthandler (a fatal signal, or `faulthandler.dump_traceback`):

    Fatal Python error: Segmentation fault

    Current thread 0x00007f... (most recent call first):
      File "/tmp/t.py", line 14 in main

A dump py-spy could not take is read too: its "Error: Failed to get stack traces"
(with "Failed to suspend process ... unexpected waitpid result ... SIGSTOP" where the
process was stopped) is a stack with no frame, of a rank that was outside every
collective: a stopped process, or one py-spy could not read.

The rank is the lines' tag, the file name's (`rank-1...`, `rank1`, `stacks_1.txt`) or,
in torchrun's `--log-dir` layout (`attempt_0/1/stderr.log`), its folder's local rank.
"""

from __future__ import annotations

import re

from torchchaos.incident.formats import text
from torchchaos.incident.observations import (
    Observation,
    Source,
    collective_of_frames,
    phase_of_frames,
    worker_of,
)
from torchchaos.incident.readers import Reader

PYSPY_PROCESS = re.compile(r"^Process (\d+): (.*)$")
PYSPY_THREAD = re.compile(r'^Thread (?:0x)?[0-9a-fA-F]+ \((\w+)[^)]*\): "([^"]*)"')
PYSPY_FRAME = re.compile(r"^\s+(\S+) \(([^)]+)\)\s*$")
# py-spy's own failure: its error, and the causes it lists under it
PYSPY_FAILED = re.compile(r"^Error: (.+)$(?:\s*\n\s*Caused by:\s*\n((?:\s+\d+: .*\n?)+))?",
                          re.M)
# anywhere in a line: another process's output may run into it ("loss 0.03Fatal Python
# error: " with the reason on the next line, as seen in a real log here)
FATAL = re.compile(r"Fatal Python error: ?(.*)$")
FH_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):")
FH_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)')
# A rank in a file's name: "rank-1", "rank1", or a trailing number where the name says
# the file holds stacks ("stacks_1.txt", "pyspy.1.dump"). Not any trailing number: a
# launcher's log is "launch-0-node-0.log", and its untagged faulthandler dump is not
# rank 0's (a crash of rank 1 was read as rank 0's so).
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)|(?:stack|dump|spy|trace|fault)\w*[-_.](\d+)"
                          r"\.(?:txt|log|dump)$", re.I)
SIGNAL_OF_FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                   "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


class Stacks(Reader):
    name = "stacks"
    summary = "py-spy dumps and faulthandler tracebacks: where each rank was stuck or crashed"

    def sniff(self, data: bytes, name: str) -> bool:
        body = text.text_of(data)
        if body is None:
            return False
        return bool(re.search(r"^Process \d+: .*\nPython v", body, re.M)
                    or re.search(r"\(most recent call first\):", body)
                    or "Fatal Python error" in body or PYSPY_FAILED.search(body))

    def read(self, data: bytes, name: str) -> list[Observation]:
        base = name.rsplit("/", 1)[-1]
        body = text.decode(data)
        m = RANK_IN_NAME.search(base)
        file_rank = int(m.group(1) or m.group(2)) if m else None
        if m and m.group(2) and re.search(rf"^Process {file_rank}:", body, re.M):
            file_rank = None  # `py-spy dump --pid $p > pyspy_$p.txt`: the number is the pid
        if file_rank is None and (worker := worker_of(name)):
            file_rank = worker[1]
        streams: dict[int | None, list[tuple[int, str]]] = {}
        for number, line in enumerate(body.splitlines(), 1):
            rank, said, _ = text.split_tag(line)
            streams.setdefault(rank if rank is not None else file_rank, []).append((number, said))
        found: list[Observation] = []
        for rank, stream in streams.items():
            found += _pyspy(stream, rank, name) + _faulthandler(stream, rank, name)
        return found


def _pyspy(stream: list[tuple[int, str]], rank: int | None, name: str) -> list[Observation]:
    """Each process's main thread's stack (or its first thread's, where none is named so),
    and each process py-spy could not dump."""
    chosen: dict[int | None, Observation] = {}
    pid, command, i = None, "", 0
    while i < len(stream):
        number, line = stream[i]
        i += 1
        if m := PYSPY_PROCESS.match(line):
            pid, command = int(m.group(1)), m.group(2)
            continue
        if line.startswith("Error: ") and pid not in chosen:
            chosen[pid] = _failed_dump(stream, i - 1, rank, pid, command, name)
            continue
        thread = PYSPY_THREAD.match(line)
        if not thread:
            continue
        frames = []
        while i < len(stream) and (f := PYSPY_FRAME.match(stream[i][1])):
            frames.append(f"{f.group(1)} ({f.group(2)})")
            i += 1
        frames.reverse()  # py-spy prints the innermost first
        main = thread.group(2) == "MainThread"
        if pid in chosen and not main:
            continue
        chosen[pid] = Observation("stack", Source(name, number), rank=rank, pid=pid,
                                  frames=tuple(frames), phase=phase_of_frames(frames),
                                  collective=collective_of_frames(frames),
                                  detail=f"py-spy: thread {thread.group(2)!r}"
                                         f" ({thread.group(1)})",
                                  extra={"command": command})
    return list(chosen.values())


def _failed_dump(stream: list[tuple[int, str]], at: int, rank: int | None, pid: int | None,
                 command: str, name: str) -> Observation:
    """A process py-spy could not dump: its error and causes; "stopped" where they say it
    could not suspend a process already stopped (SIGSTOP)."""
    number = stream[at][0]
    said = [stream[at][1].removeprefix("Error: ").strip()]
    for _n, line in stream[at + 1:at + 12]:
        if m := re.match(r"^\s+\d+: (.*)$", line):
            said.append(m.group(1).strip())
        elif line.strip().startswith("Stack backtrace"):
            break
    why = "; ".join(said)
    stopped = "suspend" in why and "SIGSTOP" in why
    return Observation("stack", Source(name, number), rank=rank, pid=pid, frames=(),
                       detail=f"py-spy could not dump it: {why[:200]}",
                       extra={"command": command, "dump_failed": True, "stopped": stopped})


def _faulthandler(stream: list[tuple[int, str]], rank: int | None,
                  name: str) -> list[Observation]:
    found: list[Observation] = []
    fatal: tuple[int, str] | None = None
    i = 0
    while i < len(stream):
        number, line = stream[i]
        if m := FATAL.search(line):
            said = m.group(1).strip()
            if not said and i + 1 < len(stream):
                said = stream[i + 1][1].strip()
            fatal = (number, said)
        elif m := FH_THREAD.match(line):
            frames, j = [], i + 1
            while j < len(stream) and (f := FH_FRAME.match(stream[j][1])):
                short = f.group(1).split("/")[-1]
                frames.append(f"{f.group(3)} ({short}:{f.group(2)})")
                j += 1
            frames.reverse()
            if m.group(1) == "Current thread" or not found:
                signal = SIGNAL_OF_FATAL.get(fatal[1]) if fatal else None
                what = "exit" if signal else "stack"
                detail = f"faulthandler: {fatal[1]}" if fatal else "faulthandler: stacks dumped"
                found.append(Observation(what, Source(name, fatal[0] if fatal else number),
                                         rank=rank, signal=signal, frames=tuple(frames),
                                         phase=phase_of_frames(frames), detail=detail,
                                         collective=collective_of_frames(frames)))
                fatal = None
            i = j
            continue
        i += 1
    return found
