"""sdc_detected and the corruption analysis on hand-written histories."""

from __future__ import annotations

from histories import Timeline, evidence, fp, reference

from torchchaos.judge import checkers, sdc


def flipped_run(detect_after: int | None = None, corrupt_rank: int = 1,
                spread_to_all: bool = False, recover: bool = False) -> Timeline:
    """Two replicas; a weight of `corrupt_rank` is flipped after step 10. From step 11
    its state differs (or every rank's, if the corruption was all-reduced); a detection
    after `detect_after` is followed by a rollback to step 10 that replays exactly."""
    t = Timeline()
    t.train(2, range(1, 11))
    t.add("fault", id="f0-bitflip", kind="bitflip", step=10, **t.proc(corrupt_rank))
    t.add("bitflip", id="f0-bitflip", tensor="param", step=10, when="after", name="w",
          index=3, bit=30, bit_class="exp_high", before=0.1, after=3e37,
          **t.proc(corrupt_rank))
    last = detect_after or 20
    for step in range(11, last + 1):
        for rank in range(2):
            bad = spread_to_all or rank == corrupt_rank
            prints = fp(step, params_start=f"bad@{step}", params=f"bad@{step}") if bad \
                else fp(step, grads=f"bad@{step}")
            t.add("step", step=step, local=step, loss=1.0, fp=prints, **t.proc(rank))
    if detect_after is not None:
        t.add("detection", what="sdc", step=detect_after, **t.proc(0))
        for step in range(11 if recover else detect_after + 1, 21):
            for rank in range(2):
                prints = fp(step) if recover else fp(step, params=f"bad@{step}")
                t.add("step", step=step, local=step, loss=1.0, fp=prints, **t.proc(rank))
    return t


def test_replicas_are_the_ranks_the_reference_keeps_equal():
    assert sdc.replica_groups(reference()) == [[0, 1]]
    sharded = Timeline()
    sharded.train(2, range(1, 5), fps=None)
    for e in sharded.events:
        if e["ev"] == "step" and e["rank"] == 1:
            e["fp"] = {**e["fp"], "params": "shard1"}
    assert sdc.replica_groups(sharded.history()) == []


def test_an_undetected_flip_names_the_replica_and_the_step_and_fails():
    ev = evidence(flipped_run().history())
    result = checkers.sdc_detected(ev)
    assert result.ok is False and result.detail.startswith("undetected silent data corruption")
    assert "replicas disagree from step 11 (rank(s) 1 differ)" in result.detail
    assert result.data["outcome"] == "silent divergence"
    assert result.data["replica_divergent_step"] == 11
    assert result.data["reference_divergent_ranks"] == [0, 1]
    assert "10 step(s) on corrupted state" in result.detail


def test_a_flip_spread_to_every_replica_is_found_by_the_reference_only():
    result = checkers.sdc_detected(evidence(flipped_run(spread_to_all=True).history()))
    assert result.ok is False and "the replicas stayed equal to each other" in result.detail
    assert result.data["replica_divergent_step"] is None
    assert result.data["reference_divergent_step"] == 11


def test_a_detection_within_the_bound_that_rolls_back_exactly_passes():
    result = checkers.sdc_detected(evidence(flipped_run(detect_after=13, recover=True)
                                            .history()))
    assert result.ok is True and result.data["outcome"] == "detected"
    assert "noticed 3 step(s) later" in result.detail and result.data["bound_steps"] == 5


def test_a_late_detection_or_a_wrong_ending_fails():
    late = checkers.sdc_detected(evidence(flipped_run(detect_after=17, recover=True).history()))
    assert late.ok is False and "more than the bound of 5 steps" in late.detail
    assert checkers.sdc_detected(evidence(flipped_run(detect_after=17, recover=True).history(),
                                          max_detect_steps=8)).ok is True
    wrong = checkers.sdc_detected(evidence(flipped_run(detect_after=12).history()))
    assert wrong.ok is False and "did not end bitwise equal" in wrong.detail


def test_a_flip_that_changes_nothing_is_masked_and_no_flip_is_undecided():
    t = Timeline()
    t.train(2, range(1, 11))
    t.add("bitflip", id="f0-bitflip", tensor="activation", step=10, when="during",
          bit_class="mant_low", **t.proc(0))
    t.train(2, range(11, 21))
    result = checkers.sdc_detected(evidence(t.history()))
    assert result.ok is True and result.data["outcome"] == "masked"
    assert checkers.sdc_detected(evidence(reference())).ok is None


def test_a_crashed_or_hung_run_is_classified_so():
    crashed = checkers.sdc_detected(evidence(flipped_run().history(), completed=False))
    assert crashed.ok is False and crashed.data["outcome"] == "crash"
    hung = checkers.sdc_detected(evidence(flipped_run().history(), deadline_hit=True))
    assert hung.ok is False and hung.data["outcome"] == "hang"


def test_deterministic_resume_leaves_an_in_memory_flip_to_sdc_detected():
    result = checkers.deterministic_resume(evidence(flipped_run().history()))
    assert result.ok is None and "sdc_detected" in result.detail
