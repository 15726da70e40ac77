"""torchrun's own log: worker exits, restarts, the ChildFailedError summary, rank tracebacks.

The lines read, as torch.distributed.elastic writes them:

    E1126 20:27:13.204000 3193 .../api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 3197)
      of binary: ...
    W1126 20:27:13.171000 3193 .../api.py:1028] Sending process 3196 closing signal SIGTERM
    W1128 11:08:04.721000 3436 .../api.py:937] Closing process 3447 via signal SIGTERM
    W1128 13:59:16.129000 16673 .../multiprocessing/spawn.py:165] Terminating process 16676
      via signal SIGTERM
    W0615 09:00:00.000000 1 .../agent/server/api.py:704] Received Signals.SIGTERM death
      signal, shutting down workers (the launcher's own, from outside)
      (its multiprocessing mode, a function under elastic_launch: a forked worker's peer
      is stopped by one or the other, by torch's version and whether the worker died)
    I... [default] Worker group FAILED. 3/3 attempts left; will restart worker group
    torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    ...
    Root Cause (first observed failure):
    [0]:
      time      : 2026-11-26_20:26:33
      host      : localhost
      rank      : 1 (local_rank: 1)
      exitcode  : -9 (pid: 2809)  (SIGKILL)
      error_file: <N/A>
      traceback : Signal 9 (SIGKILL) received by PID 2809

and each rank's traceback as torch tags it (`[rank1]: Traceback ...`).
"""

from __future__ import annotations

import dataclasses
import re
import time as _time

from torchchaos.incident.formats import text
from torchchaos.incident.observations import (
    Observation,
    Source,
    phase_of_frames,
    signal_of_exitcode,
    worker_of,
)
from torchchaos.incident.readers import Reader
from torchchaos.log_lines import AGENT_SIGNAL, CLOSING, FRAME, RESTART, SUMMARY_START, WORKER_FAILED

