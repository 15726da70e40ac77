"""The failure rules, and the one order they are tried in.

Each rule reads a `FirstFailure` (the first failure's launch, the pids the launcher
stopped itself, each rank's story) and, where it applies, fills in its finding and
returns True; the first that applies decides. The order is the table below: a rule
comes before those whose evidence is its echo.
"""

from __future__ import annotations

from collections.abc import Callable

from torchchaos.incident.finding import FirstFailure
from torchchaos.incident.rules import checkpoints, deaths, errors, hangs, schedulers

Rule = Callable[[FirstFailure], bool]

# (rule, why it comes where it does)
FAILURE_RULES: tuple[tuple[Rule, str], ...] = (
    (deaths.oom, "the kernel's, Kubernetes' or Slurm's word that memory ran out, or an"
                 " allocation that failed, is the cause of the SIGKILL, the exception and"
                 " the peers' lost connections that follow it"),
    (deaths.crash, "a fatal signal of the rank's own (SIGSEGV, SIGBUS, ...): its peers'"
                   " errors are its echo; a SIGABRT that NCCL's watchdog sent after a"
                   " timeout or a peer's exit is left to the rules of those"),
    (errors.abort, "a process group gone under a rank is an error line the exception rule"
                   " would take as the rank's own"),
    (checkpoints.torn_checkpoint_read, "a resume that died loading a file the folder"
                                       " shows cut short: the load's error is the torn"
                                       " save's consequence, which the exception rule"
                                       " would take as a fault of its own"),
    (errors.exception, "an error of a rank's own, not an echo of another's failure; it"
                       " leaves a DataLoader worker's death, and what that death left its"
                       " rank's data pipeline, to the dataloader rule after it"),
    (errors.dataloader, "a worker that died: after the exception rule, so that an error of a"
                        " rank's own elsewhere outranks it"),
    (schedulers.node_said, "a scheduler that says a node failed: the peers' timeouts and the"
                           " signals that ended the job are its echoes, so before the hang"),
    (hangs.hang, "a collective that timed out, or stacks taken before the job was killed:"
                 " the launcher's SIGTERMs and SIGKILLs after it are its echo"),
    (hangs.limit_ended_hang, "a time limit that ended a long silence: before the preemption,"
                             " which a time limit on a job still stepping is"),
    (schedulers.preempt, "a SIGTERM from outside, then the SIGKILL after the grace time:"
                         " before the kill, which would take the second signal"),
    (deaths.kill, "a SIGKILL the launcher did not send"),
    (deaths.silent_peer, "a peer's lost connection and a rank with no word at all: after"
                         " every rule that reads an exit line, which names the death"),
    (schedulers.launch_vanished, "a launch whose log ends with no failure and no success"
                                 " while a later launch took over: the absence of every"
                                 " line the rules above read"),
    (deaths.failed_without_a_traceback, "an exit code with no traceback in the artefacts:"
                                        " after every rule that reads a cause"),
    (checkpoints.checkpoint_only, "a checkpoint that does not load and no death: last, as"
                                  " any death explains the file"),
)


def first_rule_that_applies(failure: FirstFailure) -> None:
    """Tries FAILURE_RULES in order until one fills in `failure.finding`."""
    for rule, _why in FAILURE_RULES:
        if rule(failure):
            return
