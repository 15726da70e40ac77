"""Failure rules for a rank that died: of memory, of a fatal signal of its own, of a
SIGKILL, silently, or with an exit code and no traceback."""

from __future__ import annotations

import re

from torchchaos.incident.evidence import FATAL, own_errors
from torchchaos.incident.finding import Finding, FirstFailure, RankStory, say
from torchchaos.incident.observations import (
    Observation,
)

# An allocation that failed, as torch, CUDA and Python say it (raised, not killed)
ALLOCATION_FAILED = re.compile(r"OutOfMemoryError|CUDA out of memory|can't allocate memory"
                               r"|^MemoryError\b")


def oom(c: FirstFailure) -> bool:
    """The kernel, Kubernetes (OOMKilled) or Slurm (OUT_OF_MEMORY) says a process was
    killed for memory (its pid gives the rank where the launcher named that pid), or an
    allocation failed and raised."""
    obs, ranks, f = c.obs, c.ranks, c.finding
    kills = [o for o in obs if o.what == "oom_kill"]
    if not kills:
        return _allocation_failed(obs, f)
    first = next((o for o in kills if o.rank is not None), kills[0])
    f.kind, f.rank, f.how = "oom", first.rank, "OOM"
    f.node = first.extra.get("node")
    who = f"rank {first.rank}" if first.rank is not None else \
        f"pid {first.pid}" if first.pid else "a process"
    say(f, f"oom: {first.reason or 'the OOM killer'} killed {who} ({first.source})", first)
    if first.rank is None:
        silent = _silent_ranks(obs, ranks)
        if len(silent) == 1 and first.pid and first.pid not in {o.pid for o in obs if o.rank
                                                                 is not None}:
            f.rank = silent[0]
            f.rules.append(f"no launcher line names pid {first.pid}, and rank {f.rank} is the"
                           " only rank with no word in the logs while a peer saw its"
                           " connection close: the process the OOM killer took was rank"
                           f" {f.rank}")
        else:
            f.rules.append(f"no launcher line names pid {first.pid}: the rank is not known")
    return True


def _allocation_failed(obs: list[Observation], f: Finding) -> bool:
    failed = [o for o in own_errors(obs) if ALLOCATION_FAILED.search(o.detail)]
    if not failed:
        return False
    first = next((o for o in failed if o.rank is not None), failed[0])
    f.kind, f.rank, f.how = "oom", first.rank, f"allocation failed: {first.detail[:140]}"
    say(f, f"oom: an allocation failed ({first.source})", first)
    return True


def crash(c: FirstFailure) -> bool:
    """A rank died of a fatal signal of its own (SIGSEGV, SIGABRT, SIGBUS, SIGFPE,
    SIGILL), from its exit status or faulthandler's dump; not NCCL's abort after a
    timeout or a peer's exit, nor a DataLoader worker's death."""
    obs, stopped, ranks, f = c.obs, c.stopped, c.ranks, c.finding
    # NCCL's watchdog aborts a rank whose collective timed out, or whose peer it saw exit
    # ("ncclRemoteError: ... a remote process exiting prematurely"): that SIGABRT is the
    # hang's, or the peer's death's, echo
    echoes = [o for o in obs if o.what in ("collective_timeout", "peer_lost")]
    echoed = {o.rank for o in echoes if o.rank is not None}
    # a node's launcher line gives only the local rank: an echo in the same log will do
    echoed_in = {o.source.file for o in echoes}
    fatal = [o for o in obs if o.what == "exit" and o.signal in FATAL and o.pid not in stopped
             and not (o.signal == "SIGABRT" and (o.rank in echoed or o.rank is None
                                                 and o.source.file in echoed_in))
             and not _in_a_loader_worker(o)]
    if not fatal:
        return False
    first = next((o for o in fatal if o.rank is not None), fatal[0])
    f.kind, f.rank, f.how = "crash", first.rank, first.signal or ""
    say(f, f"crash: {who_of(first)} died of {first.signal} ({first.source})", first)
    if first.rank is None and "local_rank" in first.extra:
        _rank_of_a_local_death(obs, ranks, f)
    elif first.rank is None:
        # an untagged faulthandler dump: a rank that died of it said nothing else
        silent = _silent_ranks(obs, ranks)
        if len(silent) == 1:
            f.rank = silent[0]
            f.rules.append(f"the dump names no rank, and rank {f.rank} is the only rank with"
                           " no word of its own while a peer saw its connection close:"
                           f" the dump is rank {f.rank}'s")
        else:
            f.rules.append("the dump names no rank, and the rank is not known")
    return True


def signal_death(obs, stopped, kinds: tuple[str, ...]) -> list[Observation]:
    return [o for o in obs if o.what == "exit" and o.pid not in stopped
            and o.reason != "stopped by the launcher"
            and (o.signal in kinds or "SIGTERM" in kinds and o.exitcode == 143)]


