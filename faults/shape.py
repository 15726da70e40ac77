"""What a schedule may aim at in one job: its ranks, nodes, steps and saves.

Each fault kind's `strategies(shape)` draws its specs from a `JobShape`, so the shape
sits beside the contract, below every kind and every explorer. Hypothesis is imported
only when a strategy is asked for: the ranks load the kinds and never need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hypothesis import strategies as st

    from torchchaos.rundir.history import History


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
        from hypothesis import strategies as st

        return st.integers(0, self.world_size - 1)

    def a_node(self) -> st.SearchStrategy[int]:
        from hypothesis import strategies as st

        return st.integers(0, self.nodes - 1)

    def a_step(self) -> st.SearchStrategy[int]:
        from hypothesis import strategies as st

        return st.sampled_from(self.steps)

    def a_save_point(self) -> st.SearchStrategy[tuple[int, int]]:
        """(save, file event) of the writer's saves."""
        from hypothesis import strategies as st

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
