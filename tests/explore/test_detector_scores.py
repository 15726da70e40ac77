"""Scoring SDC detectors (torchchaos.sdc.score): intervals, cells, requirements.

On trial results written by hand, so each number is known: the Wilson interval against
published values, a detector that misses is counted as missing, a masked fault is not
a miss, a late detection is out of bound, and a requirement on the interval's low end
fails where the low end is below it. A real campaign: tests/e2e/test_e2e_detectors.py.
"""

from __future__ import annotations

import pytest

from torchchaos.sdc import detectors, score


@pytest.mark.parametrize("k, n, low, high", [
    (0, 20, 0.0, 0.1611), (20, 20, 0.8389, 1.0), (5, 10, 0.2366, 0.7634),
    (1, 100, 0.0018, 0.0545)])
def test_the_wilson_interval_matches_published_values(k, n, low, high):
    got = score.wilson(k, n)
    assert got == pytest.approx((low, high), abs=1e-4)


def _trial(model, step, corrupted, **detected):
    return {"model": model, "step": step, "bit_class": "mant_high", "corrupted": corrupted,
            "detected": {"a": None, "b": None, **detected}}


RESULTS = [
    _trial("warp", 2, True, a=2, b=5),
    _trial("warp", 3, True, a=4),
    _trial("warp", 1, False),  # masked: nothing to detect
    _trial("clean", 1, False, b=3),
    _trial("clean", 1, False),
]


def test_a_cell_counts_detections_among_the_corrupted_trials_only():
    a, b = score.cells(RESULTS, ["a", "b"], bound=2)
    assert (a.trials, a.corrupted, a.detected, a.probability) == (3, 2, 2, 1.0)
    assert (a.latency_median, a.latency_worst, a.within_bound) == (0.5, 1, True)
    assert (b.detected, b.latency_worst, b.within_bound) == (1, 3, False)  # a miss, late


def test_false_alarms_are_counted_over_the_clean_trials():
    alarms = score.false_alarms(RESULTS, ["a", "b"])
    assert (alarms["a"]["alarms"], alarms["b"]["alarms"], alarms["b"]["clean"]) == (0, 1, 2)


def test_a_requirement_fails_on_the_intervals_low_end_and_on_the_bound():
    table = score.cells(RESULTS, ["a", "b"], bound=2)
    alarms = score.false_alarms(RESULTS, ["a", "b"])
    # 2 of 2 detected: the point estimate is 1, the low end 0.34
    assert score.requirement_failures(table, alarms, {"a": 0.3}, None, 2) == []
    failed = score.requirement_failures(table, alarms, {"a": 0.5, "b/warp": 0.1}, 0.9, 2)
    # a: 2 of 2 is not enough for 0.5; b: 1 of 2 (low end 0.095), its worst latency 3
    # beyond the bound, and its false alarm (high end above 0.9)
    assert [f.split(":")[0] for f in failed] == ["a on warp", "b on warp", "b on warp", "b"]
    assert "low end 0.095" in failed[1] and "bound 2" in failed[2]
    assert "false alarms 1 of 2" in failed[3]


def test_the_plot_has_a_bar_and_a_whisker_per_cell():
    svg = score.plot_svg(score.cells(RESULTS, ["a", "b"], bound=None), "t")
    assert svg.startswith("<svg") and svg.count("<rect") == 2 + 2  # bars + legend
    assert svg.count('stroke="black"') == 2


@pytest.mark.parametrize("spec, words", [
    ("replica:every=0", "must be above 0"), ("replica:often=3", "unknown parameter"),
    ("spike", "unknown detector"), ("grad_z:z=x", "needs a number")])
def test_a_bad_detector_spec_says_why(spec, words):
    with pytest.raises(ValueError, match=words):
        detectors.parse(spec)


def test_a_detector_whose_package_is_missing_is_named_with_how_to_install_it(monkeypatch):
    assert detectors.missing_package("megatron_rerun") is None  # installed by [test]
    monkeypatch.setitem(detectors.PACKAGES, "megatron_rerun",
                        ("megatron_is_not_here.core", "megatron-core"))
    said = detectors.missing_package("megatron_rerun:spiky=5")
    assert said == ("detector megatron_rerun needs megatron-core, which is not installed"
                    " (pip install megatron-core)")
    assert detectors.missing_package("rerun") is None


def test_decisions_a_detector_makes_per_trial_are_counted_in_its_cell():
    results = [
        {"model": "m", "bit_class": "", "step": 1, "corrupted": True,
         "detected": {"d": 1}, "decided": {"d": "stop"}},
        {"model": "m", "bit_class": "", "step": 1, "corrupted": True,
         "detected": {"d": 2}, "decided": {"d": "go on"}},
        {"model": "m", "bit_class": "", "step": 1, "corrupted": True,
         "detected": {"d": 1}, "decided": {"d": "stop"}},
        {"model": "m", "bit_class": "", "step": 1, "corrupted": True,
         "detected": {"d": None}, "decided": {"d": None}},
    ]
    (found,) = score.cells(results, ["d"], bound=None)
    assert found.decisions == {"stop": 2, "go on": 1}
    text = score.table_text([found], {}, {}, {"d": "declared"})
    assert "stop 2, go on 1" in text and "declared" not in text
