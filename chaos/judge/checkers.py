"""Checkers: pure functions `Evidence -> CheckResult`. They never re-run anything.

`ok` is True (the invariant held), False (it did not: the target has a bug)
or None (could not decide, e.g. no failure happened, so there was no recovery
to judge). `detail` is one sentence a person can act on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torchchaos.judge import hangs, sdc
from torchchaos.judge.components import cause_rank, diverging_component, is_light, same_state
from torchchaos.judge.evidence import Evidence, Recovery
from torchchaos.rundir.history import Event, History


@dataclass
class CheckResult:
    ok: bool | None
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, **self.data}


def _secs(seconds: float) -> str:
    """Seconds for a detail line: 10, 14.1, 1800 (not 14.1154 or 1.8e+03)."""
    return f"{round(seconds, 1):g}"


def completes(ev: Evidence) -> CheckResult:
    target = ev.reference.final_step()
    reached = ev.chaos.final_step()
    launches = len(ev.exit_codes)
    if ev.hang is not None:
        return CheckResult(False, f"job hung at step {reached} of {target}: no progress for"
                                  f" {_secs(ev.hang['seconds'])} s; the harness tore it down")
    if ev.deadline_hit:
        return CheckResult(False, f"deadline of the run passed at step {reached} of {target}")
    if gave_up := ev.chaos.of("gave_up"):
        return CheckResult(False, f"job failed at step {reached} of {target} after {launches}"
                                  f" launch(es): {gave_up[-1]['reason']}")
    if not ev.completed and (ended := ev.chaos.of("scheduler_end")):
        return CheckResult(False, f"job ended at step {reached} of {target} after {launches}"
                                  f" launch(es): {ended[-1]['said']}")
    if not ev.completed:
        tail = f"; last output: {ev.log_tail}" if ev.log_tail else ""
        return CheckResult(False, f"job failed at step {reached} of {target} after {launches}"
                                  f" launch(es), exit codes {ev.exit_codes[-1]}{tail}")
    aligned = all(e.get("aligned", True) for e in ev.chaos.steps())
    if ev.exit_hang is not None and (not aligned or reached == target):
        return CheckResult(True, f"reached step {reached} of {target}, then {_exit_hang(ev)};"
                                 " training had ended, so this is no recovery failure"
                                 " (`--check clean_exit` judges the exit)")
    if ev.stopped and ev.recoveries:
        return CheckResult(True, f"recovered and stopped as asked at step {reached} of {target}"
                                 f" ({launches} launch(es), {len(ev.recoveries)} recovery(ies))")
    if aligned and reached < target:
        return CheckResult(False, f"job exited 0 but stopped at step {reached} of {target}")
    if aligned and reached > target:
        return CheckResult(False, f"job ran {reached - target} step(s) more than the reference"
                                  f" (reached step {reached} of {target}): a resume repeated"
                                  " work (data replayed, or the step count not restored)")
    if not aligned:
        return CheckResult(True, "exited 0; the final step is unknown because a restore"
                                 " matched no reference step")
    return CheckResult(True, f"reached step {reached} of {target} and exited 0"
                             f" ({launches} launch(es), {len(ev.recoveries)} recovery(ies))")


def _exit_hang(ev: Evidence) -> str:
    """'hung at exit: rank 0 stuck 10 s in destroy_process_group (...)'."""
    hang = ev.exit_hang or {}
    if hang.get("between_attempts"):  # every rank exited; torchrun itself did not end
        agents = "; ".join(f"node {a['node']} in {a['where']}" for a in hang.get("agents", []))
        return (f"hung at exit: every rank exited, torchrun did not end in"
                f" {_secs(hang.get('seconds', 0))} s ({agents or 'no agent left'}); the"
                " harness tore it down")
    ranks = hang.get("ranks") or [{}]
    culprit = ranks[0]
    return (f"hung at exit: rank {culprit.get('rank', '?')} stuck {_secs(hang.get('seconds', 0))}"
            f" s in {culprit.get('where', 'an unknown place')}; the harness tore it down")


def clean_exit(ev: Evidence) -> CheckResult:
    """Opt-in (`--check clean_exit`): once training ended, every rank exits on its own.
    A job that hangs in its teardown holds its nodes until the scheduler's time limit,
    but its work is done: by default that is said by `completes`, not failed."""
    if ev.exit_hang is not None:
        return CheckResult(False, f"every rank ended its training, then {_exit_hang(ev)}:"
                                  " its exit waits on something that never ends: a thread or"
                                  " child left running, or, on torch 2.13 with gloo, a DDP"
                                  " model still alive when the process group is destroyed (its"
                                  " reducer's teardown deadlocks on the GIL): stop what it"
                                  " started, free the model before destroy_process_group(),"
                                  " or leave with os._exit(0) once the last checkpoint is"
                                  " committed", {"hang": ev.exit_hang})
    if not ev.completed:
        return CheckResult(None, "the job did not complete: its exit is not what failed")
    return CheckResult(True, "every rank exited on its own once training ended")


def _failed_resume(ev: Evidence) -> str | None:
    """How the first failed resume died, if one did.

    A failed resume is a worker, started after a fault, that died before its
    first step, in an attempt where no fault fired and no harness fault (a
    partition) was in force: a fault there would explain the death; and not in a
    false start (`Evidence.false_starts`: a restart that died before any rank
    read a checkpoint, followed by one that trained; the recovery it delayed is
    what is judged). Whatever
    it read, or did not read: a framework may inspect a half-written folder
    and reject it before opening a file. Its exception is in the history when
    the agent saw it; a target that prints its traceback and exits with
    os._exit leaves only the log, so the log's first error stands in.
    """
    first = ev.first_fault_time()
    if first is None:
        return None
    faulted = {(e["launch"], e["attempt"]) for e in ev.chaos.faults()}
    last = max(((e["launch"], e["attempt"]) for e in ev.chaos.events if "launch" in e
                and "rank" in e), default=None)
    final = ev.reference.final_step()
    false_starts = ev.false_starts()
    dead = []
    for pid, events in ev.processes().items():
        head = events[0]
        key = (head["launch"], head["attempt"])
        if (head["t"] < first or key in faulted or hangs.cuts_in_force(ev.chaos, head["t"])
                or {e["ev"] for e in events} & {"restore", "step"}):
            continue
        if key in false_starts:
            continue  # the job got past it on its own: a later restart trained
        if ev.steps_done_by(head["t"]) >= final:
            continue  # restarted once training was over (a death at exit): nothing to resume
        if key == last and (ev.hang is not None or ev.deadline_hit):
            continue  # torn down by the harness while it waited: the hang check says why
        dead.append((pid, events))
    if not dead:
        return None
    # the worker that raised is the cause; its peers died of its death
    pid, events = min(dead, key=lambda d: (not any(e["ev"] == "exception" for e in d[1]),
                                           d[1][0]["t"]))
    raised = [e for e in events if e["ev"] == "exception"]
    why = (f"{raised[0]['type']}: {_first_line(raised[0]['message'])}" if raised
           # the resume died after the fault: the launch's last error, not its first
           else f"last output: {ev.last_error or ev.log_tail}" if ev.log_tail
           else "no error was recorded")
    read = [e["path"] for e in events if e["ev"] == "load"]
    what = f"it read {read[-1]} and" if read else "it"
    failed = (f"resume failed on rank {events[0]['rank']} (pid {pid}): {what} died before its"
              f" first step; {why}")
    if lost := lost_checkpoint(ev):  # before blaming the writer: a write was in progress?
        return (f"a power loss damaged the finished checkpoint of step {lost.step}"
                f" ({lost.describe()}), and the resume failed on it ({failed})")
    if read and _written_in_place(ev, read[-1]):
        return (f"the checkpoint is written in place: a crash in the middle of the write"
                f" left no loadable checkpoint ({failed})")
    if ev.checkpoint_findings:  # what the folder held: the pointer's fault, in its words
        found = "; ".join(f.describe() for f in ev.checkpoint_findings)
        return f"{found}, and the resume failed on it ({failed})"
    return failed


def _first_line(message: str) -> str:
    """An exception's message, first line ('(no message)': EOFError() has none)."""
    return (message.splitlines() or ["(no message)"])[0]


