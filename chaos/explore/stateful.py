"""Faults as rules: a Hypothesis state machine whose steps add faults to a schedule.

Each rule adds one fault of one kind (`kill`, `preempt`, `save_kill`, ...) to
the schedule being built; at teardown the schedule runs as one chaos run and
must not fail. Hypothesis then explores sequences of rules and, on a failure,
shrinks the sequence: fewer rules, simpler faults. Runs go through `Trials`,
so a schedule met twice runs once and a failure is trusted only when it
repeats.

    from torchchaos.explore.stateful import chaos_machine

    TestTwoFailures = chaos_machine("train.py", args=["--steps", "200"],
                                    kinds=["kill", "save_kill"]).TestCase
    TestTwoFailures.settings = settings(max_examples=20, stateful_step_count=3,
                                        deadline=None)

`chaos_machine` runs the fault-free reference once, when it is called (the
steps and checkpoint saves the rules choose from come from it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from torchchaos.explore import strategies
from torchchaos.explore.search import FAIL, Trials, describe


def schedule_machine(trials: Trials, shape: strategies.JobShape,
                     kinds: Sequence[str] = ("kill", "preempt", "save_kill"),
                     max_faults: int = 3) -> type[RuleBasedStateMachine]:
    """A state machine class with one rule per fault kind (kinds the job cannot have
    are left out); its teardown judges the schedule the rules built."""
    strategies.faults(shape, kinds)  # refuses unknown kinds and jobs none of them fits
    namespace: dict[str, Any] = {"__init__": _init, "teardown": _teardown,
                                 "trials": trials, "max_faults": max_faults}
    for kind in kinds:
        try:
            fault = strategies.faults(shape, [kind])
        except ValueError:
            continue  # e.g. node_kill on a one-node job
        namespace[kind] = _rule_for(kind, fault)
    return type("ChaosSchedule", (RuleBasedStateMachine,), namespace)


def _init(self: Any) -> None:
    RuleBasedStateMachine.__init__(self)
    self.schedule: list[str] = []


def _rule_for(kind: str, fault: st.SearchStrategy[str]) -> Any:
    def add(self: Any, spec: str) -> None:
        # A full schedule ignores further faults (a precondition would leave Hypothesis
        # no rule to take); stateful_step_count bounds the steps anyway.
        if spec not in self.schedule and len(self.schedule) < self.max_faults:
            self.schedule.append(spec)

    add.__name__ = add.__qualname__ = kind  # Hypothesis prints the steps by this name
    return rule(spec=fault)(add)


def _teardown(self: Any) -> None:
    if self.schedule:
        if self.trials.judge(self.schedule) == FAIL:
            raise AssertionError(f"this schedule breaks the target: {describe(self.schedule)}")


def chaos_machine(script: str, args: Sequence[str] = (), kinds: Sequence[str] = ("kill",),
                  max_faults: int = 3, repeats: int = 2, max_runs: int = 50,
                  out_dir: Path | None = None, cache_dir: Path | None = None,
                  **scenario: Any) -> type[RuleBasedStateMachine]:
    """A state machine over real chaos runs of `script` (torchrun, `nproc` ranks, ...);
    runs go to out_dir/NN (default ./torchchaos-runs/stateful-<time>-<id>)."""
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore.schedule_runs import ScheduleRuns
    from torchchaos.harness.reference import default_cache_dir, get_reference
    from torchchaos.scenario.model import Scenario

    base = Scenario.build(script, args=list(args), **scenario)
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    out = (out_dir or Path("torchchaos-runs") / f"stateful-{stamp}").resolve()
    cache = (cache_dir or default_cache_dir()).resolve()
    history = get_reference(base, cache, lambda _msg: None).history()
    shape = strategies.JobShape.of(history, base.nodes)
    prepare_out_dir(out)
    trials = Trials(ScheduleRuns(base, out, cache), repeats, max_runs)
    return schedule_machine(trials, shape, kinds, max_faults)
