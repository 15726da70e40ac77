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

KINDS = ("kill", "preempt", "node_kill", "save_kill", "power_loss", "bitflip", "hang")


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

    @property
    def steps(self) -> list[int]:
        """Steps a fault may fire after (never the last: the job would be done)."""
        last = max(self.final_step - 1, 1)
        if self.every_step or self.checkpoint_every < 2:
            return list(range(1, last + 1))
        middle = [start + self.checkpoint_every // 2
                  for start in range(0, self.final_step, self.checkpoint_every)]
        return [s for s in middle if 1 <= s <= last] or [1]


def _ranks(shape: JobShape) -> st.SearchStrategy[int]:
    return st.integers(0, shape.world_size - 1)


def _steps(shape: JobShape) -> st.SearchStrategy[int]:
    return st.sampled_from(shape.steps)


def kills(shape: JobShape, signal: str = "SIGKILL") -> st.SearchStrategy[str]:
    """A rank killed after a step (SIGKILL: a crash, no chance to react)."""
    extra = "" if signal == "SIGKILL" else f",signal={signal}"
    return st.builds(lambda r, s: f"kill:rank={r},step={s}{extra}", _ranks(shape),
                     _steps(shape))


def preemptions(shape: JobShape) -> st.SearchStrategy[str]:
    """A preemption notice: SIGTERM, then SIGKILL after the grace period."""
    return kills(shape, "SIGTERM")


def node_kills(shape: JobShape) -> st.SearchStrategy[str]:
    """A whole node (its torchrun agent and workers) killed after a step."""
    return st.builds(lambda n, s: f"kill:node={n},step={s}", st.integers(0, shape.nodes - 1),
                     _steps(shape))


def _save_points(shape: JobShape) -> st.SearchStrategy[tuple[int, int]]:
    points = [(save, event) for save, count in sorted(shape.save_events.items())
              for event in range(1, count + 1)]
    return st.sampled_from(points) if points else st.nothing()


def save_kills(shape: JobShape) -> st.SearchStrategy[str]:
    """The writer killed right after a file event of one of its checkpoint saves."""
    return st.builds(lambda p: f"kill:rank={shape.writer},phase=checkpoint_save,"
                               f"save={p[0]},event={p[1]}", _save_points(shape))


def power_losses(shape: JobShape) -> st.SearchStrategy[str]:
    """A power loss on the writer's node right after a file event of a save (needs FUSE)."""
    return st.builds(lambda p: f"storage:mode=lose_unsynced,rank={shape.writer},"
                               f"phase=checkpoint_save,save={p[0]},event={p[1]}",
                     _save_points(shape))


def bitflips(shape: JobShape, tensors: Sequence[str] = ("param", "grad", "optim"),
             bits: Sequence[str] = ("sign", "exp_high", "mant_high")) -> st.SearchStrategy[str]:
    """One seeded element of a tensor kind gets one bit of a bit class flipped."""
    return st.builds(lambda r, s, t, b: f"bitflip:rank={r},step={s},tensor={t},bit={b}",
                     _ranks(shape), _steps(shape), st.sampled_from(list(tensors)),
                     st.sampled_from(list(bits)))


def hangs(shape: JobShape, modes: Sequence[str] = ("stop", "collective")) -> st.SearchStrategy[str]:
    """A rank stops making progress after a step (SIGSTOP, or held in a collective)."""
    return st.builds(lambda r, s, m: f"hang:rank={r},step={s},mode={m}", _ranks(shape),
                     _steps(shape), st.sampled_from(list(modes)))


_BY_KIND = {"kill": kills, "preempt": preemptions, "node_kill": node_kills,
            "save_kill": save_kills, "power_loss": power_losses, "bitflip": bitflips,
            "hang": hangs}


def faults(shape: JobShape, kinds: Sequence[str] = ("kill", "preempt", "save_kill")
           ) -> st.SearchStrategy[str]:
    """One fault of any of the kinds (names from KINDS); kinds the job cannot have (no
    second node, no checkpoint saves) are left out."""
    unknown = [k for k in kinds if k not in _BY_KIND]
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)} (known: {', '.join(KINDS)})")
    usable = [k for k in kinds if not (k == "node_kill" and shape.nodes < 2)
              and not (k in ("save_kill", "power_loss") and not shape.save_events)]
    if not usable:
        raise ValueError(f"none of the kinds {', '.join(kinds)} fits this job")
    return st.one_of([_BY_KIND[k](shape) for k in usable])


def schedules(fault: st.SearchStrategy[str], max_faults: int = 3,
              min_faults: int = 1) -> st.SearchStrategy[list[str]]:
    """Schedules of distinct faults, in firing order as written. Hypothesis shrinks a
    list by dropping elements first, which is what a minimal schedule needs."""
    return st.lists(fault, min_size=min_faults, max_size=max_faults, unique=True)
