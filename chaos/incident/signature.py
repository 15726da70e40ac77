"""What made it an incident, and how a replay's differs.

A signature is read the same way from both sides: the incident's from the
artefacts it left, a replay's from the artefacts the replay's own run left (its
launcher logs, error files, stacks and checkpoint folder, never the harness's
records). So `reproduced` means the same rules, applied to the same kind of
evidence, came to the same fault, role, phase and recovery.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torchchaos.incident.attribute import Incident


@dataclass(frozen=True)
class Signature:
    kind: str
    role: str
    phase: str
    how: str = ""
    collective: str | None = None
    recovery: str = "not seen"   # resumed | failed while loading | failed | not seen
    fits: tuple[str, ...] = ()   # the other kinds the same artefacts fit (said, not chosen)
    rank: int | None = None
    step: int | None = None      # the last step before the fault, where the artefacts say

    @classmethod
    def of(cls, incident: Incident) -> Signature:
        f = incident.finding
        # only what the artefacts showed is to be reproduced: a phase placed by rule is not
        # part of it, and of how a rank died only the signal (or OOM) is
        how = f.how.split(" ")[0] if f.kind in ("kill", "crash", "preempt", "oom") else ""
        phase = f.phase if f.phase_seen else "unknown"
        return cls(f.kind, f.role, phase, how, f.collective, recovery_class(incident.recovery),
                   tuple(f.alternatives), f.rank, f.step_window[0])

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Signature:
        fields = {k: doc[k] for k in ("kind", "role", "phase", "how", "collective", "recovery",
                                      "rank", "step") if k in doc}
        return cls(**{"kind": "unknown", "role": "unknown", "phase": "unknown", **fields,
                      "fits": tuple(doc.get("fits", ()))})

    def to_dict(self) -> dict[str, Any]:
        doc = {k: v for k, v in asdict(self).items() if v not in (None, "", ())}
        if self.fits:
            doc["fits"] = list(self.fits)
        return doc

    def kinds(self) -> set[str]:
        return {self.kind, *self.fits}

    def differences(self, replay: Signature, steps_kept: bool = False) -> list[str]:
        """Each way the replay's signature differs from this one ([] when reproduced).
        A kind matches where either side's kind is among the kinds the other's artefacts
        fit (a torn write the replay's artefacts can only tell as a node's death); the
        rank and the step are compared where the replay ran the incident's own script
        at the incident's own steps (`steps_kept`)."""
        found = []
        for name in ("kind", "role", "phase", "how", "collective", "recovery", "rank",
                     "step"):
            want, got = getattr(self, name), getattr(replay, name)
            if want in (None, "", "unknown", "not seen"):
                continue  # the incident did not tell: nothing to reproduce
            if name in ("rank", "step") and not steps_kept:
                continue  # placed on another script's ranks and steps, by role and phase
            if want == got or self._fit(name, replay):
                continue
            found.append(f"{name}: the incident's {want!r}, the replay's {got!r}")
        return found

    def _fit(self, name: str, replay: Signature) -> bool:
        """Whether a field that differs is what the kinds both sides fit allow."""
        if name == "kind":
            return self.kind in replay.kinds() or replay.kind in self.kinds()
        if name == "role":  # a node's death takes the writer with it
            return "node" in (self.role, replay.role) and "node" in self.kinds() | replay.kinds()
        return False

    def describe(self) -> str:
        what = "a node went down" if self.kind == "node" else self.kind
        parts = [what, f"of the {self.role} rank" if self.role in ("writer", "other")
                 else "",
                 self.phase.replace("_", " ") if self.phase != "unknown" else "",
                 f"({self.how})" if self.how else "",
                 f"in {self.collective}" if self.collective else "",
                 ]
        return " ".join(p for p in parts if p) + f"; restart: {self.recovery}"


def recovery_class(text: str) -> str:
    if text.startswith("failed while loading"):
        return "failed while loading"
    if text.startswith("failed"):
        return "failed"
    if text.startswith(("resumed", "restarted")):
        return "resumed" if text.startswith("resumed") else "restarted"
    return "not seen"