def _written_in_place(ev: Evidence, path: str) -> bool:
    """Did the saves write `path` itself (opened for writing, never renamed onto)?"""
    ops = {e["op"] for e in ev.chaos.of("file") if e["path"] == path and e.get("save")}
    return bool(ops & {"open", "write"}) and "rename" not in ops


def _resumed(ev: Evidence) -> set[int]:
    """Processes that read a checkpoint before their first step. Their steps are a
    recovery's (a run started from a snapshot is one), never proof that the
    target is nondeterministic: a difference there is a resume that failed."""
    return {e["pid"] for e in ev.chaos.of("restore") if e.get("loads", 0)}


def _before_faults(ev: Evidence) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Each step that fresh processes (no checkpoint read) completed before the first
    fault, with the reference's fingerprints."""
    reference = ev.reference_steps()
    first_fault = ev.first_fault_time()
    resumed = _resumed(ev)
    pairs = []
    for e in ev.chaos.steps():
        if first_fault is not None and e["t"] >= first_fault:
            break
        if e["pid"] in resumed:
            continue
        ref = reference.get((e["rank"], e["step"]))
        if ref is not None:
            pairs.append((e, ref["fp"]))
    return pairs


# A fresh start that differs from a cached reference may be a stale reference: a file the
# script reads by a fixed name is not in the cache key (torchchaos.harness.reference).
STALE_REFERENCE = ("or a stale cached reference: it is keyed on the script, the .py files"
                   " beside it, its arguments and the files they name; run with a new"
                   " --cache-dir to rule it out")


def nondeterminism(ev: Evidence) -> str | None:
    """Why the target is not deterministic without faults, if it shows it is not.

    Proof comes only from fault-free runs of the same path: two reference runs
    that differ, a fresh start (no checkpoint read) from a state the reference
    never had, or a fresh process's step that differs from the reference
    before any fault fired.
    """
    if ev.reference_deterministic is False:
        return ev.reference_detail
    for event in ev.chaos.of("restore"):
        if ((event["launch"], event["attempt"]) == (0, 0) and event["restored"] is None
                and not event.get("loads", 0)):
            return (f"rank {event['rank']} started from a state the reference run never had"
                    f" (is it seeded from its arguments? {STALE_REFERENCE})")
    for e, ref in _before_faults(ev):
        if not same_state(ref, e["fp"]):
            return (f"step {e['step']} on rank {e['rank']} differs from the reference before"
                    f" any fault fired ({diverging_component(e['fp'], ref)}; {STALE_REFERENCE})")
    return None


def _undecidable(reason: str) -> CheckResult:
    return CheckResult(None, f"the target is not deterministic without faults: {reason};"
                             " resume cannot be compared with the reference",
                       {"nondeterministic": True})


def atomic_recovery(ev: Evidence) -> CheckResult:
    failed = _failed_resume(ev)
    if failed:
        return CheckResult(False, f"{failed} (the job is down until a human cleans up)")
    recoveries = ev.recoveries
    if not recoveries:
        return CheckResult(None, "no recovery happened, nothing to judge")
    own: list[str] = []
    for rec in recoveries:
        for rank, restored in sorted(rec.restored.items()):
            if restored is None and (reason := nondeterminism(ev)):
                return _undecidable(reason)
            if restored is None and (step := _own_state(ev, rec, rank)) is not None:
                # A faithful save of a state this run had after an earlier resume went
                # astray: consistent, and deterministic_resume names that divergence.
                own.append(f"rank {rank} restored this run's own step {step}")
                continue
            if restored is None:
                return CheckResult(False, f"after the failure at step {rec.failed_step}, rank"
                                          f" {rank} restored a state that matches no step of"
                                          " the reference (torn, partial or mixed checkpoint)")
    mixed = _mixed_restore(ev)
    if mixed:
        return CheckResult(False, f"{mixed}: the job's checkpoint was torn, its replicas now"
                                  " hold different states")
    steps = [r.restored_step for r in recoveries]
    also = f"; {', '.join(own)}, saved after it diverged from the reference" if own else ""
    return CheckResult(True, f"{len(recoveries)} recovery(ies), each restored a consistent"
                             f" checkpoint (steps {steps}){also}{_false_starts(ev)}",
                       {"restored_steps": steps})


