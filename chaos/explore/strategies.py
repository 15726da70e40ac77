"""Hypothesis strategies for fault schedules.

Strategies only describe which schedules exist; they run nothing. The search
engine (`chaos.explore.search`) draws from them, runs real jobs and shrinks. Every
strategy produces fault spec *strings*, the language of `--fault`, so a drawn
schedule can be printed, pasted on a command line and saved as a replay file,
and user strategies compose with these through the usual combinators:

    from hypothesis import strategies as st
    from chaos.explore import strategies as cs

    shape = cs.JobShape(world_size=2, final_step=20, checkpoint_every=5)
    my_fault = st.sampled_from(["hang:rank=1,step=7,mode=stop"])
    schedule = cs.schedules(st.one_of(cs.kills(shape), my_fault), max_faults=3)

Steps are drawn from `JobShape.steps`: by default one step in the middle of
each checkpoint interval (where a failure costs work), so a search covers the
job with few distinct schedules and shrinking has few candidates to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import strategies as st

from chaos.rundir.history import History
from faults.registry import loadable_kinds


@dataclass(frozen=True)
class JobShape:
    """What a schedule may aim at: the job's ranks, nodes, steps and checkpoint saves."""

    world_size: int
    final_step: int
    nodes: int = 1
    checkpoint_every: int = 0  # 0: unknown (no two saves seen)
    writer: int = 0  # the rank that writes checkpoints
    # file events of each save of the writer: save number -> how many
    save_events: dict[int, int] = field(default_factory=dict)
    every_step: bool = False  # steps: every step, instead of one per checkpoint interval

    @classmethod
    def of(cls, history: History, nodes: int = 1, every_step: bool = False) -> JobShape:
        """The shape of the job a fault-free reference history shows."""
        writer = history.checkpoint_writer()
        events: dict[int, int] = {}
        for event in history.of("file"):
            if event["rank"] == writer and event.get("save"):
                events[event["save"]] = max(events.get(event["save"], 0), event["index"])
        return cls(len(history.ranks()), history.final_step(), nodes, history.save_interval(),
                   writer, events, every_step)

    def a_rank(self) -> st.SearchStrategy[int]:
        return st.integers(0, self.world_size - 1)

    def a_node(self) -> st.SearchStrategy[int]:
        return st.integers(0, self.nodes - 1)

    def a_step(self) -> st.SearchStrategy[int]:
        return st.sampled_from(self.steps)

    def a_save_point(self) -> st.SearchStrategy[tuple[int, int]]:
        """(save, file event) of the writer's saves."""
        points = [(save, event) for save, count in sorted(self.save_events.items())
                  for event in range(1, count + 1)]
        return st.sampled_from(points) if points else st.nothing()

    @property
    def steps(self) -> list[int]:
        """Steps a fault may fire after (never the last: the job would be done)."""
        last = max(self.final_step - 1, 1)
        if self.every_step or self.checkpoint_every < 2:
            return list(range(1, last + 1))
        middle = [start + self.checkpoint_every // 2
                  for start in range(0, self.final_step, self.checkpoint_every)]
        return [s for s in middle if 1 <= s <= last] or [1]


def by_name(shape: JobShape) -> dict[str, st.SearchStrategy[str] | None]:
    """Every search name of every fault kind (`FaultKind.strategies`), for this job; None
    where the job cannot have it."""
    found: dict[str, st.SearchStrategy[str] | None] = {}
    for kind in loadable_kinds().values():
        found.update(kind.strategies(shape))
    return found


def kills(shape: JobShape) -> st.SearchStrategy[str]:
    """A rank killed after a step (SIGKILL: a crash, no chance to react)."""
    return by_name(shape)["kill"]  # type: ignore[return-value]


def faults(shape: JobShape, kinds: Sequence[str] = ("kill", "preempt", "save_kill")
           ) -> st.SearchStrategy[str]:
    """One fault of any of the search names `kinds` (e.g. `kill`, `preempt`, `node_kill`,
    `save_kill`, `power_loss`, `bitflip`, `hang`: each kind's `strategies`); names the job
    cannot have (no second node, no checkpoint saves) are left out."""
    named = by_name(shape)
    unknown = [k for k in kinds if k not in named]
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}"
                         f" (known: {', '.join(sorted(named))})")
    usable = [named[k] for k in kinds if named[k] is not None]
    if not usable:
        raise ValueError(f"none of the kinds {', '.join(kinds)} fits this job")
    return st.one_of(usable)  # type: ignore[arg-type]


def schedules(fault: st.SearchStrategy[str], max_faults: int = 3,
              min_faults: int = 1) -> st.SearchStrategy[list[str]]:
    """Schedules of distinct faults, in firing order as written. Hypothesis shrinks a
    list by dropping elements first, which is what a minimal schedule needs."""
    return st.lists(fault, min_size=min_faults, max_size=max_faults, unique=True)
