"""Slurm's word on a job: `sacct` output, and the lines Slurm writes into its output file.

`sacct`, parsable (`-P`, `|` between fields) or in columns:

    JobID|JobName|State|ExitCode|NodeList
    4242|train|NODE_FAIL|0:0|gpu[01-02]
    4242.0|python|CANCELLED|0:9|gpu01

`State` (NODE_FAIL, OUT_OF_MEMORY, TIMEOUT, PREEMPTED, FAILED, CANCELLED,
COMPLETED) and `ExitCode` (`code:signal`) are what is read.

What slurmstepd and srun print among the job's own lines (slurm-4242.out):

    srun: error: Node failure on gpu-b
    slurmstepd: error: *** JOB 4242 ON gpu-a CANCELLED AT 2024-05-01T12:05:09 DUE TO NODE
      FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***
    slurmstepd: error: *** STEP 4242.0 ON gpu-a CANCELLED AT ... DUE TO PREEMPTION ***
    slurmstepd: error: *** JOB 4242 ON gpu-a CANCELLED AT ... DUE TO TIME LIMIT ***
    slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks
      have been OOM Killed.
"""

from __future__ import annotations

import re

from torchchaos.incident.formats import text
from torchchaos.incident.observations import SIGNALS, Observation, Source
from torchchaos.incident.readers import BadArtefact, Reader

STATES = {"NODE_FAIL": "node_lost", "PREEMPTED": "node_lost", "OUT_OF_MEMORY": "oom_kill",
          "TIMEOUT": "job_state", "FAILED": "job_state", "CANCELLED": "job_state",
          "COMPLETED": "job_state", "BOOT_FAIL": "node_lost", "DEADLINE": "job_state"}
EXIT = re.compile(r"^(\d+):(\d+)$")


class Sacct(Reader):
    name = "slurm"
    summary = "Slurm's sacct output (parsable with -P, or in columns)"
    structured = True

    def sniff(self, data: bytes, name: str) -> bool:
        body = text.text_of(data)
        if body is None:
            return False
        first = body.lstrip().split("\n", 1)[0]
        return bool(re.match(r"^\s*JobID\b", first)) and "State" in first

    def read(self, data: bytes, name: str) -> list[Observation]:
        lines = text.decode(data).splitlines()
        header_at = next(i for i, line in enumerate(lines) if line.strip())
        header = lines[header_at]
        if "|" in header:
            names = header.split("|")
            rows = [(i, line.split("|")) for i, line in enumerate(lines) if i > header_at
                    and line.strip()]
        else:
            names = header.split()
            rows = [(i, line.split()) for i, line in enumerate(lines) if i > header_at
                    and line.strip() and not set(line.strip()) <= {"-", " "}]
        if "State" not in names:
            raise BadArtefact("sacct output without a State column")
        found = []
        for i, cells in rows:
            if len(cells) < len(names) and "|" in header:
                raise BadArtefact(f"line {i + 1} has {len(cells)} fields, the header"
                                  f" {len(names)}: cut off?")
            row = dict(zip(names, cells))
            state = row.get("State", "").split()[0] if row.get("State") else ""
            if state.endswith("+"):  # sacct cuts a state to its column: OUT_OF_ME+
                state = next((s for s in STATES if s.startswith(state[:-1])), state)
            if state not in STATES:
                continue
            code = signal = None
            if m := EXIT.match(row.get("ExitCode", "")):
                code = int(m.group(1))
                signal = SIGNALS.get(int(m.group(2))) if int(m.group(2)) else None
            found.append(Observation(STATES[state], Source(name, i + 1), reason=state,
                                     exitcode=code, signal=signal,
                                     host=row.get("NodeList") or None,
                                     detail=f"job {row.get('JobID', '?')}: {state}",
                                     extra={"job_step": "." in row.get("JobID", "")}))
        return found


# slurmstepd's line where it ends a job or a step: the reason, or none (scancel)
CANCELLED = re.compile(r"\*\*\* (?:JOB|STEP) (\S+) ON (\S+) CANCELLED AT \S+"
                       r"(?: DUE TO ([A-Z ]+?)(?:,|\s*\*\*\*|$))?")
DUE_TO = {"NODE FAILURE": "NODE_FAIL", "PREEMPTION": "PREEMPTED", "TIME LIMIT": "TIMEOUT",
          None: "CANCELLED"}
NODE_FAILURE = re.compile(r"srun: error: Node failure on (\S+)")
# "Detected 1 oom_kill event in StepId=4242.0." (newer), "Detected 2 oom-kill event(s) in
# step 4242.batch cgroup." (older)
OOM_EVENTS = re.compile(r"slurmstepd: error: Detected \d+ oom[-_ ]kill event(?:s|\(s\))? in"
                        r" (?:step )?(\S+?)\.?(?:\s|$)")


class SlurmOutput(Reader):
    name = "slurmout"
    summary = "what slurmstepd and srun write into a job's output (node failure, preemption," \
              " time limit, OOM kill)"

    def sniff(self, data: bytes, name: str) -> bool:
        return text.says_any(data, CANCELLED, NODE_FAILURE, OOM_EVENTS)

    def read(self, data: bytes, name: str) -> list[Observation]:
        found = []
        for number, line in enumerate(text.decode(data).splitlines(), 1):
            where = Source(name, number)
            if m := CANCELLED.search(line):
                state = DUE_TO.get(m.group(3), "CANCELLED")
                found.append(Observation(STATES[state], where, reason=state,
                                         detail=f"job {m.group(1)}: {state}"))
            elif m := NODE_FAILURE.search(line):
                found.append(Observation("node_lost", where, reason="NODE_FAIL",
                                         host=m.group(1), detail=f"node {m.group(1)} failed"))
            elif m := OOM_EVENTS.search(line):
                found.append(Observation("oom_kill", where, reason="OUT_OF_MEMORY",
                                         detail=f"{m.group(1)}: OOM killed"))
        return found