def _false_starts(ev: Evidence) -> str:
    """The restarts that died before their first step and were followed by one that
    resumed, with the first error one of them raised: said, not failed."""
    keys = sorted(k for rec in ev.recoveries for k in rec.false_starts)
    if not keys:
        return ""
    raised = [e for key in keys for e in ev.attempts[key] if e["ev"] == "exception"]
    why = f" ({raised[0]['type']}: {_first_line(raised[0]['message'])})" if raised else ""
    return (f"; {len(keys)} restart(s) died before their first step{why}, and the job"
            " resumed on the next")


def _own_state(ev: Evidence, rec: Recovery, rank: int) -> int | None:
    """The step of this chaos run, before the recovery, whose end state the rank restored
    (weights and optimizer bitwise), or None. A state that matches no reference step
    may still be a whole checkpoint: one the run saved after a resume diverged."""
    restore = next((e for e in ev.chaos.of("restore") if e.get("rank") == rank
                    and (e.get("launch"), e.get("attempt")) == (rec.launch, rec.attempt)), None)
    fp = (restore or {}).get("fp") or {}
    if not fp.get("params_start") or not fp.get("optim_start"):
        return None
    for e in reversed(ev.chaos.steps(rank)):
        if e["t"] < rec.started and (e["fp"].get("params"), e["fp"].get("optim")) == (
                fp["params_start"], fp["optim_start"]):
            return e["step"]
    return None


def _mixed_restore(ev: Evidence) -> str | None:
    """The first recovery whose ranks restored different steps, in words."""
    for rec in ev.recoveries:
        if len(set(rec.restored.values())) > 1:
            each = ", ".join(f"rank {rank} step {step}" for rank, step in
                             sorted(rec.restored.items()))
            return (f"after the failure at step {rec.failed_step} the ranks restored"
                    f" different checkpoints ({each})")
    return None


def _inert_generators(ev: Evidence) -> frozenset[str]:
    """RNG keys that cannot name a culprit: never seeded (they differ from the reference
    even before any fault) or never drawn from during training (the reference's state
    of them is the same at every step, so they fed no step)."""
    noisy = {k for e, ref in _before_faults(ev) for k, v in e["fp"].items()
             if k.startswith("rng.") and ref.get(k) != v}
    seen: dict[tuple[int, str], set[str]] = {}
    for e in ev.reference.steps():
        for key, value in e["fp"].items():
            if key.startswith("rng."):
                seen.setdefault((e["rank"], key), set()).add(value)
    drawn = {key for (_, key), values in seen.items() if len(values) > 1}
    unused = {key for _, key in seen} - drawn
    return frozenset(noisy | unused)


def _replayed_batch(ev: Evidence, step: Event) -> int | None:
    """The other reference step whose batch this step was given, if any: the data
    position was not restored (an epoch replayed or skipped)."""
    batch = step["fp"].get("batch")
    return next((e["step"] for e in ev.reference.steps(step["rank"])
                 if e["fp"].get("batch") == batch and e["step"] != step["step"]), None)


def _what_was_not_restored(ev: Evidence, step: Event, ref: dict[str, str],
                           component: str) -> str:
    """The cause of a divergence in the user's words."""
    batch_differs = step["fp"].get("batch") != ref.get("batch")
    names = component[component.find("(") + 1:-1] if component.startswith("rng") else ""
    # the batches say it first: the batch of another step is a data position not
    # restored (an epoch replayed, a sampler's epoch saved one short), whatever else
    # differs; an RNG is only one way to get there
    if batch_differs and (component == "data" or names) and (
            other := _replayed_batch(ev, step)) is not None:
        also = (f"; the RNG differs too ({names}), second to the data: a data loader"
                " drawing from it at a replayed position makes it differ, as does a"
                " checkpoint without it (fix the data position first)" if names else "")
        return (f"data position not restored: step {step['step']} was given the batch of"
                f" step {other} (data replayed or skipped){also}")
    if names:
        tail = "; the data order depends on it" if batch_differs else ""
        return f"RNG not restored ({names}{tail})"
    if component in ("optimizer", "lr_schedule"):
        return _optimizer_not_restored(ev, step, ref)
    return f"{component} not restored"


def _optimizer_not_restored(ev: Evidence, step: Event, ref: dict[str, str]) -> str:
    """The optimizer's state, its learning rate, or both, in the user's words. A learning
    rate that follows the reference's from step 1 again is a schedule that started over
    (a resume that loaded the weights alone); one that differs otherwise may be the
    optimizer's own param groups, which its state_dict carries."""
    state = step["fp"].get("optim_start") != ref.get("optim_start")
    # this step and the later ones of its process, and the reference's rate per step
    later = [e for e in ev.chaos.steps(step["rank"]) if e["step"] >= step["step"]
             and (e["launch"], e["attempt"]) == (step["launch"], step["attempt"])]
    rates = {e["step"]: e["fp"].get("lr") for e in ev.reference.steps(step["rank"])}
    # a schedule reset shows where it next changes the rate (StepLR's next decay)
    if not any(e["fp"].get("lr") != rates[e["step"]] for e in later if e["step"] in rates):
        return "optimizer not restored"
    restarted = _schedule_started_over(later, rates)
    again = " (the learning rate starts over from step 1's)" if restarted else ""
    if state and restarted:
        return f"optimizer and LR schedule not restored{again}"
    if state:
        return "optimizer not restored (its learning rate differs too)"
    return f"LR schedule not restored{again}"


