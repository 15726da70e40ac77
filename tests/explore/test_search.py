"""The search engine on its own: schedules judged by a plain function, no torchrun.

The engine only ever sees "run this schedule, tell me the outcome", so these
tests give it functions with a known answer (a bug that needs two particular
faults, a flaky one, a budget) and check what it finds and how many runs it
spends. End-to-end searches over real runs are in test_e2e_search.py.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchchaos.explore import search, strategies
from torchchaos.rundir.history import History

SHAPE = strategies.JobShape(world_size=2, final_step=20, checkpoint_every=5,
                            save_events={1: 4, 2: 4})
ALL_KINDS = strategies.faults(SHAPE, sorted(strategies.by_name(SHAPE)))
PAIR = {"kill:rank=1,step=7", "kill:rank=0,step=17"}


def pair_bug(schedule: list[str]) -> str:
    """Fails exactly when both faults of PAIR are in the schedule."""
    return search.FAIL if PAIR <= set(schedule) else search.PASS


def counting(outcome):
    calls = []

    def run(schedule: list[str]) -> str:
        calls.append(list(schedule))
        return outcome(schedule)

    return run, calls


def test_job_shape_steps_land_mid_interval():
    assert SHAPE.steps == [2, 7, 12, 17]
    assert strategies.JobShape(2, 20, checkpoint_every=5, every_step=True).steps == list(
        range(1, 20))
    assert strategies.JobShape(2, 1).steps == [1]


def test_job_shape_from_a_history():
    events = [{"ev": "save_begin", "t": 1, "rank": 0, "after_step": 5},
              {"ev": "save_begin", "t": 2, "rank": 0, "after_step": 10}]
    events += [{"ev": "file", "t": 3 + i, "rank": 0, "save": 2, "index": i + 1}
               for i in range(3)]
    events += [{"ev": "step", "t": 9 + r, "rank": r, "step": 12} for r in (0, 1)]
    shape = strategies.JobShape.of(History(events))
    assert (shape.world_size, shape.final_step, shape.checkpoint_every) == (2, 12, 5)
    assert shape.save_events == {2: 3}


@given(strategies.schedules(ALL_KINDS, max_faults=4))
def test_every_drawn_schedule_parses_and_fits_the_job(schedule):
    from torchchaos.scenario.spec import parse_fault_spec

    assert 1 <= len(schedule) <= 4 and len(set(schedule)) == len(schedule)
    for spec in schedule:
        parsed = parse_fault_spec(spec)
        if parsed.target_type == "rank":
            assert 0 <= int(parsed.target) < SHAPE.world_size
        if parsed.trigger.step is not None:
            assert parsed.trigger.step in SHAPE.steps


def test_faults_refuses_unknown_and_unusable_kinds():
    with pytest.raises(ValueError, match="unknown fault kind"):
        strategies.faults(SHAPE, ["explode"])
    with pytest.raises(ValueError, match="fits this job"):
        strategies.faults(SHAPE, ["node_kill"])  # one node


def test_user_strategies_compose():
    mine = st.just("hang:rank=1,step=7,mode=stop")
    schedule = strategies.schedules(st.one_of(strategies.kills(SHAPE), mine), max_faults=2)
    seen = set()

    @given(schedule)
    def collect(s):
        seen.update(s)

    collect()
    assert "hang:rank=1,step=7,mode=stop" in seen and any(s.startswith("kill:") for s in seen)


def test_ddmin_finds_the_pair_among_noise():
    noise = [f"kill:rank={r},step={s}" for r in (0, 1) for s in (2, 12)]
    schedule = noise[:2] + ["kill:rank=1,step=7"] + noise[2:] + ["kill:rank=0,step=17"]
    run, calls = counting(pair_bug)
    trials = search.Trials(run, repeats=1)
    assert sorted(search.ddmin(schedule, trials.fails)) == sorted(PAIR)
    assert len({tuple(c) for c in calls}) == len(calls)  # no sub-schedule runs twice
    assert len(calls) <= 16  # of the 63 non-empty sub-schedules


def test_ddmin_result_is_one_minimal_for_random_bugs():
    rng = random.Random(7)
    for _ in range(50):
        faults = [f"f{i}" for i in range(rng.randint(1, 8))]
        needed = set(rng.sample(faults, rng.randint(1, len(faults))))

        def fails(s, needed=needed):
            return needed <= set(s)

        minimal = search.ddmin(faults, fails)
        assert set(minimal) == needed
        assert all(not fails([f for f in minimal if f != drop]) for drop in minimal)


def test_search_finds_and_shrinks_the_pair_in_few_runs():
    run, calls = counting(pair_bug)
    trials = search.Trials(run, repeats=2, max_runs=60)
    strategy = strategies.schedules(strategies.kills(SHAPE), max_faults=4)
    result = search.search(trials, strategy, seed=1, max_examples=60)
    assert result.minimal is not None and sorted(result.minimal) == sorted(PAIR)
    assert not result.flaky and not result.budget_spent
    distinct = {tuple(c) for c in calls}
    assert len(calls) == result.runs and len(calls) <= 60
    # a run happens once per distinct schedule, plus one repeat for each failure seen
    failures = [c for c in distinct if pair_bug(list(c)) == search.FAIL]
    assert len(calls) == len(distinct) + len(failures)


def test_a_bug_no_schedule_hits_is_reported_as_none():
    run, calls = counting(lambda s: search.PASS)
    trials = search.Trials(run, max_runs=100)
    result = search.search(trials, strategies.schedules(strategies.kills(SHAPE), 2), 0, 10)
    assert result.found is None and result.minimal is None and 1 <= len(calls) <= 10


def test_a_failure_that_does_not_repeat_is_flaky_not_a_failure():
    outcomes = iter([search.FAIL, search.PASS] * 50)
    trials = search.Trials(lambda s: next(outcomes), repeats=2)
    assert trials.judge(["kill:rank=0,step=2"]) == search.FLAKY
    assert trials.runs == 2 and trials.flaky == [["kill:rank=0,step=2"]]
    assert not trials.fails(["kill:rank=0,step=2"])  # judged once: no new run
    assert trials.runs == 2


def test_errors_are_not_failures():
    trials = search.Trials(lambda s: search.ERROR, repeats=3)
    assert trials.judge(["x"]) == search.ERROR and trials.runs == 1


def test_the_budget_caps_runs_and_says_so():
    run, calls = counting(pair_bug)
    trials = search.Trials(run, repeats=2, max_runs=3)
    schedule = ["kill:rank=1,step=7", "kill:rank=0,step=2", "kill:rank=0,step=17"]
    assert trials.judge(schedule) == search.FAIL  # 2 runs
    minimal = search.ddmin(schedule, trials.fails)
    assert len(calls) == 3 and trials.runs == 3
    assert trials.judge(["never", "run"]) == search.NOT_RUN
    assert pair_bug(minimal) == search.FAIL  # never worse than what it was given


def test_the_state_machine_finds_and_shrinks_the_pair():
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from torchchaos.explore.stateful import schedule_machine

    run, calls = counting(pair_bug)
    machine = schedule_machine(search.Trials(run, repeats=2), SHAPE, ["kill", "preempt"])
    assert {"kill", "preempt"} <= set(vars(machine))  # faults are rules, one per kind
    with pytest.raises(AssertionError, match="breaks the target") as failure:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=300, stateful_step_count=5, deadline=None, database=None,
            derandomize=True))
    shown = str(failure.value).split(": ", 1)[1].split()
    assert sorted(shown) == sorted(PAIR)  # shrunk to the two faults that matter
    assert len({tuple(c) for c in calls}) == len(calls) - sum(
        1 for c in {tuple(c) for c in calls} if pair_bug(list(c)) == search.FAIL)


def test_the_state_machine_leaves_out_kinds_the_job_cannot_have():
    from torchchaos.explore.stateful import schedule_machine

    machine = schedule_machine(search.Trials(pair_bug), SHAPE, ["kill", "node_kill"])
    assert "kill" in vars(machine) and "node_kill" not in vars(machine)


def test_a_schedule_this_job_cannot_have_is_an_error_of_that_run_only(tmp_path):
    # runs.run_row turns what the engine refuses before any process starts into that
    # run's ERROR: the search goes on with its other schedules instead of stopping
    from conftest import TARGET

    from torchchaos.explore.schedule_runs import ScheduleRuns
    from torchchaos.scenario.model import Scenario

    said: list[str] = []
    runs = ScheduleRuns(Scenario(script=str(TARGET), nproc=2), tmp_path / "out",
                        tmp_path / "cache", said.append)
    assert runs(["kill:rank=7,step=1"]) == search.ERROR
    assert runs.reports == [(["kill:rank=7,step=1"], None)]
    assert len(said) == 1 and "rank=7" in said[0] and "2 rank" in said[0], said
    assert not (tmp_path / "cache").exists()  # refused before any reference run