def kill(c: FirstFailure) -> bool:
    """A rank ended by a SIGKILL the launcher did not send."""
    obs, stopped, ranks, f = c.obs, c.stopped, c.ranks, c.finding
    deaths = signal_death(obs, stopped, ("SIGKILL",))
    if not deaths:
        return False
    first = next((o for o in deaths if o.rank is not None), deaths[0])
    f.kind, f.rank, f.how = "kill", first.rank, "SIGKILL"
    say(f, f"kill: {who_of(first)} ended by SIGKILL the launcher did not send"
            f" ({first.source})", first)
    if first.rank is None:
        _rank_of_a_local_death(obs, ranks, f)
    return True


def _in_a_loader_worker(o: Observation) -> bool:
    """A fatal signal's dump from a DataLoader worker process (its frames run under
    `_worker_loop`): the worker's death, which its rank reports and the dataloader rule
    tells, not the rank's."""
    return any(frame.startswith("_worker_loop ") for frame in o.frames)


def who_of(o: Observation) -> str:
    if o.rank is not None:
        return f"rank {o.rank}"
    if "local_rank" in o.extra:  # a node's launcher line, on a node whose ranks are not known
        return f"local rank {o.extra['local_rank']} of the node that wrote {o.source.file}"
    if o.pid:
        return f"the process with pid {o.pid}"
    return f"{o.host}" if o.host else "a rank"  # a pod's status: its name


def process_of(o: Observation) -> tuple[str, int | None]:
    """Which process an observation is of: its rank, else its pid."""
    return ("rank", o.rank) if o.rank is not None else ("pid", o.pid)


def _rank_of_a_local_death(obs: list[Observation], ranks: dict[int, RankStory],
                           f: Finding) -> None:
    """The global rank of a death a node's launcher told by its local rank only: the one
    rank with no word of its own while a peer saw its connection close."""
    silent = _silent_ranks(obs, ranks)
    if len(silent) == 1:
        f.rank = silent[0]
        f.rules.append(f"rank {f.rank} is the only rank with no word of its own while a peer"
                       f" saw its connection close: the rank that died was rank {f.rank}")
    else:
        f.rules.append("the global rank of that local rank is not known: the logs do not say"
                       " in which order the nodes joined")


def silent_peer(c: FirstFailure) -> bool:
    """Ranks that saw a peer close its connection, and one rank that said nothing at all:
    it died by a signal that leaves no traceback (SIGKILL, the OOM killer)."""
    obs, ranks, f = c.obs, c.ranks, c.finding
    echoes = [o for o in obs if o.what == "peer_lost"]
    if not echoes:
        return False
    silent = _silent_ranks(obs, ranks)
    say(f, f"a peer closed its connection ({echoes[0].source}): the rank that died did so"
            " without a traceback", echoes[0])
    f.kind, f.how = "kill", "SIGKILL (no traceback, no exit line)"
    # torchrun names only the first rank it sees fail; the one that died first may be
    # gone with no line at all, whatever the signal
    f.alternatives = ["crash", "oom"]
    f.alternatives_why = ("a SIGKILL, the OOM killer, and a fatal signal in a script with"
                          " no faulthandler all end a rank without a word; no exit line or"
                          " kernel log says which")
    if len(silent) == 1:
        f.rank = silent[0]
        f.rules.append(f"kill: rank {f.rank} is the only rank with no word in the logs; a"
                       " death that leaves none is a SIGKILL, the OOM killer, or a fatal"
                       " signal with no faulthandler (no exit line or kernel log says which)")
    elif silent:
        f.rules.append("the rank that died is not known: more than one rank left no word")
    else:
        f.rules.append("the rank that died is not known: every rank the artefacts name"
                       " spoke, and nothing tells how many ranks the job had")
    return True


def _silent_ranks(obs: list[Observation], ranks: dict[int, RankStory]) -> list[int]:
    """The job's ranks with no word of their own (no error, exit, stack or timeout) where
    a peer saw its connection close; [] where no peer did."""
    if not any(o.what == "peer_lost" for o in obs):
        return []
    spoke = {o.rank for o in obs if o.what in ("peer_lost", "error", "exit", "stack",
                                                "collective_timeout") and o.rank is not None}
    return sorted(set(ranks) - spoke)


def failed_without_a_traceback(c: FirstFailure) -> bool:
    """A worker that exited with a code of its own (1: Python's for an uncaught
    exception) whose traceback the artefacts do not hold (a script not under @record,
    its stderr elsewhere): torchrun's root cause, else the first such exit."""
    obs, stopped, f = c.obs, c.stopped, c.finding
    exited = [o for o in obs if o.what == "exit" and o.exitcode and o.exitcode > 0
              and o.signal is None and o.pid not in stopped
              and o.reason != "stopped by the launcher" and o.exitcode != 143]
    if not exited:
        return False
    first = next((o for o in exited if o.extra.get("root_cause")),
                 next((o for o in exited if o.rank is not None), exited[0]))
    f.kind, f.rank, f.node = "exception", first.rank, first.extra.get("node")
    f.how = f"exit code {first.exitcode}; its traceback is not in the artefacts"
    say(f, f"exception: {who_of(first)} exited with code {first.exitcode} ({first.source}) and"
            " no traceback of it is in the artefacts: an uncaught exception exits so (so"
            " does a sys.exit of that code)", first)
    return True