ENTRY = re.compile(r"^\[(\d+)\]:\s*$")
FIELD = re.compile(r"^\s{2}(time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
RANK_FIELD = re.compile(r"(\d+) \(local_rank: (\d+)\)")
EXIT_FIELD = re.compile(r"(-?\d+) \(pid: (\d+)\)")
MARKERS = (WORKER_FAILED, CLOSING, RESTART, SUMMARY_START, AGENT_SIGNAL)


class TorchrunLog(Reader):
    name = "torchrun"
    summary = "torchrun's log: worker exits, restarts, the failure summary, rank tracebacks"

    def sniff(self, data: bytes, name: str) -> bool:
        body = text.text_of(data)
        if body is None:
            return False
        return any(m.search(body) for m in MARKERS) or "Traceback" in body and (
            "[rank" in body or text.has_tagged_traceback(body)  # srun's, mpirun's tags
            or worker_of(name) is not None)  # a worker's stderr.log

    def read(self, data: bytes, name: str) -> list[Observation]:
        lines = text.decode(data).splitlines()
        summary = self._summary(lines, name)
        found = _global_ranks(self._launcher_lines(lines, name), summary)
        found += summary
        found += self._rank_tracebacks(lines, name)
        return found

    def _launcher_lines(self, lines: list[str], name: str) -> list[Observation]:
        found, attempt = [], 0
        for number, line in enumerate(lines, 1):
            where = Source(name, number)
            if m := WORKER_FAILED.search(line):
                code = int(m.group(1))
                found.append(Observation("exit", where, rank=int(m.group(2)), pid=int(m.group(3)),
                                         exitcode=code, signal=signal_of_exitcode(code),
                                         attempt=attempt, extra={"local_rank": int(m.group(2))}))
            elif m := CLOSING.search(line):
                found.append(Observation("exit", where, pid=int(m.group(1) or m.group(2)),
                                         signal=m.group(3),
                                         reason="stopped by the launcher", attempt=attempt))
            elif m := AGENT_SIGNAL.search(line):
                found.append(Observation("signal", where, signal=m.group(1), attempt=attempt,
                                         detail=f"torchrun received {m.group(1)}",
                                         extra={"launcher": True}))
            elif m := RESTART.search(line):
                found.append(Observation("restart", where, attempt=attempt,
                                         detail=f"worker group {m.group(1)}, {m.group(2)}/"
                                                f"{m.group(3)} attempts left"))
                attempt += 1
        return found

    def _summary(self, lines: list[str], name: str) -> list[Observation]:
        """Every entry of ChildFailedError's block; the root cause is marked."""
        found: list[Observation] = []
        start = next((i for i, line in enumerate(lines) if SUMMARY_START.search(line)), None)
        if start is None:
            return found
        root, entry, fields = False, None, {}
        script = next((m.group(1).rsplit("/", 1)[-1] for line in lines[start + 1:start + 4]
                       if (m := re.match(r"^(\S+) FAILED\s*$", line))), None)

        def close() -> None:
            if entry is not None and fields:
                found.append(_summary_entry(fields, Source(name, entry + 1), root, script))

        tb_lines: list[str] = []
        for i in range(start + 1, len(lines)):
            line = lines[i]
            if line.startswith("Root Cause"):
                close()
                entry, fields, root = None, {}, True
            elif ENTRY.match(line):
                close()
                entry, fields, tb_lines = i, {}, []
            elif line.startswith(("=====", "-----")):
                close()
                entry, fields = None, {}
            elif entry is not None:
                m = FIELD.match(line)
                if m and m.group(1) != "traceback" or m and not fields.get("traceback"):
                    fields[m.group(1)] = m.group(2).strip()
                    if m.group(1) == "traceback":
                        tb_lines = [m.group(2)]
                        fields["_tb"] = tb_lines
                elif "_tb" in fields:
                    tb_lines.append(line[2:] if line.startswith("  ") else line)
        close()
        return found

    def _rank_tracebacks(self, lines: list[str], name: str) -> list[Observation]:
        """Tracebacks a rank printed, tagged [rankN]: or not; torchrun's own (it ends in
        ChildFailedError) is not a rank's."""
        streams: dict[int | None, list[tuple[int, str]]] = {}
        heard: dict[int, int] = {}  # global rank -> the first line it printed
        attempt, worker = worker_of(name) or (None, None)
        for number, line in enumerate(lines, 1):
            rank, body, _ = text.split_tag(line)
            rank = worker if rank is None else rank  # torchrun --log-dir: the file's rank
            streams.setdefault(rank, []).append((number, body))
            if rank is not None and line.lstrip().startswith("[rank"):
                heard.setdefault(rank, number)
        found = []
        for rank, stream in streams.items():
            headers = dict(stream)
            for number, frames, last, code in text.tracebacks(stream):
                if "ChildFailedError" in last or any("elastic/" in f and "launch_agent" in f
                                                      for f in frames[-2:]):
                    continue
                # DCP relays each failed rank's traceback to every rank, headed "(RANK n)":
                # the error is rank n's own, whoever printed it
                relayed = RELAYED.search(headers.get(number, ""))
                extra = {"code": code} if code else {}
                if relayed:
                    extra["relayed_by"] = rank
                found.append(Observation("error", Source(name, number),
                                         rank=int(relayed.group(1)) if relayed else rank,
                                         detail=last, frames=frames, attempt=attempt,
                                         phase=phase_of_frames(frames), extra=extra))
        # a rank of the job, even one that died without a word of its own: a warning
        # it printed ("[rank3]:...") is enough to know it was there
        return found + [Observation("rank_line", Source(name, n), rank=r)
                        for r, n in sorted(heard.items())]


def _global_ranks(launcher: list[Observation], summary: list[Observation]) -> list[Observation]:
    """The launcher's "failed ... local_rank: 0 (pid: 1411)" lines with the global rank its
    summary gives the same pid ("rank : 2 (local_rank: 0)"): on any node but the first the
    two differ. Without a summary the local rank stands (one node's: the same), and the
    observation is not marked "global"."""
    rank_of = {o.pid: o.rank for o in summary if o.pid is not None and o.rank is not None}
    return [dataclasses.replace(o, rank=rank_of[o.pid], extra={**o.extra, "global": True})
            if "local_rank" in o.extra and o.pid in rank_of else o for o in launcher]


# the header of a rank's traceback that torch.distributed.checkpoint relays inside its
# CheckpointException: "Traceback (most recent call last): (RANK 0)"
RELAYED = re.compile(r"Traceback \(most recent call last\):? \(RANK (\d+)\)\s*$")


# what the summary says in place of a traceback where the script is not under @record
NO_TRACEBACK = re.compile(r"To enable traceback see\b")


def _summary_entry(fields: dict, where: Source, root: bool, script: str | None) -> Observation:
    rank = local = pid = code = None
    if m := RANK_FIELD.search(fields.get("rank", "")):
        rank, local = int(m.group(1)), int(m.group(2))
    if m := EXIT_FIELD.search(fields.get("exitcode", "")):
        code, pid = int(m.group(1)), int(m.group(2))
    tb = fields.get("_tb", [])
    frames = tuple(text.frame_text(m) for line in tb if (m := FRAME.match(line)))
    last = next((line.strip() for line in reversed(tb) if line.strip()), "")
    if NO_TRACEBACK.match(last):  # a script not under @record: no error of its own told
        last = ""
    extra = {"local_rank": local, "root_cause": root, "script": script}
    if fields.get("error_file") not in (None, "", "<N/A>"):
        extra["error_file"] = fields["error_file"]
    return Observation("exit", where, rank=rank, host=fields.get("host") or None, pid=pid,
                       exitcode=code, signal=signal_of_exitcode(code), detail=last,
                       frames=frames, phase=phase_of_frames(frames),
                       time=_summary_time(fields.get("time", "")), extra=extra)


def _summary_time(value: str) -> float | None:
    try:
        return _time.mktime(_time.strptime(value, "%Y-%m-%d_%H:%M:%S"))
    except ValueError:
        return None
