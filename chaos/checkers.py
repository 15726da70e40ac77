"""Checkers: pure functions `Evidence -> CheckResult`. They never re-run anything.

`ok` is True (the invariant held), False (it did not: the target has a bug)
or None (could not decide, e.g. no failure happened, so there was no recovery
to judge). `detail` is one sentence a person can act on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos import hangs, sdc
from chaos.components import cause_rank, diverging_component, is_light, same_state
from chaos.evidence import Evidence, Recovery
from chaos.history import Event


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
    if not ev.completed:
        tail = f"; last output: {ev.log_tail}" if ev.log_tail else ""
        return CheckResult(False, f"job failed at step {reached} of {target} after {launches}"
                                  f" launch(es), exit codes {ev.exit_codes[-1]}{tail}")
    aligned = all(e.get("aligned", True) for e in ev.chaos.steps())
    if ev.stopped and ev.recoveries:
        return CheckResult(True, f"recovered and stopped as asked at step {reached} of {target}"
                                 f" ({launches} launch(es), {len(ev.recoveries)} recovery(ies))")
    if aligned and reached < target:
        return CheckResult(False, f"job exited 0 but stopped at step {reached} of {target}")
    if not aligned:
        return CheckResult(True, "exited 0; the final step is unknown because a restore"
                                 " matched no reference step")
    return CheckResult(True, f"reached step {reached} of {target} and exited 0"
                             f" ({launches} launch(es), {len(ev.recoveries)} recovery(ies))")


def _failed_resume(ev: Evidence) -> str | None:
    """How the first failed resume died, if one did.

    A failed resume is a worker, started after a fault, that read the
    checkpoint and died before its first step, in an attempt where no fault
    fired (a fault there would explain the death). Its exception is in the
    history when the agent saw it; a target that prints its traceback and
    exits with os._exit leaves only the log, so the log's first error stands in.
    """
    first = ev.first_fault_time()
    if first is None:
        return None
    faulted = {(e["launch"], e["attempt"]) for e in ev.chaos.faults()}
    for pid, events in ev.processes().items():
        head = events[0]
        if head["t"] < first or (head["launch"], head["attempt"]) in faulted:
            continue
        kinds = {e["ev"] for e in events}
        if "load" not in kinds or kinds & {"restore", "step"}:
            continue
        raised = [e for e in events if e["ev"] == "exception"]
        why = (f"{raised[0]['type']}: {raised[0]['message'].splitlines()[0]}" if raised
               else f"last output: {ev.log_tail}" if ev.log_tail else "no error was recorded")
        return (f"resume failed on rank {head['rank']} (pid {pid}): it read the checkpoint and"
                f" died before its first step; {why}")
    return None


def _before_faults(ev: Evidence) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Each step completed before the first fault, with the reference's fingerprints."""
    reference = ev.reference_steps()
    first_fault = ev.first_fault_time()
    pairs = []
    for e in ev.chaos.steps():
        if first_fault is not None and e["t"] >= first_fault:
            break
        ref = reference.get((e["rank"], e["step"]))
        if ref is not None:
            pairs.append((e, ref["fp"]))
    return pairs


def nondeterminism(ev: Evidence) -> str | None:
    """Why the target is not deterministic without faults, if it shows it is not.

    Proof comes from two fault-free reference runs that differ, a first run
    that starts from a state the reference never had, or a step that differs
    from the reference before any fault fired.
    """
    if ev.reference_deterministic is False:
        return ev.reference_detail
    for event in ev.chaos.of("restore"):
        if (event["launch"], event["attempt"]) == (0, 0) and event["restored"] is None:
            return (f"rank {event['rank']} started from a state the reference run never had"
                    " (is it seeded from its arguments?)")
    for e, ref in _before_faults(ev):
        if not same_state(ref, e["fp"]):
            return (f"step {e['step']} on rank {e['rank']} differs from the reference before"
                    f" any fault fired ({diverging_component(e['fp'], ref)})")
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
    for rec in recoveries:
        for rank, restored in sorted(rec.restored.items()):
            if restored is None and (reason := nondeterminism(ev)):
                return _undecidable(reason)
            if restored is None:
                return CheckResult(False, f"after the failure at step {rec.failed_step}, rank"
                                          f" {rank} restored a state that matches no step of"
                                          " the reference (torn, partial or mixed checkpoint)")
    steps = [r.restored_step for r in recoveries]
    return CheckResult(True, f"{len(recoveries)} recovery(ies), each restored a consistent"
                             f" checkpoint (steps {steps})", {"restored_steps": steps})


def _noisy_generators(ev: Evidence) -> frozenset[str]:
    """RNG keys that differ from the reference even before any fault: never seeded."""
    return frozenset(k for e, ref in _before_faults(ev) for k, v in e["fp"].items()
                     if k.startswith("rng.") and ref.get(k) != v)


