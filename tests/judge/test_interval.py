"""Young/Daly arithmetic and what the run measures for it, with known numbers."""

from __future__ import annotations

import math

import pytest
from conftest import TARGET

from torchchaos.cli import main as cli
from torchchaos.errors import UsageError
from torchchaos.judge import interval
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario


def test_young_daly_with_known_numbers():
    # C = 60 s, F = 3 h: sqrt(2 * 60 * 10800) = sqrt(1296000)
    assert interval.young_daly(60, 3 * 3600) == pytest.approx(1138.4, abs=0.05)
    assert interval.young_daly(0, 3600) == 0.0
    with pytest.raises(ValueError):
        interval.young_daly(60, 0)


def test_overhead_is_checkpoint_cost_plus_half_an_interval_per_failure():
    assert interval.overhead(600, 60, 10800) == pytest.approx(60 / 600 + 600 / 21600)
    best = interval.young_daly(60, 10800)
    assert interval.overhead(best, 60, 10800) == pytest.approx(math.sqrt(2 * 60 / 10800))
    # the Young/Daly interval is the minimum: both shorter and longer ones waste more
    assert interval.overhead(best / 2, 60, 10800) > interval.overhead(best, 60, 10800)
    assert interval.overhead(best * 2, 60, 10800) > interval.overhead(best, 60, 10800)


def _history(step_times: list[float], saves: list[tuple[float, float]]) -> History:
    events = [{"ev": "step", "t": t, "rank": 0, "pid": 7, "step": i + 1}
              for i, t in enumerate(step_times)]
    for number, (begin, end) in enumerate(saves, 1):
        events.append({"ev": "save_begin", "t": begin, "rank": 0, "pid": 7, "save": number})
        events.append({"ev": "save_end", "t": end, "rank": 0, "pid": 7, "save": number})
    events.append({"ev": "save_begin", "t": 99.0, "rank": 0, "pid": 7, "save": 9})  # unfinished
    return History(sorted(events, key=lambda e: e["t"]))


def test_measure_takes_the_mean_save_and_leaves_saves_out_of_the_step_time():
    # steps every 2 s, except the gap a 3 s save sits in; saves of 3 s and 1 s
    history = _history([0, 2, 4, 9, 11], [(4.5, 7.5), (11.5, 12.5)])
    measured = interval.measure(history)
    assert measured is not None
    assert measured.cost_seconds == pytest.approx(2.0) and measured.saves == 2
    assert measured.step_seconds == pytest.approx(2.0)
    assert interval.measure(_history([0, 1, 2], [])) is None  # no finished save


def test_recommend_in_seconds_and_steps_next_to_the_current_interval():
    measured = interval.Measured(cost_seconds=60.0, saves=3, step_seconds=2.0)
    data = interval.recommend(measured, 3.0, interval_steps=10)
    assert data["young_daly_seconds"] == pytest.approx(1138.4, abs=0.05)
    assert data["young_daly_steps"] == 569  # 1138.4 s / 2 s
    assert data["interval_seconds"] == 20.0
    assert data["overhead_now"] == pytest.approx(60 / 20 + 20 / 21600)
    assert data["mtbf_hours"] == 3.0 and data["cost_seconds"] == 60.0
    line = interval.summary(data)
    assert "every 10 steps" in line and "Young/Daly" in line and "19.0 min" in line
    assert "569 steps" in line and "MTBF 3 h" in line
    unknown = interval.recommend(interval.Measured(0.5, 1, None), 3.0, None)
    assert unknown["young_daly_steps"] is None and unknown["interval_seconds"] is None


def test_mtbf_option_reaches_the_scenario_and_must_be_positive():
    ns = cli.build_parser().parse_args(["run", "--mtbf", "6", str(TARGET)])
    assert cli._scenario(ns, ns.script, ns.args, []).mtbf_hours == 6.0
    with pytest.raises(UsageError, match="--mtbf must be > 0"):
        Scenario.build(str(TARGET), mtbf_hours=0)
