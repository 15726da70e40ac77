"""Failure rules for a rank that raised: its process group aborted under it, an error of
its own, a DataLoader worker of its that died."""

from __future__ import annotations

import re

from torchchaos.incident.evidence import ECHO, TEARDOWN_FOUND_NONE, a_load_error, own_errors
from torchchaos.incident.finding import FirstFailure, say
from torchchaos.incident.launches import launch_order

WORKER_DIED = re.compile(r"DataLoader worker \(pids?\(?s?\)? ?([\d, ]+)\) (is killed by signal:"
                         r" ?([^.]+)|exited unexpectedly)")


# gloo's word for a group aborted under the rank (NCCL's "communicator was aborted" is
# also what its watchdog leaves after a timeout: a hang's echo, left to the hang rule)
GROUP_GONE = re.compile(r"Default process group has not been initialized|"
                        # the functional collectives' (DTensor, FSDP2) word for it
                        r"Could not resolve the process group registered under the name")


def dataloader(c: FirstFailure) -> bool:
    """A rank's error says one of its DataLoader workers died ("DataLoader worker (pid
    N) is killed by signal", "exited unexpectedly"), before any collective timed out in
    that log (after one, a stopped rank's workers died with it: the hang's aftermath)."""
    obs, f = c.obs, c.finding
    died = [o for o in own_errors(obs) if WORKER_DIED.search(o.detail)]
    if not died:
        return False
    # a worker "killed by signal: Terminated" is the launcher's SIGTERM reaching the
    # workers of a rank it stops: an echo, where another worker died first
    killed = [o for o in died if "Terminated" not in o.detail] or died
    killed.sort(key=lambda o: (launch_order(o.source.file), o.source.line or 0))
    first = next((o for o in killed if o.rank is not None), killed[0])
    if any(t.what == "collective_timeout" and t.source.file == first.source.file
           and (t.source.line or 0) < (first.source.line or 0) for t in obs):
        # a collective timed out first: a hang, whose stopped rank's workers died with it
        # (a worker killed first makes its rank fail, and a peer may time out after it)
        return False
    m = WORKER_DIED.search(first.detail)
    f.kind, f.rank = "dataloader", first.rank
    f.how = f"worker killed by signal: {m.group(2).strip()}" if m.group(2) else \
        "worker exited unexpectedly"
    say(f, f"dataloader: rank {first.rank}'s DataLoader worker (pid {m.group(1).strip()})"
            f" died: {first.detail[:120]!r} ({first.source})", first)
    f.phase, f.phase_seen = "between_saves", True
    f.rules.append("phase between_saves: the rank was fetching a training batch")
    return True


def abort(c: FirstFailure) -> bool:
    """A process group that was there (the rank got as far as a collective, or as its
    teardown) and is gone: aborted under the rank, not a script that never made one."""
    obs, f = c.obs, c.finding
    gone = [o for o in obs if o.what == "error" and not ECHO.search(o.detail) and (
        GROUP_GONE.search(o.detail) and o.phase == "collective"
        and "init_process_group" not in " ".join(o.frames)
        or TEARDOWN_FOUND_NONE.search(o.detail) and o.phase == "exit")]
    if not gone or any(o.what == "collective_timeout" for o in obs):
        return False
    first = next((o for o in gone if o.rank is not None), gone[0])
    f.kind, f.rank, f.how = "abort", first.rank, first.detail[:160]
    where = "teardown (destroy_process_group)" if first.phase == "exit" else "collective"
    say(f, f"abort: rank {first.rank}'s {where} found its process group gone"
            f" ({first.detail[:100]!r}, {first.source}): it was aborted under the rank", first)
    return True




def exception(c: FirstFailure) -> bool:
    """A rank raised an error that is not the echo of another's failure (a peer that
    closed its connection, a collective timeout, the launcher's SIGTERM, torchrun's
    ChildFailedError), nor a DataLoader worker's death (the dataloader rule's)."""
    obs, f = c.obs, c.finding
    # a rank whose DataLoader worker died raised, in its data pipeline, what the worker's
    # death left it (a pipe's "Connection reset by peer") before saying the worker died:
    # the dataloader rule tells that
    lost_a_worker = {o.rank for o in obs if o.what == "error" and WORKER_DIED.search(o.detail)}
    errors = [o for o in own_errors(obs) if not WORKER_DIED.search(o.detail)
              and not (o.phase == "data" and o.rank in lost_a_worker)]
    if not errors:
        return False
    roots = [o for o in errors if o.extra.get("root_cause")]
    first = next((o for o in roots + errors if o.rank is not None), errors[0])
    f.kind, f.rank, f.how = "exception", first.rank, first.detail[:160]
    if first.rank is None:  # an untagged traceback: the summary's entry with its message
        same = [o for o in obs if o.rank is not None and o.detail == first.detail]
        f.rank = same[0].rank if same else None
    say(f, f"exception: rank {f.rank} raised {first.detail[:100]!r} ({first.source}),"
            " not the echo of a peer's failure", first)
    if a_load_error(first):
        f.phase, f.phase_seen = "load", True
        f.rules.append("phase load: the error is one a checkpoint that does not load raises")
    return True
