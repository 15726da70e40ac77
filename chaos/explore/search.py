"""Search fault schedules for one that breaks the target, and shrink it.

The engine knows nothing of torchrun: it is given a function that runs one
schedule and says "pass", "fail" or "error" (the CLI's runs a real chaos run).
Three pieces:

- `Trials` runs each distinct schedule at most once (plus repeats), counts the
  runs against a budget, and trusts a failure only when every repeat fails
  too; a schedule that fails some of the time is *flaky* and is neither a
  failure to shrink towards nor a pass.
- `hypothesis_search` lets Hypothesis draw schedules and shrink the first
  failure it finds; a run Hypothesis asks for twice is answered from `Trials`.
- `ddmin` is plain delta debugging over a schedule's faults (Zeller's
  algorithm): the result fails, and dropping any one fault makes it pass.

Real jobs are slow (seconds per run), so the budget counts runs, and once it
is spent every schedule not yet run counts as passing: shrinking then stops
with the smallest failure confirmed so far.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

PASS, FAIL, ERROR, FLAKY, NOT_RUN = "pass", "fail", "error", "flaky", "not run"
RunSchedule = Callable[[list[str]], str]  # a schedule -> PASS | FAIL | ERROR


@dataclass
class Trials:
    """Every schedule run so far, with the outcome it came to."""

    run: RunSchedule
    repeats: int = 2  # runs of a failing schedule before the failure is trusted
    max_runs: int = 50
    say: Callable[[str], None] = lambda _msg: None
    outcomes: dict[tuple[str, ...], str] = field(default_factory=dict)
    runs: int = 0
    pause_at: int | None = None  # a lower, temporary budget (one phase's share)

    def judge(self, schedule: Sequence[str]) -> str:
        # A schedule is a set: each fault has its own trigger, so the order they are
        # written in changes nothing, and [a, b] and [b, a] are one run.
        key = tuple(sorted(schedule))
        if key not in self.outcomes:
            if self.runs >= min(self.max_runs, self.pause_at or self.max_runs):
                return NOT_RUN  # budget spent: not a failure, and not remembered as a pass
            self.outcomes[key] = self._run(list(key))
        return self.outcomes[key]

    def fails(self, schedule: Sequence[str]) -> bool:
        return self.judge(schedule) == FAIL

    def _run(self, schedule: list[str]) -> str:
        seen = []
        for attempt in range(self.repeats):
            if attempt and self.runs >= self.max_runs:
                break  # cannot confirm: a failure seen once is not trusted
            self.runs += 1
            seen.append(self.run(schedule))
            self.say(f"run {self.runs}/{self.max_runs}: {seen[-1].upper():5} {describe(schedule)}")
            if seen[-1] != FAIL:
                break
        if seen == [FAIL] * self.repeats:
            return FAIL
        return FLAKY if FAIL in seen else seen[-1]

    @property
    def budget_spent(self) -> bool:
        return self.runs >= self.max_runs

    @property
    def flaky(self) -> list[list[str]]:
        return [list(k) for k, v in self.outcomes.items() if v == FLAKY]

    @property
    def failing(self) -> list[list[str]]:
        return [list(k) for k, v in self.outcomes.items() if v == FAIL]


def describe(schedule: Sequence[str]) -> str:
    return " ".join(schedule) or "(no fault)"


class _Failing(Exception):
    """Raised inside Hypothesis's test so that it shrinks towards this schedule."""


def hypothesis_search(trials: Trials, strategy: st.SearchStrategy[list[str]],
                      seed: int = 0, max_examples: int = 20,
                      shrink_runs: int = 10) -> list[str] | None:
    """Draw up to max_examples schedules until one fails; return it as Hypothesis shrank
    it in at most shrink_runs more runs, or None when none failed."""

    @hypothesis_seed(seed)
    @settings(max_examples=max_examples, database=None, deadline=None,
              phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
              report_multiple_bugs=False, verbosity=Verbosity.quiet, print_blob=False)
    @given(strategy)
    def probe(schedule: list[str]) -> None:
        if trials.fails(schedule):
            if trials.pause_at is None:  # the first failure: shrinking begins
                trials.pause_at = trials.runs + shrink_runs
            raise _Failing(schedule)

    try:
        probe()
    except _Failing as found:
        return sorted(found.args[0])
    finally:
        trials.pause_at = None
    return None


def ddmin(schedule: Sequence[str], fails: Callable[[list[str]], bool]) -> list[str]:
    """The smallest sub-schedule that still fails, in the sense that dropping any one
    of its faults makes it pass. `schedule` itself must fail."""
    faults = list(schedule)
    chunks = 2
    while len(faults) >= 2:
        parts = _split(faults, chunks)
        smaller = next((p for p in parts if fails(p)), None)
        if smaller is not None:
            faults, chunks = smaller, 2
            continue
        if chunks > 2 or len(parts) > 2:  # with two parts each complement is the other part
            complement = next((c for c in (_without(faults, p) for p in parts) if fails(c)),
                              None)
            if complement is not None:
                faults, chunks = complement, max(chunks - 1, 2)
                continue
        if chunks >= len(faults):
            break
        chunks = min(len(faults), chunks * 2)
    return faults


def _split(items: list[str], parts: int) -> list[list[str]]:
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        out.append(items[start:end])
        start = end
    return [p for p in out if p]


def _without(items: list[str], part: list[str]) -> list[str]:
    rest = list(items)
    for item in part:
        rest.remove(item)
    return rest


@dataclass
class SearchResult:
    found: list[str] | None  # the first failure Hypothesis shrank to, or None
    minimal: list[str] | None  # after delta debugging: no fault can be dropped
    runs: int
    flaky: list[list[str]]
    budget_spent: bool  # then `minimal` may still hold a fault that could be dropped


def search(trials: Trials, strategy: st.SearchStrategy[list[str]], seed: int = 0,
           max_examples: int = 20, shrink_runs: int = 10) -> SearchResult:
    """Hypothesis finds and shrinks a failing schedule (simpler ranks and steps too, within
    shrink_runs runs); delta debugging then makes sure no fault of it can be dropped."""
    found = hypothesis_search(trials, strategy, seed, max_examples, shrink_runs)
    minimal = ddmin(found, trials.fails) if found else None
    return SearchResult(found, minimal, trials.runs, trials.flaky, trials.budget_spent)