def _schedule_started_over(later: list[Event], rates: dict[int, str | None]) -> bool:
    """Do these steps' learning rates follow the reference's `rates` from its first
    step, for 2 steps at least?"""
    start = min(rates, default=1)
    pairs = [(e["fp"].get("lr"), rates.get(start + n)) for n, e in enumerate(later)]
    return len(pairs) >= 2 and all(lr is not None and lr == theirs for lr, theirs in pairs)


def _headline(what: str) -> str:
    """The cause a divergence's words name first ("data position not restored"), for the
    places that have room for a few words (the timeline's label): the same cause."""
    depth = 0
    for i, char in enumerate(what):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char in ":;" and depth == 0:
            return what[:i].strip()
    return what.strip()


def deterministic_resume(ev: Evidence) -> CheckResult:
    reason = nondeterminism(ev)
    if reason:
        return _undecidable(reason)
    if _in_memory_flip(ev):
        return CheckResult(None, "a bit flip changed the training state on purpose, so steps"
                                 " after it are not resume errors; sdc_detected judges it")
    reference = ev.reference_steps()
    noisy = _inert_generators(ev)
    compared = 0
    divergent: list[tuple[Event, str]] = []
    for e in ev.chaos.steps():
        if not e.get("aligned", True):
            if divergent:  # an earlier resume went astray: that is the cause to name
                break
            return CheckResult(False, f"rank {e['rank']} resumed from a state that matches no"
                                      " reference step; its steps cannot be aligned")
        ref = reference.get((e["rank"], e["step"]))
        if ref is None:
            continue
        compared += 1
        if not same_state(e["fp"], ref["fp"]):
            divergent.append((e, diverging_component(e["fp"], ref["fp"], noisy)))
    if divergent:
        # Ranks that exchange gradients diverge at the same step; the rank whose own
        # state was wrong (not just its gradients) says what was not restored.
        first = divergent[0][0]
        same_step = [d for d in divergent if d[0]["step"] == first["step"]
                     and (d[0]["launch"], d[0]["attempt"]) == (first["launch"], first["attempt"])]
        e, component = min(same_step, key=lambda d: cause_rank(d[1]))
        what = _what_was_not_restored(ev, e, reference[(e["rank"], e["step"])]["fp"],
                                      component)
        if component == "unknown" and is_light(e["fp"]):
            what = ("the weights differ on a lightly fingerprinted step (run with"
                    " --full-fingerprints to name what was not restored)")
        if component == "gradients":  # every input of the step matched on its rank
            what = _gradients_differ(ev)
        if mixed := _mixed_restore(ev):
            what = f"{component} differ because {mixed}"
        return CheckResult(False, f"diverged from the reference at step {e['step']} on rank"
                                  f" {e['rank']}: {what}",
                           {"divergent_step": e["step"], "rank": e["rank"],
                            "component": component, "cause": _headline(what)})
    if not ev.completed:
        return CheckResult(None, f"job did not complete; the {compared} steps it ran matched")
    end = "up to the stop after the recovery" if ev.stopped else "final parameters equal"
    return CheckResult(True, f"all {compared} steps matched the reference bitwise, {end}")


def _gradients_differ(ev: Evidence) -> str:
    """Why a step's gradients differ when everything it started from matched."""
    if len(ev.reference.ranks()) >= 3:
        return ("gradients differ although weights, optimizer, lr, RNG and batch matched:"
                " the gradient all-reduce summed in another order (with 3+ ranks, DDP's"
                " buckets differ in a resumed process's first step unless it never"
                " rebuilds them, e.g. find_unused_parameters=True)")
    return ("gradients differ although this rank's weights, optimizer, lr, RNG and batch"
            " matched: another rank's state or batch was not restored")


def _seconds_lost(rec: Recovery) -> float | None:
    back = rec.caught_up_at if rec.lost_steps else rec.first_step_at
    return None if back is None else back - rec.failed_at


def _checkpoints_destroyed(ev: Evidence, rec: Recovery) -> int:
    """Checkpoints that bit rot (or a checkpoint bit flip) corrupted before this
    recovery: falling back past them is the right thing to do, so each adds one
    interval to the bound."""
    earlier = [r.started for r in ev.recoveries if r.started < rec.started]
    since = max(earlier, default=0.0)
    rotten = [e for e in ev.chaos.of("fs_bitrot") if e.get("file")]
    rotten += [e for e in ev.chaos.of("bitflip") if e.get("tensor") == "checkpoint"
               and e.get("file")]
    return sum(1 for e in rotten if since <= e["t"] < rec.started)