def deterministic_resume(ev: Evidence) -> CheckResult:
    reason = nondeterminism(ev)
    if reason:
        return _undecidable(reason)
    if _in_memory_flip(ev):
        return CheckResult(None, "a bit flip changed the training state on purpose, so steps"
                                 " after it are not resume errors; sdc_detected judges it")
    reference = ev.reference_steps()
    noisy = _noisy_generators(ev)
    compared = 0
    divergent: list[tuple[Event, str]] = []
    for e in ev.chaos.steps():
        if not e.get("aligned", True):
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
        what = f"{component} not restored"
        if component == "unknown" and is_light(e["fp"]):
            what = ("the weights differ on a lightly fingerprinted step (run with"
                    " --full-fingerprints to name what was not restored)")
        if component == "gradients":  # every input of the step matched on every rank
            what = ("gradients differ although weights, optimizer, lr, RNG and batch matched:"
                    " the gradient all-reduce summed in another order (with 3+ ranks, DDP's"
                    " buckets differ in a resumed process's first step unless it never"
                    " rebuilds them, e.g. find_unused_parameters=True)")
        return CheckResult(False, f"diverged from the reference at step {e['step']} on rank"
                                  f" {e['rank']}: {what}",
                           {"divergent_step": e["step"], "rank": e["rank"],
                            "component": component})
    if not ev.completed:
        return CheckResult(None, f"job did not complete; the {compared} steps it ran matched")
    end = "up to the stop after the recovery" if ev.stopped else "final parameters equal"
    return CheckResult(True, f"all {compared} steps matched the reference bitwise, {end}")


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
        return CheckResult(None, f"lost steps {lost}, but the reference made no checkpoint;"
                                 " pass --max-lost-steps to set a bound", data)
    bounds = [bound * (1 + _checkpoints_destroyed(ev, rec)) for rec in recoveries]
    data["bound_steps"] = bounds if len(set(bounds)) > 1 else bound
    for rec, steps, limit in zip(recoveries, lost, bounds):
        if steps is not None and steps > limit:
            return CheckResult(False, f"redid {steps} steps after the failure at step"
                                      f" {rec.failed_step} (resumed from step"
                                      f" {rec.restored_step}); bound is"
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


def _bound_text(limit: int, bound: int) -> str:
    """A lost-work bound, saying why when bit rot raised it above the interval."""
    if limit > bound:
        return f"{limit} (one more interval per checkpoint bit rot destroyed)"
    return str(limit)


def _completed_saves(ev: Evidence, before: float) -> list[int]:
    """`after_step` of every checkpoint save that a rank finished (it went on to
    train, or exited) before time `before`."""
    begins = {(e["pid"], e["save"]): e.get("after_step") for e in ev.chaos.of("save_begin")}
    return [begins[key] for e in ev.chaos.of("save_end") if e["t"] < before
            and (key := (e["pid"], e["save"])) in begins and begins[key] is not None]


def durable_checkpoints(ev: Evidence) -> CheckResult:
    """A checkpoint the target had finished before a power loss survives it."""
    losses = [e for e in ev.chaos.of("fs_crash") if e.get("lose_unsynced")]
    if not losses:
        return CheckResult(None, "no power loss in this run, durability not tested")
    for loss in losses:
        saved = _completed_saves(ev, loss["t"])
        after = [r for r in ev.recoveries if r.started > loss["t"]]
        if not saved or not after or after[0].restored_step is None:
            continue  # nothing finished yet, or the resume failed: other checks say why
        newest, restored = max(saved), after[0].restored_step
        if restored < newest:
            dropped = sorted(set(loss.get("removed", []) + loss.get("reverted_files", [])))
            shown = ", ".join(dropped[:4]) + (" ..." if len(dropped) > 4 else "")
            return CheckResult(False, f"the checkpoint saved after step {newest} was finished"
                                      " before the power loss (training went on) but did not"
                                      f" survive it: resumed from step {restored}; the power"
                                      f" loss dropped {shown or 'nothing?'} (missing fsync of"
                                      " a file or of its directory)",
                               {"newest_finished": newest, "restored": restored,
                                "dropped": dropped})
    return CheckResult(True, f"{len(losses)} power loss(es); every checkpoint finished"
                             " before one survived it")


def _in_memory_flip(ev: Evidence) -> bool:
    return any(e.get("tensor") != "checkpoint" for e in ev.chaos.of("bitflip"))


def sdc_detected(ev: Evidence) -> CheckResult:
    """After a bit flip: the target noticed within the bound and ended bitwise equal to
    the reference; otherwise the blast radius (see `chaos.sdc`)."""
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


CHECKERS: dict[str, Callable[[Evidence], CheckResult]] = {
    "completes": completes,
    "atomic_recovery": atomic_recovery,
    "deterministic_resume": deterministic_resume,
    "bounded_lost_work": bounded_lost_work,
    "durable_checkpoints": durable_checkpoints,
    "sdc_detected": sdc_detected,
    "hang_detected": hang_detected,
    "no_split_brain": no_split_brain,
    "no_orphans": no_orphans,
}


def run_checks(ev: Evidence, names: list[str] | None = None) -> dict[str, CheckResult]:
    return {name: CHECKERS[name](ev) for name in (names or list(CHECKERS))}
