"""What a silent data corruption did to a run: where it spread, who noticed, the damage.

Built from the evidence alone (no re-run): the `bitflip` event says what was
corrupted; the step fingerprints say where the state left the reference and
where data-parallel replicas stopped agreeing (replicas are the ranks whose
weights the fault-free reference keeps bitwise equal); detections are the
target's own reports (`torchchaos.api`), rollbacks the agent saw, and restarts of
the job. The outcome uses the fault-injection literature's categories.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torchchaos.judge.components import cause_rank, diverging_component, same_state
from torchchaos.judge.evidence import Evidence
from torchchaos.rundir.history import Event, History

CATEGORIES = ("masked", "detected", "silent divergence", "crash", "hang")


@dataclass
class Injection:
    rank: int
    t: float
    step: int  # the step whose result it corrupted first (after it, or during it)
    tensor: str
    bit_class: str
    event: Event

    def describe(self) -> str:
        e = self.event
        if self.tensor == "checkpoint":
            return (f"bit {e.get('bit')} of byte {e.get('offset')} of {e.get('file')}"
                    f" on rank {self.rank}")
        if e.get("model") == "miscompute":  # a unit computing wrong (faults.miscompute)
            block = f", {e.get('elements')} elements from" if e.get("elements", 1) > 1 else ""
            flipped = e.get("bits") or []
            what = (f"bits {flipped[0]}-{flipped[-1]}" if len(flipped) > 1
                    else f"bit {e.get('bit')}" if flipped else "value")
            return (f"the output of {e.get('name')} on rank {self.rank} during step {self.step}"
                    f" computed wrong ({e.get('pattern')}{block} [{e.get('index')}], {what}"
                    f" ({self.bit_class}): {_num(e.get('before'))} -> {_num(e.get('after'))})"
                    + (f"; the device {e.get('device_id')} stays defective"
                       if e.get("persist") == "device" else ""))
        where = "after" if e.get("when") == "after" else "during"
        what = f"bit {e['bit']} ({self.bit_class})" if e.get("bit") is not None \
            else f"value {self.bit_class}"
        return (f"{self.tensor} {e.get('name')}[{e.get('index')}] on rank {self.rank} {where}"
                f" step {self.step}, {what}: {_num(e.get('before'))} -> {_num(e.get('after'))}")


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass
class FlipSpread:
    step: int
    ranks: list[int]  # the ranks that differ (from the reference, or from their replicas)
    component: str


@dataclass
class Detection:
    how: str  # "report" | "rollback" | "restart"
    t: float
    after_step: int  # last step the corrupted rank completed before it
    detail: str


@dataclass
class SdcAnalysis:
    injection: Injection
    category: str
    replicas: list[list[int]]
    replica_divergence: FlipSpread | None
    reference_divergence: FlipSpread | None
    detection: Detection | None
    steps_corrupted: int  # steps trained on corrupted state, until detection or the end
    ended_equal: bool | None  # None: the run did not finish
    went_nan: bool
    crashed: bool
    final_loss: float | None
    reference_final_loss: float | None
    max_weight_deviation: float | None
    extra: dict[str, Any] = field(default_factory=dict)

    def blast_radius(self) -> str:
        parts = [f"{self.steps_corrupted} step(s) on corrupted state"]
        if self.max_weight_deviation is not None:
            parts.append(f"max weight deviation {self.max_weight_deviation:.3g}")
        if self.final_loss is not None and self.reference_final_loss is not None:
            delta = self.final_loss - self.reference_final_loss
            parts.append(f"final loss {self.final_loss:.4g} vs {self.reference_final_loss:.4g}"
                         f" (delta {delta:+.3g})")
        if self.went_nan:
            parts.append("the loss went NaN/inf")
        if self.crashed:
            parts.append("the job crashed")
        elif self.category == "silent divergence" and not self.went_nan:
            parts.append("silently converged elsewhere")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        div = self.reference_divergence
        rep = self.replica_divergence
        return {
            "outcome": self.category, "tensor": self.injection.tensor,
            "bit_class": self.injection.bit_class, "injected_rank": self.injection.rank,
            "injected_step": self.injection.step,
            "reference_divergent_step": div.step if div else None,
            "reference_divergent_ranks": div.ranks if div else None,
            "replica_divergent_step": rep.step if rep else None,
            "replica_divergent_ranks": rep.ranks if rep else None,
            "detected_by": self.detection.how if self.detection else None,
            "steps_corrupted": self.steps_corrupted,
            "max_weight_deviation": _json(self.max_weight_deviation),
            "final_loss": _json(self.final_loss),
            "reference_final_loss": _json(self.reference_final_loss),
            "went_nan": self.went_nan, "crashed": self.crashed, "ended_equal": self.ended_equal,
        }


def _json(value: float | None) -> float | str | None:
    return value if value is None or math.isfinite(value) else repr(value)


def injection(ev: Evidence) -> Injection | None:
    flips = [e for e in ev.chaos.of("bitflip") if "error" not in e]
    if not flips:
        return None
    e = flips[0]
    if e.get("step") is not None:
        step = e["step"]
    else:  # a checkpoint file: the last step its rank completed
        step = max((s["step"] for s in ev.chaos.steps(e["rank"]) if s["t"] < e["t"]), default=0)
    return Injection(e["rank"], e["t"], step, e.get("tensor", "param"),
                     str(e.get("bit_class", "?")), e)


def replica_groups(reference: History) -> list[list[int]]:
    """Ranks whose weights the fault-free run keeps bitwise equal at every step."""
    table: dict[int, dict[int, str]] = {}
    for e in reference.steps():
        table.setdefault(e["step"], {})[e["rank"]] = e["fp"].get("params")
    ranks = reference.ranks()
    groups: list[list[int]] = []
    for rank in ranks:
        for group in groups:
            other = group[0]
            if all(row.get(rank) == row.get(other) for row in table.values()
                   if rank in row and other in row):
                group.append(rank)
                break
        else:
            groups.append([rank])
    return [g for g in groups if len(g) > 1]


def _steps_after(ev: Evidence, t: float) -> list[tuple[tuple[int, int], Event]]:
    """Step events after `t`, keyed by (step, how many times that rank reached it):
    the same key on two ranks is the same step of the same attempt."""
    seen: dict[tuple[int, int], int] = {}
    keyed = []
    for e in ev.chaos.steps():
        count = seen[(e["rank"], e["step"])] = seen.get((e["rank"], e["step"]), 0) + 1
        if e["t"] > t:
            keyed.append(((e["step"], count), e))
    return keyed


def replica_divergence(ev: Evidence, after: float,
                       groups: list[list[int]]) -> FlipSpread | None:
    """The first step after `after` where replicas disagree, and who disagrees."""
    if not groups:
        return None
    reference = ev.reference_steps()
    rows: dict[tuple[int, int], dict[int, Event]] = {}
    for key, e in _steps_after(ev, after):
        rows.setdefault(key, {})[e["rank"]] = e
    for (step, _), row in rows.items():
        for group in groups:
            present = [r for r in group if r in row]
            for key in ("params_start", "params"):
                if any(key not in row[r]["fp"] for r in present):
                    continue  # a light step of some replica: compare what all of them took
                values = {row[r]["fp"][key] for r in present}
                if len(values) > 1:
                    return FlipSpread(step, _odd_ones(row, present, key, reference, step),
                                      "weights")
    return None


def _odd_ones(row: dict[int, Event], ranks: list[int], key: str,
              reference: dict[tuple[int, int], Event], step: int) -> list[int]:
    """The replicas that are wrong: those unlike the reference, else the minority."""
    ref = {r: reference[(r, step)]["fp"].get(key) for r in ranks if (r, step) in reference}
    if ref:
        return [r for r in ranks if r in ref and row[r]["fp"].get(key) != ref[r]]
    counts: dict[str, list[int]] = {}
    for r in ranks:
        counts.setdefault(row[r]["fp"].get(key), []).append(r)
    majority = max(counts.values(), key=len)
    return [r for r in ranks if r not in majority]


def reference_divergence(ev: Evidence, after: float) -> FlipSpread | None:
    """The first step after `after` that differs from the reference, on which ranks."""
    reference = ev.reference_steps()
    first: tuple[int, int] | None = None
    found: dict[int, str] = {}  # rank -> the component that differs
    for key, e in _steps_after(ev, after):
        if first is not None and key != first:
            break
        ref = reference.get((e["rank"], e["step"]))
        if ref is not None and not same_state(e["fp"], ref["fp"]):
            first = key
            found[e["rank"]] = diverging_component(e["fp"], ref["fp"])
    if first is None:
        return None
    # The rank whose own state differs (not just the gradients it received) is the cause.
    component = min(found.values(), key=cause_rank)
    return FlipSpread(first[0], sorted(found), component)


def _last_step_before(ev: Evidence, rank: int, t: float) -> int:
    return max((e["step"] for e in ev.chaos.steps(rank) if e["t"] < t), default=0)


def first_detection(ev: Evidence, inj: Injection) -> Detection | None:
    found: list[Detection] = []
    for e in ev.chaos.of("detection", "rollback"):
        if e["t"] <= inj.t:
            continue
        if e["ev"] == "detection":
            reason = (e.get("details") or {}).get("reason")
            detail = (f"the target reported {e.get('what')!r} on rank {e['rank']}"
                      + (f": {reason}" if reason else ""))
            found.append(Detection("report", e["t"], 0, detail))
        else:
            found.append(Detection("rollback", e["t"], 0,
                                   f"rank {e['rank']} rolled back to step {e['restored']}"))
    for rec in ev.recoveries:
        if rec.started > inj.t:
            restored = rec.restored_step
            # When the new attempt began: the failure itself leaves no event of its own.
            found.append(Detection("restart", rec.started, 0,
                                   f"the job failed and restarted from step {restored}"))
    if not found:
        return None
    first = min(found, key=lambda d: d.t)
    first.after_step = _last_step_before(ev, inj.rank, first.t)
    return first


def ended_equal(ev: Evidence) -> bool | None:
    """Every rank's last step is the reference's last step, bitwise."""
    if not ev.completed:
        return None
    reference = ev.reference_steps()
    final = ev.reference.final_step()
    for rank in ev.chaos.ranks():
        steps = ev.chaos.steps(rank)
        if not steps:
            continue
        last = steps[-1]
        ref = reference.get((rank, final))
        if last["step"] != final or ref is None or not same_state(last["fp"], ref["fp"]):
            return False
    return True


def _final_loss(history: History) -> float | None:
    steps = history.steps(0) or history.steps()
    return steps[-1].get("loss") if steps else None


def _max_deviation(chaos: History) -> float | None:
    """The largest elementwise drift of the final weights from the reference's, over the
    ranks (the agent measures each rank's at the reference's last step); None where a
    rank has no measurement (a large model, a run that did not get there)."""
    worst: float | None = None
    for rank in chaos.ranks():
        measured = [e for e in chaos.of("weights_deviation") if e.get("rank") == rank]
        value = measured[-1].get("value") if measured else None
        if value is None:
            return None
        worst = value if worst is None or not value <= worst else worst
    return worst


def analyse(ev: Evidence) -> SdcAnalysis | None:
    inj = injection(ev)
    if inj is None:
        return None
    groups = replica_groups(ev.reference)
    rep = replica_divergence(ev, inj.t, groups)
    div = reference_divergence(ev, inj.t)
    detection = first_detection(ev, inj)
    equal = ended_equal(ev)
    after = [e for e in ev.chaos.steps() if e["t"] > inj.t]
    went_nan = any(isinstance(e.get("loss"), float) and not math.isfinite(e["loss"])
                   for e in after)
    crashed = not ev.completed or any(r.started > inj.t for r in ev.recoveries)
    start = _last_step_before(ev, inj.rank, inj.t)
    end = detection.after_step if detection else ev.chaos.final_step()
    if ev.deadline_hit or ev.hang is not None:
        category = "hang"
    elif not ev.completed or (detection and detection.how == "restart"):
        category = "crash"
    elif detection:
        category = "detected"
    elif div is None and rep is None:
        category = "masked"
    else:
        category = "silent divergence"
    deviation = None if equal else _max_deviation(ev.chaos)
    return SdcAnalysis(inj, category, groups, rep, div, detection, max(end - start, 0), equal,
                       went_nan, crashed, _final_loss(ev.chaos), _final_loss(ev.reference),
                       0.0 if equal else deviation)