def bounded_lost_work(ev: Evidence) -> CheckResult:
    recoveries = ev.recoveries
    if not recoveries:
        return CheckResult(None, "no failure happened, no work lost")
    bound = ev.max_lost_steps if ev.max_lost_steps is not None else ev.checkpoint_interval()
    lost = [r.lost_steps for r in recoveries]
    seconds = [_seconds_lost(r) for r in recoveries]
    mttr = [None if r.first_step_at is None else r.first_step_at - r.failed_at
            for r in recoveries]
    ettr = ev.reference_wall_seconds / ev.wall_seconds if ev.wall_seconds else None
    data = {"lost_steps": lost, "seconds_lost": seconds, "mttr": mttr, "ettr": ettr,
            "bound_steps": bound}
    if any(x is None for x in lost):
        reason = nondeterminism(ev)
        if reason:
            return _undecidable(reason)
        return CheckResult(None, "a restore matched no reference step; lost work unknown", data)
    if bound is None:
        if any(steps for steps in lost):  # a restart that began again from step 0
            return CheckResult(False, f"the job saves no checkpoint (none in the reference"
                                      f" run): its restarts began again from step 0 and"
                                      f" redid {max(lost)} step(s); pass --max-lost-steps if"
                                      " that is acceptable", data)
        return CheckResult(None, f"lost steps {lost}, but the reference made no checkpoint;"
                                 " pass --max-lost-steps to set a bound", data)
    bounds = [bound * (1 + _checkpoints_destroyed(ev, rec)) for rec in recoveries]
    data["bound_steps"] = bounds if len(set(bounds)) > 1 else bound
    for rec, steps, limit in zip(recoveries, lost, bounds):
        if steps and _ignored_checkpoint(ev, rec) is not None:
            # Starting over beside a committed checkpoint is a failed resume even where the
            # steps redone fit the bound: the next failure, later in the run, would not.
            return CheckResult(False, _why_work_was_lost(ev, rec, steps), data)
        if steps is not None and steps > limit:
            return CheckResult(False, f"{_why_work_was_lost(ev, rec, steps)}; bound is"
                                      f" {_bound_text(limit, bound)}", data)
    slow = [s for s in seconds if s is not None and ev.max_lost_seconds is not None
            and s > ev.max_lost_seconds]
    if slow:
        return CheckResult(False, f"lost {max(slow):.1f} s to a failure; bound is"
                                  f" {ev.max_lost_seconds:g} s", data)
    secs = ", ".join("?" if s is None else f"{s:.1f}" for s in seconds)
    ettr_text = f", ETTR {ettr:.2f}" if ettr else ""
    return CheckResult(True, f"lost steps {lost} <= {_bound_text(max(bounds), bound)},"
                             f" seconds lost [{secs}]{ettr_text}", data)


def _why_work_was_lost(ev: Evidence, rec: Recovery, steps: int) -> str:
    """A recovery that redid too many steps, and what it did wrong if the history shows it."""
    text = (f"redid {steps} steps after the failure at step {rec.failed_step} (resumed from"
            f" step {rec.restored_step})")
    if (ignored := _ignored_checkpoint(ev, rec)) is not None:
        text = (f"did not resume: started again from step 0 although the checkpoint of step"
                f" {ignored} was committed; {text}")
    elif deleted := _deleted_checkpoint(ev, rec):
        text += f"; {deleted}"
    if overwritten := _overwritten_checkpoint(ev, rec):
        text += f"; {overwritten}"
    return text


def _ignored_checkpoint(ev: Evidence, rec: Recovery) -> int | None:
    """The newest checkpoint a recovery that started again from step 0 passed over: one
    the job had finished before the failure and no fault since destroyed (a power loss
    that took its files, bit rot in them), so resuming from it was the job's to do."""
    if rec.restored_step != 0 or _checkpoints_destroyed(ev, rec):
        return None
    damaged = {lost.step for lost in _power_losses(ev, before=rec.started)}
    kept = [s for s in _finished_checkpoints(ev, rec.failed_at) if s > 0 and s not in damaged]
    return max(kept, default=None)


def _deleted_checkpoint(ev: Evidence, rec: Recovery) -> str | None:
    """A recovery that fell back past a newer finished checkpoint because the job itself
    removed a file of it before the failure (a prune that picked the wrong files, or
    ran before the new checkpoint was in place)."""
    newer = [s for s in _finished_checkpoints(ev, rec.failed_at) if s > (rec.restored_step or 0)]
    if not newer:
        return None
    files = _checkpoint_files(ev, set(newer), rec.failed_at)
    for e in ev.chaos.of("file"):
        if e["op"] != "remove" or e["t"] >= rec.failed_at:
            continue
        for step in sorted(newer, reverse=True):
            if e["path"] in files[step]:
                return (f"the job deleted {e['path']} of the finished checkpoint of step"
                        f" {step} before the failure" + (f" (in save {e['save']})"
                                                          if e.get("save") else ""))
    return None


def _overwritten_checkpoint(ev: Evidence, rec: Recovery) -> str | None:
    """A save after this recovery that wrote over a file of a newer checkpoint: one that
    existed, its save finished before the failure (a save killed or torn mid-write
    left no checkpoint to overwrite)."""
    after = {(e["pid"], e["save"]): e.get("after_step") for e in ev.chaos.of("save_begin")}
    finished = set(_finished_checkpoints(ev, rec.failed_at))
    newest: dict[str, int] = {}  # path -> the newest finished step a save before it wrote
    for e in ev.chaos.of("file", "fs_crash"):
        if e["ev"] == "fs_crash":  # what a power loss dropped is no checkpoint to overwrite
            lost = e.get("removed", []) + e.get("reverted_files", [])
            newest = {p: s for p, s in newest.items() if not _among(p, lost)}
            continue
        step = after.get((e["pid"], e.get("save")))
        if step is None or e["op"] not in ("open", "write", "rename"):
            continue
        if e["t"] < rec.started:
            if step in finished:
                newest[e["path"]] = max(step, newest.get(e["path"], 0))
        elif newest.get(e["path"], 0) > step:
            return (f"a restart overwrote the newer checkpoint of step {newest[e['path']]}"
                    f" with an older state (step {step}) in {e['path']}")
    return None


def _among(path: str, dropped: list[str]) -> bool:
    """Is run-relative `path` one of `dropped` (relative to the fault filesystem's
    folder, so compared by their tails), or inside one of them?"""
    return any(f"/{path}/".find(f"/{d.strip('/')}/") >= 0 for d in dropped)


def _bound_text(limit: int, bound: int) -> str:
    """A lost-work bound, saying why when bit rot raised it above the interval."""
    if limit > bound:
        return f"{limit} (one more interval per checkpoint bit rot destroyed)"
    return str(limit)


# How a save ended when the rank was done with it (torchchaos.rank.agent._end_save): it went on
# to train or to a clean teardown of its process group, or its writer thread moved on to
# the next save. A save cut short by an exception or a death is no finished checkpoint,
# nor is one open at exit.
FINISHED = ("step", "teardown", "next_save")


