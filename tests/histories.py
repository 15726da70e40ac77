"""Build hand-written histories for checker tests, one event at a time."""

from __future__ import annotations

from typing import Any

from torchchaos.judge.evidence import Evidence
from torchchaos.rundir.history import History

COMPONENT_KEYS = ("params_start", "optim_start", "lr", "rng.torch", "rng.python", "batch",
                  "grads", "optim", "params", "loss")


def fp(step: int, **changed: str) -> dict[str, str]:
    """The fingerprints of a correct step; override components to plant a difference."""
    prints = {key: f"{key}@{step}" for key in COMPONENT_KEYS}
    prints["params_start"] = f"params@{step - 1}"
    prints.update(changed)
    return prints


class Timeline:
    """Appends events with increasing timestamps, like a real run would."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.t = 0.0

    def add(self, ev: str, **fields: Any) -> dict[str, Any]:
        self.t += 1.0
        event = {"ev": ev, "t": self.t, **fields}
        self.events.append(event)
        return event

    def proc(self, rank: int, launch: int = 0, attempt: int = 0) -> dict[str, Any]:
        return {"rank": rank, "pid": 1000 + 10 * attempt + rank, "launch": launch,
                "attempt": attempt}

    def train(self, ranks: int, steps: range, launch: int = 0, attempt: int = 0,
              restored: int | None = 0, save_every: int = 5,
              fps: dict[int, dict[str, str]] | None = None) -> None:
        for rank in range(ranks):
            self.add("boot", **self.proc(rank, launch, attempt))
            self.add("restore", restored=restored, match="exact", **self.proc(rank, launch,
                                                                              attempt))
        for step in steps:
            for rank in range(ranks):
                prints = (fps or {}).get(step, fp(step))
                self.add("step", step=step, local=step, loss=1.0, fp=prints,
                         **self.proc(rank, launch, attempt))
            if save_every and step % save_every == 0:
                self.add("save_begin", save=step // save_every, after_step=step,
                         **self.proc(0, launch, attempt))

    def fault(self, rank: int, step: int, launch: int = 0, attempt: int = 0) -> None:
        self.add("fault", id="f0-kill", kind="kill", spec=f"kill:rank={rank},step={step}",
                 step=step, **self.proc(rank, launch, attempt))

    def history(self) -> History:
        return History(sorted(self.events, key=lambda e: e["t"]))


def reference(steps: int = 20, ranks: int = 2) -> History:
    timeline = Timeline()
    timeline.train(ranks, range(1, steps + 1))
    return timeline.history()


def evidence(chaos: History, ref: History | None = None, **fields: Any) -> Evidence:
    values: dict[str, Any] = dict(completed=True, deadline_hit=False, exit_codes=[[0]],
                                  wall_seconds=20.0, reference_wall_seconds=10.0)
    values.update(fields)
    return Evidence(chaos=chaos, reference=ref or reference(), **values)
