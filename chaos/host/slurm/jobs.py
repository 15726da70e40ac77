"""The client side: submit a job, read its record, wait for a state, cancel it.

Works on any Slurm the environment names (`SLURM_CONF`, or the site's default),
the local cluster's or a site's. A refusal by the cluster (no such partition,
resources no node has, a time over the partition's limit) is the user's to fix:
a `UsageError` with sbatch's own words, raised before anything is queued.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping

from torchchaos.errors import CannotJudge, UsageError

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
         "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
REVOKED_SECONDS = 2.0  # a requeued job started sooner may meet its own revoked credential
FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)")


def _client(command: list[str], environ: Mapping[str, str] | None,
            timeout: float = 30.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(environ or {})})
    except FileNotFoundError:
        raise UsageError(f"Slurm is not installed here: {command[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise CannotJudge(f"{command[0]} got no answer from slurmctld within"
                          f" {timeout:.0f} s (is it running?)") from None


def submit(script: str, options: list[str], environ: Mapping[str, str] | None = None,
           arguments: list[str] | None = None) -> int:
    """The job id of `sbatch OPTIONS SCRIPT ARGUMENTS`; a refusal is a UsageError."""
    return _sbatch([*options, script, *(arguments or [])], environ)


def submit_command(command: list[str], options: list[str],
                   environ: Mapping[str, str] | None = None) -> int:
    """The job id of `sbatch OPTIONS --wrap COMMAND`; a refusal is a UsageError."""
    return _sbatch([*options, "--wrap", shlex.join(command)], environ)


def _sbatch(arguments: list[str], environ: Mapping[str, str] | None) -> int:
    done = _client(["sbatch", "--parsable", *arguments], environ)
    if done.returncode != 0:
        raise UsageError(f"the cluster refused the job: {_said(done)}")
    return int(done.stdout.strip().split(";")[0])


def hostnames(nodelist: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """A node list (`n[1,3]`) as its host names, in Slurm's order."""
    done = _client(["scontrol", "show", "hostnames", nodelist], environ)
    return done.stdout.split() if done.returncode == 0 else []


def show(job: int | str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`scontrol show job -o JOB` as fields (JobState, Reason, Restarts, NodeList, ...);
    an array job gives its first task's. Empty once slurmctld forgot the job."""
    done = _client(["scontrol", "show", "job", "-o", str(job)], environ)
    if done.returncode != 0 or not done.stdout.strip():
        return {}
    return dict(FIELD.findall(done.stdout.splitlines()[0]))


def states(job: int | str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The state of every record of the job (an array: one per task)."""
    done = _client(["scontrol", "show", "job", "-o", str(job)], environ)
    if done.returncode != 0:
        return []
    return [dict(FIELD.findall(line)).get("JobState", "") for line in done.stdout.splitlines()
            if line.strip()]


def wait_for(job: int | str, ready: Callable[[dict[str, str]], bool], timeout: float,
             environ: Mapping[str, str] | None = None, what: str = "the state asked for",
             poll: float = 0.5) -> dict[str, str]:
    """Poll the job's record until `ready(record)`; CannotJudge after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        record = show(job, environ)
        if record and ready(record):
            return record
        if time.monotonic() > deadline:
            state = record.get("JobState", "unknown") if record else "no longer known"
            reason = record.get("Reason", "") if record else ""
            raise CannotJudge(f"job {job} did not reach {what} within {timeout:.0f} s"
                              f" (it is {state}{', ' + reason if reason else ''})")
        time.sleep(poll)


def wait_ended(job: int | str, timeout: float, environ: Mapping[str, str] | None = None,
               poll: float = 0.5) -> list[str]:
    """Wait until every record of the job ended; their states."""
    deadline = time.monotonic() + timeout
    while True:
        found = states(job, environ)
        if found and all(s in ENDED for s in found):
            return found
        if time.monotonic() > deadline:
            raise CannotJudge(f"job {job} did not end within {timeout:.0f} s"
                              f" ({', '.join(found) or 'no record'})")
        time.sleep(poll)


def release(job: int | str, timeout: float = 60.0,
            environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Start a requeued job now, once its requeue is done (PENDING again): Slurm holds a
    requeued batch job until the credentials of its last try expired (its EligibleTime:
    the requeue's time + `AuthInfo=cred_expire` + 1 s; 121 s by default, 11 s on the local
    cluster). A test does not wait for that; a site's job does. Returns the job's record
    once it no longer waits for its begin time."""
    def held(record: dict[str, str]) -> bool:
        return record.get("JobState") == "PENDING" and record.get("Reason") == "BeginTime"

    def started_again(record: dict[str, str]) -> bool:
        return record.get("JobState") == "RUNNING" and record.get("Restarts", "0") != "0"

    jobs_record = wait_for(job, lambda r: held(r) or started_again(r), timeout, environ,
                           "PENDING after its requeue")
    # started in the second its credential was revoked (at the requeue), the job dies at
    # once: "Killing non-startable batch job ... Job credential revoked" (seen here, 22.05)
    time.sleep(REVOKED_SECONDS)
    while held(jobs_record):
        _client(["scontrol", "update", f"JobId={job}", "StartTime=now"], environ)
        time.sleep(0.5)
        jobs_record = show(job, environ)
    return jobs_record


def cancel(job: int | str, environ: Mapping[str, str] | None = None,
           signal: str | None = None, steps_only: bool = False) -> None:
    """scancel: end the job, or send it `signal` (to its batch shell and steps, or to its
    steps only, as `--signal=SIG@SECONDS` without `B:` does ahead of a time limit)."""
    where = [] if steps_only else ["--full"]
    command = ["scancel", *([f"--signal={signal}", *where] if signal else []), str(job)]
    _client(command, environ)


def _said(done: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    text = lines[-1] if lines else f"exit status {done.returncode}"
    return text.removeprefix("sbatch: error: ")