def _finished_checkpoints(ev: Evidence, before: float) -> list[int]:
    """`after_step` of every checkpoint the job had finished by time `before`.

    A checkpoint is the saves of one step's state on every rank that writes it
    (the ranks whose saves hold that step in the reference run). It is finished
    once each of those ranks ended its part and went on (`_parts_finished`), its
    part's last event before `before`, or once the target said so
    (`torchchaos.api.report_checkpoint_committed`); one rank's part alone is not the
    job's checkpoint.
    """
    writers: dict[int, set[int]] = {}
    for e in ev.reference.of("save_begin"):
        if e.get("after_step") is not None:
            writers.setdefault(e["after_step"], set()).add(e["rank"])
    begins = {(e["pid"], e["save"]): e for e in ev.chaos.of("save_begin")}
    done: dict[int, set[int]] = {}
    for key, over in _parts_finished(ev).items():
        begin = begins.get(key)
        if begin is None or begin.get("after_step") is None or over >= before:
            continue
        done.setdefault(begin["after_step"], set()).add(begin["rank"])
    said = {e["step"] for e in ev.chaos.of("committed") if e["t"] < before}
    return sorted(said | {step for step, ranks in done.items()
                          if ranks >= writers.get(step, {ev.reference.checkpoint_writer()})})


def _parts_finished(ev: Evidence) -> dict[tuple[int, int], float]:
    """When each rank's part of a checkpoint, by (pid, save), was over, for the parts
    the rank went on from: it ended as `FINISHED` says, or the script entered a
    collective of its own after the last of its events (`save_left`: a save on a
    scheduler's signal, a barrier, and the requeue killed it before its next step),
    unless the fault-free run shows that rank writing more of a save after such a
    collective (shards, a barrier, then the pointer: the barrier is no end there).
    Over at its last event (its last publish or fsync), whatever thread made it, not
    when the rank got round to saying so (its next step, its writer's next save)."""
    over: dict[tuple[int, int], float] = {}
    for end in ev.chaos.of("save_end"):
        if end.get("ended", "step") in FINISHED:
            over[(end["pid"], end["save"])] = end.get("last_t") or end["t"]
    writes_on = _ranks_that_write_on_after_a_collective(ev.reference)
    last = _last_file_events(ev.chaos)
    for mark in ev.chaos.of("save_left"):
        key = (mark["pid"], mark["save"])
        index, t = last.get(key, (None, mark["t"]))
        if key not in over and index == mark["events"] and mark["rank"] not in writes_on:
            over[key] = t
    return over


def _last_file_events(history: History) -> dict[tuple[int, int], tuple[int, float]]:
    """The index and time of each save's last file event, by (pid, save)."""
    last: dict[tuple[int, int], tuple[int, float]] = {}
    for e in history.of("file"):
        if e.get("save"):
            last[(e["pid"], e["save"])] = (e["index"], e["t"])
    return last


def _ranks_that_write_on_after_a_collective(history: History) -> set[int]:
    """The ranks whose saves, in this history, went on writing after the script
    entered a collective of its own: for them a `save_left` says nothing of the end."""
    last = _last_file_events(history)
    return {mark["rank"] for mark in history.of("save_left")
            if last.get((mark["pid"], mark["save"]), (0, 0.0))[0] > mark["events"]}


def _fired_at(ev: Evidence, effect: Event) -> float:
    """When a fault's effect happened: when its fault fired in the rank, not when the
    harness got round to recording what it did (after the job had reacted)."""
    fired = [e["t"] for e in ev.chaos.faults() if e.get("id") == effect.get("fault")]
    return min(fired, default=effect["t"])


@dataclass
class LostCheckpoint:
    """What a power loss took of a checkpoint the job had finished before it: files
    whose data went back to their last fsync (empty if never fsynced), and names it
    undid because a folder's entry was never fsynced. `entries`: each entry the loss
    undid above those files (the top-most: a folder made and never made durable takes
    what is inside it), relative to the run directory, a folder's with a trailing "/"."""

    step: int
    emptied: list[str]
    removed: list[str]
    entries: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.emptied:
            its, file = ("their", "each file") if len(self.emptied) > 1 else ("its", "the file")
            parts.append(f"reverted {_listed(self.emptied)} to {its} last fsync ({its} data was"
                         f" never fsynced: fsync {file} before it is published)")
        if self.removed:
            parts.append(f"undid {_listed(self.removed)} ({self._missing_folder_fsync()})")
        return f"the power loss {' and '.join(parts)}"

    def _missing_folder_fsync(self) -> str:
        """Which entries were lost from which folder, and the folder to fsync."""
        by_folder: dict[str, list[str]] = {}
        for entry in self.entries:
            folder, _, name = entry.rstrip("/").rpartition("/")
            by_folder.setdefault(folder or ".", []).append(
                name + ("/" if entry.endswith("/") else ""))
        if not by_folder:
            return ("the folder was never fsynced after the file was created or renamed"
                    " there: fsync the folder")
        said = []
        for folder, names in sorted(by_folder.items()):
            where = "the run folder" if folder == "." else f"{folder}/"
            many = len(names) > 1
            made = ("made" if any(n.endswith("/") for n in names)
                    else "created or renamed")
            said.append(f"the entr{'ies' if many else 'y'} {_listed(sorted(names))} in {where}"
                        f" {'were' if many else 'was'} lost: {where} was never fsynced after"
                        f" {'they were' if many else 'it was'} {made} there; fsync {where}")
        return "; ".join(said)


def _listed(paths: list[str]) -> str:
    return ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")


def lost_checkpoint(ev: Evidence) -> LostCheckpoint | None:
    """The newest finished checkpoint a power loss of this run damaged, if any: a file
    its saves wrote or renamed into place among what the loss reverted or removed."""
    return next(_power_losses(ev), None)


