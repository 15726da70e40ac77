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
                                     time=slurm_time(row.get("End")),
                                     host=row.get("NodeList") or None,
                                     detail=f"job {row.get('JobID', '?')}: {state}",
                                     extra={"job_step": "." in row.get("JobID", "")}))
        return found


# slurmstepd's line where it ends a job or a step: the reason, or none (scancel)
CANCELLED = re.compile(r"\*\*\* (?:JOB|STEP) (\S+) ON (\S+) CANCELLED AT (\S+)"
                       r"(?: DUE TO ([A-Z ]+?)(?:,|\s*\*\*\*|$))?")
DUE_TO = {"NODE FAILURE": "NODE_FAIL", "PREEMPTION": "PREEMPTED", "TIME LIMIT": "TIMEOUT",
          None: "CANCELLED"}
NODE_FAILURE = re.compile(r"srun: error: Node failure on (\S+)")
# srun's word on each task that ended badly: "srun: error: n2: task 1: Terminated",
# "srun: error: n1: task 0: Exited with exit code 1", "... task 3: Killed"
TASK_ENDED = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (Terminated|Killed|"
                        r"Exited with exit code (\d+)|Segmentation fault|Aborted)")
TASK_SIGNALS = {"Terminated": "SIGTERM", "Killed": "SIGKILL",
                "Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT"}
# "Detected 1 oom_kill event in StepId=4242.0." (newer), "Detected 2 oom-kill event(s) in
# step 4242.batch cgroup." (older)
OOM_EVENTS = re.compile(r"slurmstepd: error: Detected \d+ oom[-_ ]kill event(?:s|\(s\))? in"
                        r" (?:step )?(\S+?)\.?(?:\s|$)")


class SlurmOutput(Reader):
    name = "slurmout"
    summary = "what slurmstepd and srun write into a job's output (node failure, preemption," \
              " time limit, OOM kill)"

    def sniff(self, data: bytes, name: str) -> bool:
        return text.says_any(data, CANCELLED, NODE_FAILURE, OOM_EVENTS, TASK_ENDED)

    def read(self, data: bytes, name: str) -> list[Observation]:
        found = []
        for number, line in enumerate(text.decode(data).splitlines(), 1):
            where = Source(name, number)
            if m := CANCELLED.search(line):
                state = DUE_TO.get(m.group(4), "CANCELLED")
                found.append(Observation(STATES[state], where, reason=state,
                                         time=slurm_time(m.group(3)),
                                         detail=f"job {m.group(1)}: {state}"))
            elif m := NODE_FAILURE.search(line):
                found.append(Observation("node_lost", where, reason="NODE_FAIL",
                                         host=m.group(1), detail=f"node {m.group(1)} failed"))
            elif m := OOM_EVENTS.search(line):
                found.append(Observation("oom_kill", where, reason="OUT_OF_MEMORY",
                                         detail=f"{m.group(1)}: OOM killed"))
            elif m := TASK_ENDED.search(line):
                # a task is a rank where srun starts the ranks, a node's torchrun where
                # it starts one per node: its number is no rank
                code = int(m.group(4)) if m.group(4) else None
                found.append(Observation("exit", where, host=m.group(1), exitcode=code,
                                         signal=TASK_SIGNALS.get(m.group(3)),
                                         extra={"task": int(m.group(2)), "by": "srun",
                                                "line": line.strip()[:200]}))
        return found


# `scontrol show job JOB`: a record of `Key=Value` fields over indented lines, one record
# per job (or array task), records apart by a blank line:
#
#     JobId=1 JobName=train
#        JobState=TIMEOUT Reason=TimeLimit Dependency=(null)
#        Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15
#        RunTime=00:01:27 TimeLimit=00:01:00 TimeMin=N/A
#        StartTime=2026-12-02T03:23:57 EndTime=2026-12-02T03:25:24 Deadline=N/A
#        NodeList=n[1-2]
#
# (`-o` puts a record on one line.) A requeued job's record is its newest attempt's:
# PENDING or RUNNING with Restarts=N; what ended the attempts before is sacct's (-D) and
# slurmctld's word.
SCONTROL_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)")
SCONTROL_START = re.compile(r"^JobId=(\d+)(?:\s|$)")
SLURM_TIME = "%Y-%m-%dT%H:%M:%S"


def slurm_time(value: str | None) -> float | None:
    """Seconds since the epoch of a time Slurm prints (local time, no zone), or None."""
    import time as _time

    try:
        return _time.mktime(_time.strptime(value or "", SLURM_TIME))
    except ValueError:
        return None


