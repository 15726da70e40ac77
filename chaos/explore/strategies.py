"""Hypothesis strategies for fault schedules.

Strategies only describe which schedules exist; they run nothing. The search
engine (`torchchaos.explore.search`) draws from them, runs real jobs and shrinks. Every
strategy produces fault spec *strings*, the language of `--fault`, so a drawn
schedule can be printed, pasted on a command line and saved as a replay file,
and user strategies compose with these through the usual combinators:

    from hypothesis import strategies as st
    from torchchaos.explore import strategies as cs

    shape = cs.JobShape(world_size=2, final_step=20, checkpoint_every=5)
    my_fault = st.sampled_from(["hang:rank=1,step=7,mode=stop"])
    schedule = cs.schedules(st.one_of(cs.kills(shape), my_fault), max_faults=3)

Steps are drawn from `JobShape.steps`: by default one step in the middle of
each checkpoint interval (where a failure costs work), so a search covers the
job with few distinct schedules and shrinking has few candidates to run.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from torchchaos.faults.registry import loadable_kinds
from torchchaos.faults.shape import JobShape  # noqa: F401  (cs.JobShape, as documented)


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