def _power_losses(ev: Evidence, before: float = float("inf")) -> Iterator[LostCheckpoint]:
    """Each finished checkpoint a power loss before `before` damaged, newest first per
    loss."""
    for loss in ev.chaos.of("fs_crash"):
        fired = _fired_at(ev, loss)
        if not loss.get("lose_unsynced") or fired >= before:
            continue
        finished = set(_finished_checkpoints(ev, fired))
        files = _checkpoint_files(ev, finished, fired)
        for step in sorted(finished, reverse=True):
            emptied = [p for p in loss.get("reverted_files", []) if _one_of(p, files[step])]
            removed = [p for p in loss.get("removed", []) if _one_of(p, files[step])]
            if emptied or removed:
                entries = _lost_entries(removed, loss.get("removed", []), files[step])
                yield LostCheckpoint(step, emptied, removed, entries)


def _lost_entries(files: list[str], undone: list[str], written: set[str]) -> list[str]:
    """For each checkpoint file a power loss undid, the top-most name it undid above it (a
    folder whose own entry was never made durable takes the file with it), run-relative,
    a folder's with a trailing "/". `files` and `undone` are relative to the fault
    filesystem's folder; `written` (run-relative) tells where that folder is."""
    undone_set = {u.strip("/") for u in undone}
    entries: dict[str, None] = {}  # in order, each once
    for dropped in files:
        parts = dropped.strip("/").split("/")
        top = next("/".join(parts[:i]) for i in range(1, len(parts) + 1)
                   if "/".join(parts[:i]) in undone_set)
        run_path = next(p for p in written if p == dropped or p.endswith("/" + dropped))
        root = run_path[: len(run_path) - len(dropped)].rstrip("/")
        entry = f"{root}/{top}" if root else top
        entries[entry + ("/" if top != dropped.strip("/") else "")] = None
    return list(entries)


def _checkpoint_files(ev: Evidence, steps: set[int], before: float) -> dict[int, set[str]]:
    """The paths (relative to the run directory) that the saves of each step wrote or
    renamed into place and no later save wrote again before `before` (what a power
    loss then reverts of such a path may be the later save's bytes, not the step's)."""
    begins = {(e["pid"], e["save"]): e.get("after_step") for e in ev.chaos.of("save_begin")}
    last_writer: dict[str, int | None] = {}
    for e in ev.chaos.of("file"):
        if e["t"] < before and e["op"] in ("open", "write", "rename", "replace"):
            last_writer[e["path"]] = begins.get((e["pid"], e.get("save")))
    return {step: {p for p, s in last_writer.items() if s == step} for step in steps}


def _one_of(dropped: str, paths: set[str]) -> bool:
    """Is `dropped` (relative to the fault filesystem's folder) one of `paths`
    (relative to the run directory, which holds that folder)?"""
    return any(p == dropped or p.endswith("/" + dropped) for p in paths)


def durable_checkpoints(ev: Evidence) -> CheckResult:
    """A checkpoint the target had finished before a power loss survives it."""
    losses = [e for e in ev.chaos.of("fs_crash") if e.get("lose_unsynced")]
    if not losses:
        return CheckResult(None, "no power loss in this run, durability not tested")
    lost = lost_checkpoint(ev)
    for loss in losses:
        saved = _finished_checkpoints(ev, _fired_at(ev, loss))
        after = [r for r in ev.recoveries if r.started > loss["t"]]
        if saved and (not after or after[0].restored_step is None) and lost:
            # the commonest real power loss: the name survived, its bytes did not
            return CheckResult(False, f"the checkpoint saved after step {lost.step} was"
                                      " finished before the power loss (training went on)"
                                      f" but did not survive it: {lost.describe()}; the"
                                      " resume then failed on what was left",
                               {"newest_finished": lost.step, "restored": None,
                                "dropped": sorted(lost.emptied + lost.removed)})
        if not saved or not after or after[0].restored_step is None:
            continue  # nothing finished yet, or the resume failed: other checks say why
        newest, restored = max(saved), after[0].restored_step
        dropped = sorted(set(loss.get("removed", []) + loss.get("reverted_files", [])))
        if (restored == 0 and not dropped and lost is None
                and _ignored_checkpoint(ev, after[0]) == newest):
            continue  # the loss took nothing and the job started over beside a whole
            # checkpoint: the resume's fault, which bounded_lost_work names ("did not resume")
        if restored < newest:
            shown = ", ".join(dropped[:4]) + (" ..." if len(dropped) > 4 else "")
            # which fsync was missing (the data's, the folder's), where the loss says
            why = (lost.describe() if lost is not None and lost.step == newest else
                   f"the power loss dropped {shown or 'nothing?'} (missing fsync of a file"
                   " or of its directory)")
            return CheckResult(False, f"the checkpoint saved after step {newest} was finished"
                                      " before the power loss (training went on) but did not"
                                      f" survive it: resumed from step {restored}; {why}",
                               {"newest_finished": newest, "restored": restored,
                                "dropped": dropped})
    return CheckResult(True, f"{len(losses)} power loss(es); every checkpoint finished"
                             " before one survived it")


def _in_memory_flip(ev: Evidence) -> bool:
    return any(e.get("tensor") != "checkpoint" for e in ev.chaos.of("bitflip"))


def sdc_detected(ev: Evidence) -> CheckResult:
    """After a bit flip: the target noticed within the bound and ended bitwise equal to
    the reference; otherwise the blast radius (see `torchchaos.judge.sdc`)."""
    found = sdc.analyse(ev)
    if found is None:
        return CheckResult(None, "no bit flip fired, nothing to detect")
    data = found.to_dict()
    what = found.injection.describe()
    bound = ev.max_detect_steps if ev.max_detect_steps is not None else (
        ev.checkpoint_interval() or 10)
    data["bound_steps"] = bound
    if found.category == "hang":
        return CheckResult(False, f"the run hung after the corruption ({what})", data)
    if found.category == "masked":
        return CheckResult(True, f"masked: {what} changed nothing the run computed (every later"
                                 " step equals the reference)", data)
    detection = found.detection
    if detection is None:
        return CheckResult(False, f"undetected silent data corruption: {what}; "
                                  f"{_where_it_spread(found)}; blast radius: "
                                  f"{found.blast_radius()}", data)
    late = found.steps_corrupted > bound
    noticed = (f"noticed {found.steps_corrupted} step(s) later ({detection.detail})")
    if found.ended_equal is None:
        return CheckResult(False, f"{what}: {noticed}, but the job did not recover"
                                  f" ({found.blast_radius()})", data)
    if not found.ended_equal:
        return CheckResult(False, f"{what}: {noticed}, but the run did not end bitwise equal"
                                  f" to the reference (a rollback to corrupted state?);"
                                  f" {_where_it_spread(found)}", data)
    if late:
        return CheckResult(False, f"{what}: {noticed}, more than the bound of {bound} steps",
                           data)
    return CheckResult(True, f"{what}: {noticed} and ended bitwise equal to the reference",
                       data)