def duration(value: str | None) -> float | None:
    """Seconds of a Slurm duration: [days-]hours:minutes:seconds, minutes:seconds."""
    m = re.match(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$", value or "")
    if m is None:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


class ScontrolJob(Reader):
    name = "scontrol"
    summary = "`scontrol show job`: the job's state, reason, restarts, limits and times"
    structured = True

    def sniff(self, data: bytes, name: str) -> bool:
        body = text.text_of(data)
        return body is not None and bool(SCONTROL_START.match(body.lstrip())) \
            and "JobState=" in body

    def read(self, data: bytes, name: str) -> list[Observation]:
        found = []
        record: dict[str, str] = {}
        lines: dict[str, int] = {}
        for number, line in enumerate(text.decode(data).splitlines() + [""], 1):
            if SCONTROL_START.match(line.strip()) and record or not line.strip():
                if record:
                    found.append(_job_record(record, lines, name))
                record, lines = {}, {}
            for key, value in SCONTROL_FIELD.findall(line):
                record.setdefault(key, value)
                lines.setdefault(key, number)
        if not found:
            raise BadArtefact("no JobState in a scontrol record")
        return found


def _job_record(record: dict[str, str], lines: dict[str, int], name: str) -> Observation:
    state = record.get("JobState", "")
    if not state:
        raise BadArtefact(f"job {record.get('JobId', '?')}: a scontrol record without JobState")
    code = signal = None
    if m := EXIT.match(record.get("ExitCode", "")):
        code = int(m.group(1))
        signal = SIGNALS.get(int(m.group(2))) if int(m.group(2)) else None
    job = record.get("JobId", "?")
    if record.get("ArrayJobId") and record.get("ArrayTaskId"):
        job = f"{record['ArrayJobId']}_{record['ArrayTaskId']}"
    restarts = int(record["Restarts"]) if record.get("Restarts", "").isdigit() else 0
    what = STATES.get(state, "job_state")
    return Observation(
        what, Source(name, lines.get("JobState")), reason=state, exitcode=code,
        signal=signal, host=record.get("NodeList") or None,
        time=slurm_time(record.get("EndTime")),
        detail=f"job {job}: {state} ({record.get('Reason', 'no reason')})"
               + (f", requeued {restarts} time(s)" if restarts else ""),
        extra={"job": job, "restarts": restarts, "scheduler_reason": record.get("Reason"),
               "start": slurm_time(record.get("StartTime")),
               "time_limit": duration(record.get("TimeLimit")),
               "run_time": duration(record.get("RunTime")),
               # the batch script the job ran, and where: the script it names is the
               # one a replay runs
               **({"batch_script": record["Command"]} if record.get("Command") else {}),
               **({"workdir": record["WorkDir"]} if record.get("WorkDir") else {})})


# slurmctld's log lines about a job's end, as a site's admin hands them over:
#     [2026-12-02T03:25:24.030] Time limit exhausted for JobId=1
#     [2026-12-02T02:50:51.960] requeue job JobId=3 due to failure of node n1
#     [2026-12-02T02:50:51.960] error: Nodes n1 not responding, setting DOWN
#     [...] preempted JobId=7 has been requeued to reclaim resources for JobId=8
CTLD_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?\] (.*)$")
CTLD_EVENTS = (
    (re.compile(r"Time limit exhausted for JobId=(\S+)"), "job_state", "TIMEOUT"),
    (re.compile(r"requeue job JobId=(\S+) due to failure of node (\S+)"), "node_lost",
     "NODE_FAIL"),
    (re.compile(r"(?:Nodes?|node) (\S+) not responding, setting DOWN()"), "node_lost",
     "NODE_DOWN"),
    (re.compile(r"preempted JobId=(\S+) has been requeued to reclaim resources for"
                r" JobId=(\S+)"), "node_lost", "PREEMPTED"),
    (re.compile(r"job_time_limit: Preemption GraceTime reached JobId=(\S+)()"), "node_lost",
     "PREEMPTED"),
)


class SlurmctldLog(Reader):
    name = "slurmctld"
    summary = "slurmctld's log lines: time limits, node failures, requeues, preemptions"

    def sniff(self, data: bytes, name: str) -> bool:
        body = text.text_of(data)
        if body is None:
            return False
        # its lines about jobs, whichever they are ("sched: Allocate JobId=1 ...")
        return any(CTLD_LINE.match(line) and ("JobId=" in line or any(
            p.search(line) for p, _, _ in CTLD_EVENTS)) for line in body.splitlines()[:20000])

    def read(self, data: bytes, name: str) -> list[Observation]:
        found = []
        for number, line in enumerate(text.decode(data).splitlines(), 1):
            stamp = CTLD_LINE.match(line)
            if stamp is None:
                continue
            for pattern, what, reason in CTLD_EVENTS:
                if m := pattern.search(stamp.group(2)):
                    node = m.group(2) if reason == "NODE_FAIL" else (
                        m.group(1) if reason == "NODE_DOWN" else None)
                    found.append(Observation(
                        what, Source(name, number), reason=reason, host=node,
                        time=slurm_time(stamp.group(1)), detail=stamp.group(2).strip()[:200],
                        extra={"job": m.group(1) if reason != "NODE_DOWN" else None,
                               "scheduler": "slurmctld"}))
                    break
        return found