def _where_it_spread(found: sdc.SdcAnalysis) -> str:
    parts = []
    rep, div = found.replica_divergence, found.reference_divergence
    if rep:
        ranks = ", ".join(map(str, rep.ranks)) or "?"
        parts.append(f"replicas disagree from step {rep.step} (rank(s) {ranks} differ)")
    elif found.replicas:
        parts.append("the replicas stayed equal to each other")
    if div:
        ranks = ", ".join(map(str, div.ranks))
        parts.append(f"the reference comparison diverges at step {div.step} on rank(s)"
                     f" {ranks} ({div.component})")
    return "; ".join(parts) or "no step differed from the reference"


def hang_detected(ev: Evidence) -> CheckResult:
    """A hung rank must make the job fail or restart on its own within the bound
    (its collective timeout or watchdog fired), and the job then complete; the
    harness stepping in is a failure, whatever caused the hang."""
    straggler = hangs.straggling(ev.chaos, ev.reference, ev.wall_seconds,
                                 ev.reference_wall_seconds) or {}
    if ev.hang is not None:
        seen = ev.hang["t"]  # a cut made the step the ranks still wait in: after progress
        cause = hangs.describe_cuts(hangs.cuts_in_force(ev.chaos, seen), seen)
        why = ("the ranks' timeouts fired but the job could not start again"
               if ev.hang.get("between_attempts") else "no watchdog or collective timeout fired")
        return CheckResult(False, f"hung for {_secs(ev.hang['seconds'])} s{cause}, {why}"
                                  f" (bound {_secs(ev.hang_timeout)} s):"
                                  f" {hangs.describe_hang(ev.hang)}; stacks in"
                                  f" {ev.hang['stacks_dir']}/",
                           {"hang": ev.hang, **straggler})
    found = hangs.reaction(ev.chaos)
    if found is None and not straggler and ev.exit_hang is not None:
        return CheckResult(None, f"no hang in training; after its last step the job"
                                 f" {_exit_hang(ev)} (`--check clean_exit` judges it)")
    if found is None and not straggler:
        return CheckResult(None, f"no hang was injected, and no rank went"
                                 f" {_secs(ev.hang_timeout)} s without progress")
    if found is None:
        return CheckResult(True, _straggler_text(straggler), straggler)
    data = {"reaction_seconds": found.seconds, **straggler}
    bound = _secs(ev.hang_timeout)
    reacted = f"{found.how} {found.seconds:.1f} s after the hang began (bound {bound}"
    if not ev.completed:
        return CheckResult(False, f"{reacted} s), but the job did not complete", data)
    return CheckResult(True, f"{reacted} s); the job then completed", data)


def _straggler_text(data: dict[str, Any]) -> str:
    ranks = ", ".join(map(str, data["straggler_ranks"]))
    times = ", ".join(f"rank {r} {s:.3f} s" for r, s in data["step_seconds"].items())
    reference = ", ".join(f"{s:.3f}" for s in data["reference_step_seconds"].values())
    return (f"no hang; straggler rank {ranks} (+{data['delay']:g} s per step): mean step"
            f" {times} (reference {reference} s); the job ran {data['slowdown']}x as long as"
            " the reference")


def no_split_brain(ev: Evidence) -> CheckResult:
    """While a partition was in force, no two nodes published different contents under
    one checkpoint name (each side went on as if it were the job)."""
    cuts = [(c, end) for c, end in hangs.cut_windows(ev.chaos) if c["kind"] == "partition"]
    if not cuts:
        return CheckResult(None, "no partition in this run, no split brain possible")
    node_of = {e["pid"]: e.get("node", 0) for e in ev.chaos.of("boot")}
    published = [e for e in ev.chaos.of("file") if e.get("digest")]
    during = 0
    for cut, end in cuts:
        by_name: dict[str, dict[int, str]] = {}
        for e in published:
            if cut["t"] <= e["t"] <= end:
                during += 1
                by_name.setdefault(e["path"], {})[node_of.get(e["pid"], 0)] = e["digest"]
        for name, digests in by_name.items():  # in the order they were first published
            if len(set(digests.values())) > 1:
                who = ", ".join(f"node {n} ({d[:12]})" for n, d in sorted(digests.items()))
                return CheckResult(False, f"split brain during partition {cut.get('nodes', '')}:"
                                          f" {name} published with different contents by {who}",
                                   {"file": name, "digests": digests})
    return CheckResult(True, f"no two nodes published different contents under one name"
                             f" ({during} file(s) published while the network was cut)")


def no_orphans(ev: Evidence) -> CheckResult:
    if ev.leftovers:
        return CheckResult(False, f"processes of the run survived it: {ev.leftovers}")
    if ev.leftover_mounts:
        return CheckResult(False, f"mounts of the run survived it: {ev.leftover_mounts}")
    if ev.leftover_network:
        return CheckResult(False, f"network namespaces or links of the run survived it:"
                                  f" {ev.leftover_network}")
    if ev.reaped:
        return CheckResult(True, f"nothing survived; the harness reaped {len(ev.reaped)}"
                                 " process(es) the job left running after it exited")
    return CheckResult(True, "nothing of the run survived it")
