"""Checkers on hand-written histories: every verdict and every diagnosis."""

from __future__ import annotations

import pytest
from histories import Timeline, evidence, fp, reference

from torchchaos.judge import checkers
from torchchaos.judge.checks_by_name import run_checks


def killed_and_resumed(restored: int = 10, kill_step: int = 12, **train: object) -> Timeline:
    """Rank 1 dies after step kill_step; the restart resumes from `restored`."""
    timeline = Timeline()
    timeline.train(2, range(1, kill_step + 1))
    timeline.fault(1, kill_step)
    timeline.train(2, range(restored + 1, 21), attempt=1, restored=restored, **train)
    return timeline


def test_clean_recovery_passes_every_check():
    ev = evidence(killed_and_resumed().history())
    results = run_checks(ev)
    assert {name: r.ok for name, r in results.items()} == {
        "completes": True, "atomic_recovery": True, "deterministic_resume": True,
        "bounded_lost_work": True, "no_orphans": True,
        "durable_checkpoints": None,  # no power loss: durability was not tested
        "sdc_detected": None,  # no bit flip
        "hang_detected": None,  # no hang
        "no_split_brain": None}  # no partition
    assert results["bounded_lost_work"].data["lost_steps"] == [2]
    assert results["bounded_lost_work"].data["ettr"] == pytest.approx(0.5)


def test_completes_fails_on_deadline_and_on_exit_code_and_on_short_run():
    history = killed_and_resumed().history()
    assert checkers.completes(evidence(history, deadline_hit=True)).ok is False
    failed = checkers.completes(evidence(history, completed=False, exit_codes=[[1]],
                                         log_tail="RuntimeError: boom"))
    assert failed.ok is False and "RuntimeError: boom" in failed.detail
    short = Timeline()
    short.train(2, range(1, 15))
    assert "stopped at step 14 of 20" in checkers.completes(evidence(short.history())).detail


def test_atomic_recovery_undecided_without_a_recovery():
    plain = Timeline()
    plain.train(2, range(1, 21))
    assert checkers.atomic_recovery(evidence(plain.history())).ok is None


def killed_then_reading(rank: int) -> Timeline:
    """Rank 1 dies after step 12; `rank`'s restarted worker reads a checkpoint and stops."""
    timeline = Timeline()
    timeline.train(2, range(1, 13))
    timeline.fault(1, 12)
    timeline.add("boot", **timeline.proc(rank, attempt=1))
    timeline.add("load", path="ckpt/step-10.pt", **timeline.proc(rank, attempt=1))
    return timeline


def test_atomic_recovery_flags_a_resume_that_raises():
    timeline = killed_then_reading(0)
    timeline.add("exception", type="UnpicklingError", message="invalid load key\nmore",
                 before_first_step=True, after_load=True, **timeline.proc(0, attempt=1))
    result = checkers.atomic_recovery(evidence(timeline.history(), completed=False))
    assert result.ok is False
    assert "resume failed on rank 0" in result.detail
    assert "UnpicklingError: invalid load key" in result.detail


def test_a_resume_that_raises_an_exception_without_a_message_is_named():
    """EOFError() from torch.load of a truncated file has an empty message (the matrix's
    epoch_snapshot/in_place case ended in an IndexError inside the checker)."""
    timeline = killed_then_reading(0)
    timeline.add("exception", type="EOFError", message="", **timeline.proc(0, attempt=1))
    result = checkers.atomic_recovery(evidence(timeline.history(), completed=False))
    assert result.ok is False and "EOFError: (no message)" in result.detail


def test_atomic_recovery_flags_a_resume_that_dies_without_a_recorded_exception():
    timeline = killed_then_reading(1)
    ev = evidence(timeline.history(), completed=False, log_tail="EOFError: Ran out of input")
    result = checkers.atomic_recovery(ev)
    assert result.ok is False and "last output: EOFError: Ran out of input" in result.detail


def test_a_failed_resume_of_a_checkpoint_written_in_place_says_so():
    timeline = killed_then_reading(0)
    for op, index in (("open", 1), ("write", 2)):
        timeline.add("file", op=op, path="ckpt/step-10.pt", save=2, index=index,
                     **timeline.proc(0))
    timeline.add("exception", type="UnpicklingError", message="invalid load key",
                 **timeline.proc(0, attempt=1))
    result = checkers.atomic_recovery(evidence(timeline.history(), completed=False))
    assert result.ok is False
    assert result.detail.startswith("the checkpoint is written in place: a crash in the"
                                     " middle of the write left no loadable checkpoint")


def killed_then_restarted(first_restart: list[tuple[str, dict]], then_trains: bool = True
                          ) -> Timeline:
    """Rank 1 dies after step 12; in the first restart rank 1 records `first_restart`'s
    events and dies; the second restart resumes from step 10 if `then_trains`."""
    timeline = Timeline()
    timeline.train(2, range(1, 13))
    timeline.fault(1, 12)
    for rank in (0, 1):
        timeline.add("boot", **timeline.proc(rank, attempt=1))
    for ev, fields in first_restart:
        timeline.add(ev, **fields, **timeline.proc(1, attempt=1))
    if then_trains:
        timeline.train(2, range(11, 21), attempt=2, restored=10)
    return timeline


def test_a_restart_that_dies_before_reading_anything_is_a_false_start_of_the_next():
    """A transient start-up death (a port still held, a rendezvous timeout) that the
    job's next restart gets past: not a failed resume, and lost work is decided."""
    timeline = killed_then_restarted([("exception", {"type": "RuntimeError",
                                                     "message": "Connection reset by peer",
                                                     "before_first_step": True})])
    results = run_checks(evidence(timeline.history()))
    assert results["atomic_recovery"].ok is True, results["atomic_recovery"].detail
    assert ("1 restart(s) died before their first step (RuntimeError: Connection reset by"
            " peer), and the job resumed on the next") in results["atomic_recovery"].detail
    assert results["bounded_lost_work"].ok is True
    assert results["bounded_lost_work"].data["lost_steps"] == [2]


@pytest.mark.parametrize(("first_restart", "peer_restored"), [
    # it loaded a checkpoint and died of it, then the next restart trained from another
    ([("load", {"path": "ckpt/step-10.pt"}),
      ("exception", {"type": "UnpicklingError", "message": "invalid load key",
                     "after_load": True})], False),
    # rank 0 restored, rank 1 raised reading its shard: a partly begun attempt
    ([("load", {"path": "ckpt/step-10/shard-1.pt"}),
      ("exception", {"type": "RuntimeError", "message": "shard 1 is short",
                     "after_load": True})], True),
], ids=["loaded and died", "one rank restored"])
def test_a_restart_that_read_a_checkpoint_and_died_is_a_failed_resume(first_restart,
                                                                      peer_restored):
    timeline = killed_then_restarted(first_restart)
    if peer_restored:
        timeline.add("restore", restored=10, match="exact", **timeline.proc(0, attempt=1))
    result = checkers.atomic_recovery(evidence(timeline.history()))
    assert result.ok is False and "resume failed on rank 1" in result.detail, result.detail


def test_a_start_up_death_with_no_restart_that_trains_stays_a_failed_resume():
    """The last restart dies too (the job gave up), or the next one restored and died
    before its first step: nothing trained after, so the first death is the cause."""
    died = [("exception", {"type": "RuntimeError", "message": "cannot start",
                           "before_first_step": True})]
    gave_up = killed_then_restarted(died, then_trains=False)
    result = checkers.atomic_recovery(evidence(gave_up.history(), completed=False))
    assert result.ok is False and "RuntimeError: cannot start" in result.detail
    restored_then_died = killed_then_restarted(died, then_trains=False)
    for rank in (0, 1):
        restored_then_died.add("boot", **restored_then_died.proc(rank, attempt=2))
        restored_then_died.add("restore", restored=10, match="exact",
                               **restored_then_died.proc(rank, attempt=2))
    result = checkers.atomic_recovery(evidence(restored_then_died.history(), completed=False))
    assert result.ok is False and "RuntimeError: cannot start" in result.detail, result.detail


def test_atomic_recovery_does_not_blame_a_resume_cut_short_by_another_fault():
    timeline = killed_then_reading(0)
    timeline.fault(1, 0, attempt=1)  # e.g. a kill during checkpoint_load on the peer
    timeline.train(2, range(11, 21), attempt=2, restored=10)
    assert checkers.atomic_recovery(evidence(timeline.history())).ok is True


def test_atomic_recovery_ignores_errors_of_surviving_ranks_before_the_restart():
    timeline = Timeline()
    timeline.train(2, range(1, 13))
    timeline.fault(1, 12)
    # rank 0's all-reduce fails because its peer died: mid-training, not a resume
    timeline.add("exception", type="RuntimeError", message="Connection closed by peer",
                 before_first_step=False, after_load=True, **timeline.proc(0))
    timeline.train(2, range(11, 21), attempt=1, restored=10)
    assert checkers.atomic_recovery(evidence(timeline.history())).ok is True


def test_a_first_run_that_matches_no_reference_state_is_nondeterministic():
    timeline = killed_and_resumed()
    for event in timeline.events:
        if event["ev"] == "restore":
            event["restored"], event["match"] = None, None
    ev = evidence(timeline.history())
    for check in (checkers.atomic_recovery, checkers.deterministic_resume):
        result = check(ev)
        assert result.ok is None and result.data["nondeterministic"] is True
        assert "rank 0 started from a state the reference run never had" in result.detail


def test_atomic_recovery_flags_a_restore_matching_no_step():
    timeline = killed_and_resumed()
    for event in timeline.events:
        if event["ev"] == "restore" and event["attempt"] == 1 and event["rank"] == 1:
            event["restored"], event["match"] = None, None
    result = checkers.atomic_recovery(evidence(timeline.history()))
    assert result.ok is False and "matches no step" in result.detail


@pytest.mark.parametrize("component,key,words", [
    ("weights", "params_start", "weights not restored"),
    ("optimizer", "optim_start", "optimizer not restored"),
    ("lr_schedule", "lr", "LR schedule not restored"),
    ("rng (torch)", "rng.torch", "RNG not restored (torch)"),
    ("data", "batch", "data not restored"),
])
def test_deterministic_resume_names_the_first_divergent_step_and_component(component, key,
                                                                          words):
    wrong = {step: fp(step, **{key: "different", "params": "different"}) for step in
             range(11, 21)}  # the culprit, and the weights it spoiled
    ev = evidence(killed_and_resumed(fps=wrong).history())
    result = checkers.deterministic_resume(ev)
    assert result.ok is False
    assert result.data["divergent_step"] == 11 and result.data["component"] == component
    assert f"at step 11 on rank 0: {words}" in result.detail


@pytest.mark.parametrize("state,restarted,words", [
    (True, True, "optimizer and LR schedule not restored (the learning rate starts over"),
    (False, True, "LR schedule not restored (the learning rate starts over"),
    (True, False, "optimizer not restored (its learning rate differs too)"),
    (False, False, "LR schedule not restored"),
])
def test_an_optimizer_and_a_schedule_that_start_over_are_both_named(state, restarted, words):
    """DeepSpeed#6691's "universal" resume: the weights loaded, the optimizer's moments
    and the LR schedule reset, so the learning rate from step 11 on is step 1's on."""
    def resumed(step: int) -> dict[str, str]:
        lr = f"lr@{step - 10}" if restarted else "lr@other"
        return fp(step, lr=lr, params="different",
                  **({"optim_start": "fresh"} if state else {}))

    wrong = {step: resumed(step) for step in range(11, 21)}
    result = checkers.deterministic_resume(evidence(killed_and_resumed(fps=wrong).history()))
    assert result.ok is False and f"at step 11 on rank 0: {words}" in result.detail, result.detail
    assert ("starts over" in result.detail) is restarted


def light(prints: dict[str, str], params: bool = True) -> dict[str, str]:
    """What the agent keeps of a step outside its full windows."""
    return {key: prints[key] for key in ("lr", "batch", "loss", *(["params"] if params else []))}


def test_light_steps_that_match_pass():
    lights = {step: light(fp(step)) for step in range(16, 21)}  # after the 5-step window
    result = checkers.deterministic_resume(evidence(killed_and_resumed(fps=lights).history()))
    assert result.ok is True and "all 44 steps matched" in result.detail


def test_a_divergence_first_seen_on_a_light_step_is_caught_without_a_culprit():
    lights = {step: light(fp(step)) for step in range(16, 21)}
    lights[18] = light(fp(18, params="different"))
    result = checkers.deterministic_resume(evidence(killed_and_resumed(fps=lights).history()))
    assert result.ok is False and result.data["divergent_step"] == 18
    assert result.data["component"] == "unknown"
    assert "lightly fingerprinted step" in result.detail and "--full-fingerprints" in result.detail


def test_a_light_step_without_parameters_catches_a_divergence_by_its_loss():
    lights = {step: light(fp(step), params=step % 4 == 0) for step in range(16, 21)}
    lights[17] = light(fp(17, loss="different"), params=False)
    result = checkers.deterministic_resume(evidence(killed_and_resumed(fps=lights).history()))
    assert result.ok is False and result.data["divergent_step"] == 17
    assert "lightly fingerprinted step" in result.detail


def test_a_light_step_still_names_the_data_or_lr_when_those_differ():
    lights = {step: light(fp(step, batch="different", params="different"))
              for step in range(16, 21)}
    result = checkers.deterministic_resume(evidence(killed_and_resumed(fps=lights).history()))
    assert result.ok is False and result.data["component"] == "data"


def test_when_ranks_diverge_together_the_rank_whose_own_state_was_wrong_is_named():
    # Rank 0 resumed with the wrong RNG; rank 1 only got its averaged gradients.
    timeline = Timeline()
    timeline.train(2, range(1, 13))
    timeline.fault(1, 12)
    for rank, changed in ((1, {"grads": "mixed"}), (0, {"rng.torch": "other", "batch": "b"})):
        timeline.add("step", step=11, local=1, loss=1.0, fp=fp(11, params="p", **changed),
                     **timeline.proc(rank, attempt=1))
    result = checkers.deterministic_resume(evidence(timeline.history()))
    assert result.ok is False and result.data["rank"] == 0, result.detail
    assert result.data["component"] == "rng (torch)"


def test_the_lost_work_bound_includes_the_latency_of_an_asynchronous_save():
    # Saves after steps 5, 10, 15 each written in the background and committed a
    # step later: a failure just before a commit costs interval + 1 steps.
    timeline = Timeline()
    timeline.train(1, range(1, 21), save_every=0)
    for number, step in enumerate((5, 10, 15), start=1):
        timeline.add("save_begin", save=number, after_step=step, **timeline.proc(0))
        timeline.add("save_end", save=number, last_step=step + 1, **timeline.proc(0))
    ev = evidence(killed_and_resumed(5, 11).history(), ref=timeline.history())
    assert ev.checkpoint_interval() == 6
    assert checkers.bounded_lost_work(ev).ok is True


def test_an_unseeded_generator_is_neither_a_divergence_nor_a_culprit():
    # python's `random` is never seeded: it differs from the reference in every step
    noisy = {step: fp(step, **{"rng.python": f"noise{step}"}) for step in range(1, 21)}
    clean = killed_and_resumed(fps=noisy)
    assert checkers.deterministic_resume(evidence(clean.history())).ok is True
    spoiled = {step: fp(step, **{"rng.python": f"noise{step}", "batch": "other",
                                 "params": "other"}) for step in range(1, 21)}
    for step in range(1, 13):
        spoiled[step] = noisy[step]
    timeline = Timeline()
    timeline.train(2, range(1, 13), fps=noisy)
    timeline.fault(1, 12)
    timeline.train(2, range(11, 21), attempt=1, restored=10, fps=spoiled)
    result = checkers.deterministic_resume(evidence(timeline.history()))
    assert result.ok is False and result.data["component"] == "data"


def test_deterministic_resume_reports_a_nondeterministic_target_instead_of_failing():
    timeline = Timeline()
    timeline.train(2, range(1, 13), fps={3: fp(3, batch="other", params="other")})
    timeline.fault(1, 12)
    timeline.train(2, range(11, 21), attempt=1, restored=10)
    result = checkers.deterministic_resume(evidence(timeline.history()))
    assert result.ok is None and "not deterministic without faults" in result.detail
    assert "step 3 on rank 0 differs from the reference before any fault fired (data;" in (
        result.detail)
    assert "or a stale cached reference" in result.detail and "--cache-dir" in result.detail
    proven = evidence(killed_and_resumed().history(), reference_deterministic=False,
                      reference_detail="two fault-free runs differ at step 4 on rank 0")
    assert checkers.deterministic_resume(proven).ok is None


def test_deterministic_resume_fails_when_steps_cannot_be_aligned():
    timeline = killed_and_resumed()
    for event in timeline.events:
        if event["ev"] == "step" and event["attempt"] == 1:
            event["aligned"] = False
    assert checkers.deterministic_resume(evidence(timeline.history())).ok is False


def test_a_run_stopped_on_purpose_after_its_recovery_completes():
    timeline = Timeline()
    timeline.train(2, range(1, 13))
    timeline.fault(1, 12)
    timeline.train(2, range(11, 14), attempt=1, restored=10)  # stopped 3 steps after
    stopped = evidence(timeline.history(), stopped=True)
    assert checkers.completes(stopped).ok is True
    assert "stopped as asked at step 13 of 20" in checkers.completes(stopped).detail
    assert checkers.deterministic_resume(stopped).ok is True
    assert checkers.completes(evidence(timeline.history())).ok is False


def test_bounded_lost_work_uses_the_reference_checkpoint_interval():
    ok = checkers.bounded_lost_work(evidence(killed_and_resumed(10, 14).history()))
    assert ok.ok is True and ok.data["bound_steps"] == 5 and ok.data["lost_steps"] == [4]
    too_much = checkers.bounded_lost_work(evidence(killed_and_resumed(5, 14).history()))
    assert too_much.ok is False
    assert "redid 9 steps after the failure at step 14 (resumed from step 5)" in too_much.detail


def test_bounded_lost_work_obeys_explicit_bounds():
    history = killed_and_resumed(10, 14).history()
    assert checkers.bounded_lost_work(evidence(history, max_lost_steps=3)).ok is False
    assert checkers.bounded_lost_work(evidence(history, max_lost_steps=4)).ok is True
    slow = checkers.bounded_lost_work(evidence(history, max_lost_seconds=0.5))
    assert slow.ok is False and "bound is 0.5 s" in slow.detail


def test_bounded_lost_work_undecided_without_failures():
    plain = Timeline()
    plain.train(2, range(1, 21))
    assert checkers.bounded_lost_work(evidence(plain.history())).ok is None


def test_a_job_without_checkpoints_that_starts_over_is_never_a_pass():
    """Defect 7 (issue 17): a job that saves nothing and restarts from step 0 read PASS."""
    never_saves = Timeline()
    never_saves.train(2, range(1, 21), save_every=0)
    no_bound = checkers.bounded_lost_work(evidence(killed_and_resumed(0, 12).history(),
                                                   never_saves.history()))
    assert no_bound.ok is False
    assert "saves no checkpoint" in no_bound.detail and "redid 12 step(s)" in no_bound.detail
    allowed = checkers.bounded_lost_work(evidence(killed_and_resumed(0, 12).history(),
                                                  never_saves.history(), max_lost_steps=12))
    assert allowed.ok is True


def test_no_orphans():
    history = killed_and_resumed().history()
    assert checkers.no_orphans(evidence(history, leftovers=[4242])).ok is False
    reaped = checkers.no_orphans(evidence(history, reaped=[4242]))
    assert reaped.ok is True and "reaped 1" in reaped.detail


def _partitioned(digest_of_node_1: str) -> Timeline:
    """Two nodes (one rank each) cut apart at t=1; each publishes ckpt/step-8.pt."""
    timeline = Timeline()
    timeline.add("nemesis_begin", id="f0", kind="partition", window=1, nodes="1 | 0")
    for rank, digest in ((0, "aaaa" * 16), (1, digest_of_node_1)):
        timeline.add("boot", node=rank, **timeline.proc(rank))
        timeline.add("file", op="rename", path="ckpt/step-8.pt", digest=digest,
                     **timeline.proc(rank))
    timeline.add("nemesis_end", id="f0", kind="partition", window=1)
    # after the heal, node 1 publishing other contents is a resume, not a split brain
    timeline.add("file", op="rename", path="ckpt/step-12.pt", digest="cccc" * 16,
                 **timeline.proc(1))
    return timeline


def test_split_brain_is_two_nodes_publishing_different_contents_while_cut():
    split = checkers.no_split_brain(evidence(_partitioned("bbbb" * 16).history()))
    assert split.ok is False, split.detail
    assert split.detail == ("split brain during partition 1 | 0: ckpt/step-8.pt published with"
                            " different contents by node 0 (aaaaaaaaaaaa), node 1 (bbbbbbbbbbbb)")
    same = checkers.no_split_brain(evidence(_partitioned("aaaa" * 16).history()))
    assert same.ok is True and "(2 file(s) published while the network was cut)" in same.detail
    no_cut = checkers.no_split_brain(evidence(killed_and_resumed().history()))
    assert no_cut.ok is None


# -- issue 17: verdicts on training code written by other people -----------------------

def per_rank_saves(ranks: int = 2, steps: int = 20, every: int = 10) -> Timeline:
    """Every rank writes its own part of each checkpoint (per-rank files + a pointer)."""
    timeline = Timeline()
    timeline.train(ranks, range(1, steps + 1), save_every=0)
    for e in list(timeline.events):
        if e["ev"] == "step" and e["step"] % every == 0:
            save = e["step"] // every
            timeline.events.append({**e, "ev": "save_begin", "save": save,
                                    "after_step": e["step"], "t": e["t"] + 0.1})
            timeline.events.append({**e, "ev": "save_end", "save": save, "ended": "step",
                                    "t": e["t"] + 0.2})
    return timeline


def power_loss_in_save_2(rank_0_ended: str, rank_1_done: bool, loss_before_ends: bool
                         ) -> Timeline:
    """Both ranks write their part of the step-20 checkpoint; the power goes out on rank 1.

    Rank 0 ends its part as `rank_0_ended`; rank 1 ends its part (and goes on) only if
    `rank_1_done`. The harness records the power loss (fs_crash) after the job reacted.
    """
    timeline = per_rank_saves(steps=19)
    timeline.train(2, range(20, 21), save_every=0)
    for rank in (0, 1):
        timeline.add("save_begin", save=2, after_step=20, **timeline.proc(rank))
    def fire() -> None:
        timeline.add("fault", id="f0-storage", kind="storage", step=20,
                     spec="storage:mode=lose_unsynced", **timeline.proc(1))

    if loss_before_ends:
        fire()
    if rank_0_ended == "exception":
        timeline.add("exception", type="RuntimeError", message="Connection closed by peer",
                     **timeline.proc(0))
    timeline.add("save_end", save=2, ended=rank_0_ended, **timeline.proc(0))
    if rank_1_done:
        timeline.add("save_end", save=2, ended="step", **timeline.proc(1))
    if not loss_before_ends:
        fire()
    timeline.add("fs_crash", lose_unsynced=True, fault="f0-storage",
                 removed=["ckpt/step000020-rank1.pt"])
    timeline.train(2, range(11, 21), attempt=1, restored=10, save_every=0)
    return timeline


@pytest.mark.parametrize("rank_0_ended,rank_1_done,loss_before_ends,ok", [
    ("exception", False, True, True),  # rank 0's save died with its peer: not finished
    ("step", False, True, True),  # rank 1's part never finished: no job checkpoint
    ("step", True, True, True),  # both ended after the fault fired, recorded before fs_crash
    ("step", True, False, False),  # both finished and went on, then the power went out
])
def test_durability_counts_only_checkpoints_every_writer_finished_before_the_loss(
        rank_0_ended, rank_1_done, loss_before_ends, ok):
    """Defect 1: a correct per-rank-files job read FAIL because rank 0's save, aborted
    when its peer died, counted as finished, and the loss counted from when the
    harness recorded it rather than when it fired."""
    ref = per_rank_saves().history()
    chaos = power_loss_in_save_2(rank_0_ended, rank_1_done, loss_before_ends).history()
    result = checkers.durable_checkpoints(evidence(chaos, ref))
    assert result.ok is ok, result.detail
    if not ok:
        assert "step 20 was finished before the power loss" in result.detail


def killed_after_its_signal_save(left_after: int | None) -> Timeline:
    """Rank 0 saves step 12 on a scheduler's signal (no fsync: open, write, rename) and
    is killed by the requeue before its next step or teardown: no `save_end`. It
    entered a barrier of its own after `left_after` of those events (None: never).
    The nodes then lose power, which takes the unsynced step-12 file."""
    timeline = per_rank_saves(ranks=1, steps=12)
    timeline.add("save_begin", save=2, after_step=12, **timeline.proc(0))
    events = [("open", "ckpt/.step-12.tmp"), ("write", "ckpt/.step-12.tmp"),
              ("rename", "ckpt/step-12.pt")]
    for index, (op, path) in enumerate(events, 1):
        timeline.add("file", op=op, path=path, save=2, index=index, **timeline.proc(0))
        if index == left_after:
            timeline.add("save_left", save=2, events=index, op="barrier", **timeline.proc(0))
    timeline.add("fault", id="f0-power", kind="storage", step=12,
                 spec="storage:mode=lose_unsynced", **timeline.proc(0))
    timeline.add("fs_crash", lose_unsynced=True, fault="f0-power", emptied=[],
                 removed=["ckpt/step-12.pt"])
    timeline.train(1, range(11, 21), attempt=1, restored=10, save_every=0)
    return timeline


def writes_its_pointer_after_a_barrier() -> Timeline:
    """The fault-free run of a shards, barrier, pointer protocol: rank 0 goes on
    writing its save (the pointer) after the script's own barrier."""
    timeline = per_rank_saves(ranks=1)
    for e in [e for e in timeline.events if e["ev"] == "save_begin"]:
        proc = {key: e[key] for key in ("rank", "pid", "launch", "attempt")}
        timeline.events += [
            {**proc, "ev": "file", "op": "write", "path": "shard", "save": e["save"],
             "index": 1, "t": e["t"] + 0.01},
            {**proc, "ev": "save_left", "save": e["save"], "events": 1, "op": "barrier",
             "t": e["t"] + 0.02},
            {**proc, "ev": "file", "op": "rename", "path": "latest", "save": e["save"],
             "index": 2, "t": e["t"] + 0.03}]
    return timeline


@pytest.mark.parametrize("left_after,reference,ok", [
    (3, per_rank_saves, False),  # it went on from the whole save: finished, the loss took it
    (None, per_rank_saves, True),  # killed inside its save: no finished checkpoint was lost
    (2, per_rank_saves, True),  # it went on, then wrote more: killed before going on again
    # its barrier comes before the rest of its save, as the fault-free run shows:
    (3, writes_its_pointer_after_a_barrier, True),
])
def test_a_save_the_rank_went_on_from_is_finished_though_it_was_killed_before_its_next_step(
        left_after, reference, ok):
    """CI miss: the lab script's unsynced save on SIGUSR1 was judged unfinished when
    the requeue killed rank 0 between its barrier and its teardown, so the power loss
    that took it was no durability failure. And the false alarm the first fix made on
    shard_pointer: a barrier between the shards and the pointer is no save's end."""
    ref = (reference(ranks=1) if reference is per_rank_saves else reference()).history()
    chaos = killed_after_its_signal_save(left_after).history()
    result = checkers.durable_checkpoints(evidence(chaos, ref))
    assert result.ok is ok, result.detail
    if not ok:
        assert "step 12 was finished before the power loss" in result.detail


def snapshot_start(fps: dict[int, dict[str, str]]) -> Timeline:
    """A crash-point run: it starts from the reference's copy of the step-10 checkpoint
    (so its first process reads a checkpoint), crashes in its first save, recovers."""
    timeline = Timeline()
    timeline.train(2, range(11, 13), restored=10, fps=fps, save_every=0)
    for e in timeline.events:
        if e["ev"] == "restore":
            e["loads"] = 1
    timeline.fault(0, 12)
    timeline.train(2, range(11, 21), attempt=1, restored=10, fps=fps, save_every=0)
    for e in timeline.events:
        if e["ev"] == "restore":
            e.setdefault("loads", 1)
    return timeline


def test_a_run_started_from_a_snapshot_is_a_recovery_not_proof_of_nondeterminism():
    """Defect 3: a resume that does not restore the RNG, started from a snapshot, read
    ERROR "the target is not deterministic without faults"."""
    wrong = {step: fp(step, **{"rng.torch": "other", "batch": "other", "params": "x"})
             for step in range(11, 21)}
    ev = evidence(snapshot_start(wrong).history())
    assert checkers.nondeterminism(ev) is None
    result = checkers.deterministic_resume(ev)
    assert result.ok is False, result.detail
    assert "RNG not restored (torch; the data order depends on it)" in result.detail


def test_a_batch_of_another_step_names_the_data_position_before_the_rng():
    """Issue 30, item 4: the PyTorch DDP tutorial saves the epoch one short and replays
    it; its global RNG differs too (an unused per-iterator seed draw), and the verdict
    read "RNG not restored", though step 11 trained on step 7's batch."""
    replayed = {step: fp(step, **{"rng.torch": "drawn once more", "batch": f"batch@{step - 4}",
                                  "params": "x"}) for step in range(11, 21)}
    result = checkers.deterministic_resume(evidence(killed_and_resumed(fps=replayed).history()))
    assert result.ok is False
    assert result.detail.startswith("diverged from the reference at step 11 on rank")
    assert ": data position not restored: step 11 was given the batch of step 7" in result.detail
    assert "the RNG differs too (torch), second to the data" in result.detail
    assert result.data["cause"] == "data position not restored"  # what the timeline says
    # a batch of no other step: the RNG (the data order drawn from it) is still named
    fresh = {step: fp(step, **{"rng.torch": "other", "batch": "never seen", "params": "x"})
             for step in range(11, 21)}
    result = checkers.deterministic_resume(evidence(killed_and_resumed(fps=fresh).history()))
    assert "RNG not restored (torch; the data order depends on it)" in result.detail


def test_a_generator_the_reference_never_draws_from_is_never_the_culprit():
    """Defect 7: "rng" was blamed where the data was replayed."""
    ref = Timeline()
    ref.train(2, range(1, 21), fps={s: fp(s, **{"rng.python": "seeded"}) for s in range(21)})
    replayed = {step: fp(step, **{"rng.python": "unseeded", "batch": f"batch@{step - 4}",
                                  "params": "x"}) for step in range(11, 21)}
    ev = evidence(killed_and_resumed(fps=replayed).history(), ref.history())
    result = checkers.deterministic_resume(ev)
    assert result.ok is False
    assert "data position not restored: step 11 was given the batch of step 7" in result.detail


def test_a_restart_that_dies_before_its_first_step_without_reading_is_a_failed_recovery():
    """Defect 5: a framework that rejects the half-written folder before opening a file."""
    timeline = Timeline()
    timeline.train(2, range(1, 13))
    timeline.fault(0, 12)
    for rank in (0, 1):
        timeline.add("boot", **timeline.proc(rank, attempt=1))
    timeline.add("exception", type="ValueError",
                 message="Can't find a valid checkpoint at out/checkpoint-20",
                 **timeline.proc(0, attempt=1))
    ev = evidence(timeline.history(), completed=False, exit_codes=[[1]])
    result = checkers.atomic_recovery(ev)
    assert result.ok is False
    assert "Can't find a valid checkpoint at out/checkpoint-20" in result.detail


def test_ranks_that_restore_different_steps_are_a_torn_job_checkpoint():
    """Defect 6: rank 0 restored step 10, rank 1 step 20, and atomic_recovery passed."""
    timeline = Timeline()
    timeline.train(2, range(1, 21))
    timeline.fault(0, 20)
    timeline.train(2, range(11, 21), attempt=1, restored=10)
    for e in timeline.events:
        if e["ev"] == "restore" and e["attempt"] == 1 and e["rank"] == 1:
            e["restored"] = 20
    ev = evidence(timeline.history())
    result = checkers.atomic_recovery(ev)
    assert result.ok is False
    assert "rank 0 step 10, rank 1 step 20" in result.detail
    assert "3+ ranks" not in checkers.deterministic_resume(ev).detail


def test_a_run_with_more_steps_than_the_reference_does_not_complete():
    """Defect 7: "reached step 24 of 20" read PASS."""
    timeline = killed_and_resumed()
    timeline.train(2, range(21, 25), attempt=1, restored=None, save_every=0)
    result = checkers.completes(evidence(timeline.history()))
    assert result.ok is False and "reached step 24 of 20" in result.detail


def test_a_restart_from_zero_despite_a_committed_checkpoint_is_named():
    timeline = Timeline()
    timeline.train(2, range(1, 13))
    for e in list(timeline.events):
        if e["ev"] == "save_begin":
            timeline.events.append({**e, "ev": "save_end", "ended": "step", "t": e["t"] + .5})
            timeline.events.append({**e, "ev": "file", "op": "rename", "index": 1,
                                    "path": f"ckpt/step-{e['after_step']}.pt",
                                    "t": e["t"] + .2})
    timeline.fault(1, 12)
    timeline.train(2, range(1, 21), attempt=1, restored=0)
    restart = [e for e in timeline.events if e["ev"] == "save_begin" and e["attempt"] == 1]
    timeline.events.append({**restart[0], "ev": "file", "op": "rename", "index": 1,
                            "path": "ckpt/step-10.pt", "t": restart[0]["t"] + .2})
    result = checkers.bounded_lost_work(evidence(timeline.history()))
    assert result.ok is False
    assert ("did not resume: started again from step 0 although the checkpoint of step 10"
            " was committed") in result.detail
    assert ("a restart overwrote the newer checkpoint of step 10 with an older state (step 5)"
            " in ckpt/step-10.pt") in result.detail


def _restart_from_zero(kill_at: int) -> Timeline:
    """Checkpoints finished at steps 5 and 10, a kill at `kill_at`, and a restart that
    trains from step 0 again (issue 41, item 2: a writer whose completion marker is never
    written)."""
    timeline = Timeline()
    timeline.train(2, range(1, kill_at + 1))
    for e in list(timeline.events):
        if e["ev"] == "save_begin":
            timeline.events.append({**e, "ev": "save_end", "ended": "step", "t": e["t"] + .5})
    timeline.fault(1, kill_at)
    timeline.train(2, range(1, 21), attempt=1, restored=0)
    return timeline


def test_a_background_save_is_over_at_its_last_event_not_when_its_rank_says_so():
    """A writer thread that lives across saves: its save of step 10 is said over only when
    the writer begins the next one (`next_save`), here after the kill at step 12, though
    its last write came at step 10. The checkpoint was whole before the failure: the
    restart from step 0 passed over it (issue 59)."""
    timeline = _restart_from_zero(12)
    kill = next(e for e in timeline.events if e["ev"] == "fault")
    for e in timeline.events:
        if e["ev"] == "save_end" and e["attempt"] == 0 and e["save"] == 2:
            e.update(ended="next_save", last_t=e["t"], t=kill["t"] + 0.1)
    timeline.events.sort(key=lambda e: e["t"])
    result = checkers.bounded_lost_work(evidence(timeline.history()))
    assert result.ok is False and "the checkpoint of step 10 was committed" in result.detail
    for e in timeline.events:  # said over after the kill, and over only then: not finished
        if e["ev"] == "save_end" and e.get("last_t") is not None:
            e["last_t"] = e["t"]
    result = checkers.bounded_lost_work(evidence(timeline.history()))
    assert "the checkpoint of step 5 was committed" in result.detail, result.detail


def test_a_restart_from_zero_fails_even_where_the_steps_redone_fit_the_bound():
    """Issue 41, item 2: 12 steps redone fit a bound of 20, but the job passed over the
    committed checkpoint of step 10; the next failure, at step 90, would lose 90."""
    history = _restart_from_zero(12).history()
    result = checkers.bounded_lost_work(evidence(history, max_lost_steps=20))
    assert result.ok is False
    assert result.detail.startswith("did not resume: started again from step 0 although the"
                                    " checkpoint of step 10 was committed")
    resumed = Timeline()  # the correct job: the same kill, resumed from step 10
    resumed.train(2, range(1, 13))
    resumed.fault(1, 12)
    resumed.train(2, range(11, 21), attempt=1, restored=10)
    assert checkers.bounded_lost_work(evidence(resumed.history(), max_lost_steps=20)).ok


def test_a_power_loss_the_checkpoint_survived_is_no_durability_failure_of_a_job_that_started_over():
    """The checkpoint of step 10 outlived the power loss whole; the job started again from
    step 0 beside it. That is the resume's fault (bounded_lost_work), not durability's:
    blaming the power loss sent the user after an fsync that was there."""
    timeline = Timeline()
    timeline.train(2, range(1, 13))
    for e in list(timeline.events):
        if e["ev"] == "save_begin":
            timeline.events.append({**e, "ev": "save_end", "ended": "step", "t": e["t"] + .5})
    timeline.add("fault", id="f0-storage", kind="storage", step=12,
                 spec="storage:mode=lose_unsynced,rank=0,step=12", **timeline.proc(0))
    timeline.add("fs_crash", lose_unsynced=True, fault="f0-storage", removed=[])
    timeline.train(2, range(1, 21), attempt=1, restored=0)
    ev = evidence(timeline.history())
    durable = checkers.durable_checkpoints(ev)
    assert durable.ok is True, durable.detail
    lost = checkers.bounded_lost_work(ev)
    assert lost.ok is False and lost.detail.startswith(
        "did not resume: started again from step 0 although the checkpoint of step 10"), \
        lost.detail
    # where the loss did take a file, starting over may be the loss's doing: durability
    # fails, as on a snapshot saved without fsync (the matrix's epoch_snapshot no_fsync)
    crash = next(e for e in timeline.events if e["ev"] == "fs_crash")
    crash["removed"] = ["ckpt/step-10.pt"]
    durable = checkers.durable_checkpoints(evidence(timeline.history()))
    assert durable.ok is False and "step 10 was finished" in durable.detail, durable.detail


def test_a_restart_from_zero_after_bit_rot_took_the_checkpoint_is_no_ignored_one():
    """Starting over is the right thing once a fault destroyed the checkpoints: the
    bound (one interval more per destroyed checkpoint) judges it, not the rule above."""
    timeline = _restart_from_zero(12)
    kill = next(e for e in timeline.events if e["ev"] == "fault")
    timeline.events.append({**kill, "ev": "fs_bitrot", "file": "ckpt/step-10.pt",
                            "t": kill["t"] - .1})
    result = checkers.bounded_lost_work(evidence(timeline.history(), max_lost_steps=20))
    assert result.ok is True, result.detail


def test_a_save_killed_mid_write_is_no_newer_checkpoint_a_restart_overwrote():
    """Issue 30, item 5 (nanoGPT as shipped): the save of step 10 was killed mid-write
    and never finished; the restart from step 0 then writes the same file at step 5.
    There was no checkpoint of step 10 to overwrite: say what happened instead."""
    timeline = Timeline()
    timeline.train(2, range(1, 11), save_every=0)
    timeline.add("save_begin", save=1, after_step=10, **timeline.proc(0))
    timeline.add("file", op="open", path="out/ckpt.pt", save=1, index=1, **timeline.proc(0))
    timeline.fault(0, 10)
    timeline.train(2, range(1, 21), attempt=1, restored=0)
    restart = next(e for e in timeline.events if e["ev"] == "save_begin" and e["attempt"] == 1)
    timeline.events.append({**restart, "ev": "file", "op": "open", "index": 1,
                            "path": "out/ckpt.pt", "t": restart["t"] + .2})
    result = checkers.bounded_lost_work(evidence(timeline.history()))
    assert result.ok is False and "redid 10 steps after the failure" in result.detail
    assert "overwrote" not in result.detail, result.detail


def judged(spec: str, chaos: Timeline):
    from torchchaos.report import verdict
    from torchchaos.scenario import schedule
    from torchchaos.scenario.spec import parse_fault_spec

    faults = schedule.resolve([parse_fault_spec(spec)], 0, 2, 1)
    for e in chaos.events:
        if e["ev"] == "fault":
            e["id"] = faults[0].id
    return verdict.judge(evidence(chaos.history()), faults, None)


def test_a_storage_fault_over_a_folder_the_job_never_uses_is_no_pass():
    """Defect 7: a power loss on the default ckpt/ of a job saving to out/ read PASS."""
    timeline = killed_and_resumed()
    timeline.add("file", op="rename", path="out/ckpt.pt", save=1, index=1,
                 **timeline.proc(0))
    timeline.add("fs_crash", lose_unsynced=True, fault="f0-storage")
    report = judged("storage:mode=lose_unsynced,rank=0,step=12", timeline)
    assert report.verdict == "error"
    assert "touched nothing" in report.reason and "it uses out" in report.reason
    report = judged("storage:mode=lose_unsynced,rank=0,step=12,dir=out", timeline)
    assert "touched nothing" not in report.reason


def test_bit_rot_that_found_no_file_is_no_pass():
    timeline = killed_and_resumed()
    timeline.add("file", op="rename", path="ckpt/step-10.pt", save=1, index=1,
                 **timeline.proc(0))
    timeline.add("fs_bitrot", file=None, pattern="*")
    report = judged("storage:mode=bitrot,rank=0,step=12", timeline)
    assert report.verdict == "error" and "no durable checkpoint file" in report.reason


def test_a_checkpoint_the_target_reported_committed_counts_as_finished():
    ref = per_rank_saves().history()
    timeline = power_loss_in_save_2("exception", False, True)
    fired = next(e for e in timeline.events if e["ev"] == "fault")
    timeline.events.append({"ev": "committed", "step": 20, "t": fired["t"] - 0.5,
                            **timeline.proc(0)})
    result = checkers.durable_checkpoints(evidence(timeline.history(), ref))
    assert result.ok is False and "step 20 was finished" in result.detail


def test_a_restart_after_the_last_step_that_dies_is_no_failed_resume():
    """A worker that died at exit after the final step (torch's gloo teardown) is
    restarted, reads the last checkpoint, has nothing to do and dies again."""
    timeline = killed_and_resumed()
    timeline.add("boot", **timeline.proc(1, attempt=2))
    timeline.add("load", path="ckpt/step-20.pt", **timeline.proc(1, attempt=2))
    assert checkers.atomic_recovery(evidence(timeline.history())).ok is True


def test_a_checkpoint_a_power_loss_dropped_is_not_overwritten_by_the_restart():
    timeline = Timeline()
    timeline.train(2, range(1, 13))
    for e in list(timeline.events):
        if e["ev"] == "save_begin":
            timeline.events.append({**e, "ev": "file", "op": "open", "index": 1,
                                    "path": "out/ckpt.pt", "t": e["t"] + .2})
    timeline.fault(0, 12)
    timeline.add("fs_crash", lose_unsynced=True, fault="f0-kill", removed=["ckpt.pt"])
    timeline.train(2, range(1, 21), attempt=1, restored=0)
    restart = next(e for e in timeline.events if e["ev"] == "save_begin" and e["attempt"])
    timeline.events.append({**restart, "ev": "file", "op": "open", "index": 1,
                            "path": "out/ckpt.pt", "t": restart["t"] + .2})
    result = checkers.bounded_lost_work(evidence(timeline.history()))
    assert result.ok is False and "overwrote" not in result.detail
    assert checkers._among("out/ckpt.pt", ["ckpt.pt"])
    assert checkers._among("out/checkpoint-10/config.json", ["checkpoint-10"])
    assert not checkers._among("out/checkpoint-100/config.json", ["checkpoint-10"])


def restart_onto(timeline: Timeline, attempt: int, params: str, optim: str) -> None:
    """Both ranks restart and restore a state that matches no reference step."""
    for rank in range(2):
        timeline.add("boot", **timeline.proc(rank, attempt=attempt))
        timeline.add("restore", restored=None, match=None,
                     fp={"params_start": params, "optim_start": optim},
                     **timeline.proc(rank, attempt=attempt))


def test_a_restart_onto_a_checkpoint_saved_after_a_diverged_resume_blames_the_resume():
    """Seen on the Lightning target: a kill at step 7, a resume from step 5 that diverges
    at step 6, the job done at step 14, then one more restart (torch's gloo teardown
    abort) that loads the checkpoint of step 10. That checkpoint is whole, a faithful
    save of the diverged state; the cause is the first resume, not a torn file."""
    timeline = Timeline()
    timeline.train(2, range(1, 8))
    timeline.fault(0, 7)
    astray = {s: fp(s, batch="other" if s == 6 else f"batch@{s}", params=f"x@{s}",
                    optim=f"o@{s}", **({"params_start": f"x@{s - 1}", "optim_start": f"o@{s - 1}"}
                                       if s > 6 else {})) for s in range(6, 15)}
    timeline.train(2, range(6, 15), attempt=1, restored=5, fps=astray)
    restart_onto(timeline, attempt=2, params="x@10", optim="o@10")
    for step in range(1, 5):
        for rank in range(2):
            timeline.add("step", step=step, local=step, aligned=False, loss=1.0,
                         fp=fp(step, params=f"y@{step}"), **timeline.proc(rank, attempt=2))
    ev = evidence(timeline.history(), reference(14))
    atomic = checkers.atomic_recovery(ev)
    assert atomic.ok is True, atomic.detail
    assert "rank 0 restored this run's own step 10, rank 1 restored this run's own step 10" in (
        atomic.detail)
    resume = checkers.deterministic_resume(ev)
    assert resume.ok is False and resume.detail.startswith(
        "diverged from the reference at step 6 on rank"), resume.detail


def test_a_restore_that_matches_nothing_this_run_had_is_still_torn():
    timeline = Timeline()
    timeline.train(2, range(1, 8))
    timeline.fault(0, 7)
    restart_onto(timeline, attempt=1, params="torn", optim="torn")
    atomic = checkers.atomic_recovery(evidence(timeline.history(), reference(14)))
    assert atomic.ok is False and "matches no step of the reference (torn" in atomic.detail


def _in_place_save_then_power_loss(later_save_wrote: bool) -> Timeline:
    """nanoGPT's way: rank 0 saves out/ckpt.pt in place every 10 steps and never
    fsyncs. Save 1 finished at step 10 and training went on; at step 14 the power goes
    out and the file goes back to its last fsync (empty: never). `later_save_wrote`:
    save 2 had begun rewriting the file first (then what was reverted was its bytes)."""
    timeline = Timeline()
    timeline.train(2, range(1, 11), save_every=0)
    timeline.add("save_begin", save=1, after_step=10, **timeline.proc(0))
    for op in ("open", "write"):
        timeline.add("file", op=op, path="out/ckpt.pt", save=1, index=1, **timeline.proc(0))
    timeline.add("save_end", save=1, ended="step", **timeline.proc(0))
    if later_save_wrote:
        timeline.train(2, range(11, 21), save_every=0)
        timeline.add("save_begin", save=2, after_step=20, **timeline.proc(0))
        timeline.add("file", op="open", path="out/ckpt.pt", save=2, index=1,
                     **timeline.proc(0))
    else:
        timeline.train(2, range(11, 15), save_every=0)
    timeline.add("fault", id="f0-storage", kind="storage", step=14,
                 spec="storage:mode=lose_unsynced", **timeline.proc(0))
    timeline.add("fs_crash", lose_unsynced=True, fault="f0-storage", removed=[],
                 reverted_files=["ckpt.pt"], restored=[])
    relaunched = {"launch": 1, "attempt": 1}  # (attempt 1: pids of their own)
    for rank in (0, 1):
        timeline.add("boot", **timeline.proc(rank, **relaunched))
    timeline.add("load", path="out/ckpt.pt", **timeline.proc(0, **relaunched))
    timeline.add("exception", type="EOFError", message="Ran out of input",
                 **timeline.proc(0, **relaunched))
    return timeline


def test_a_finished_checkpoint_a_power_loss_emptied_is_named_as_lost():
    """Issue 30, items 1-2: the resume dies on the empty file. Before, durability
    passed (it skipped failed resumes) and atomicity blamed a write in place, though
    no write was in progress: the cause is the missing fsync."""
    ref = Timeline()
    ref.train(2, range(1, 21), save_every=10)
    ev = evidence(_in_place_save_then_power_loss(False).history(), ref.history(),
                  completed=False, exit_codes=[[1, 1]])
    durable = checkers.durable_checkpoints(ev)
    assert durable.ok is False, durable.detail
    assert ("saved after step 10 was finished before the power loss" in durable.detail
            and "reverted ckpt.pt to its last fsync" in durable.detail
            and "fsync the file" in durable.detail)
    atomic = checkers.atomic_recovery(ev)
    assert atomic.ok is False and "written in place" not in atomic.detail
    assert "a power loss damaged the finished checkpoint of step 10" in atomic.detail
    assert "EOFError" in atomic.detail


def test_a_power_loss_that_reverts_a_later_saves_bytes_blames_no_finished_checkpoint():
    """The same file rewritten in place by save 2 when the power went out: what went
    back was save 2's bytes; a kill-like tear of an in-place write, not a lost
    checkpoint."""
    ref = Timeline()
    ref.train(2, range(1, 31), save_every=10)
    ev = evidence(_in_place_save_then_power_loss(True).history(), ref.history(),
                  completed=False, exit_codes=[[1, 1]])
    assert checkers.lost_checkpoint(ev) is None
    assert "written in place" in checkers.atomic_recovery(ev).detail


def test_a_lost_folder_entry_is_named_with_the_folder_to_fsync():
    """Issue 41, item 3: rank folders made in out/ and never made durable there take
    their files with them; the entry lost and the folder to fsync are out/'s."""
    undone = ["rank0", "rank0/step_5.pt", "rank1", "rank1/step_5.pt"]
    entries = checkers._lost_entries(["rank1/step_5.pt", "rank0/step_5.pt"], undone,
                                     {"out/rank0/step_5.pt", "out/rank1/step_5.pt"})
    assert entries == ["out/rank1/", "out/rank0/"]
    lost = checkers.LostCheckpoint(5, [], ["rank1/step_5.pt", "rank0/step_5.pt"], entries)
    assert lost.describe() == (
        "the power loss undid rank1/step_5.pt, rank0/step_5.pt (the entries rank0/, rank1/ in"
        " out/ were lost: out/ was never fsynced after they were made there; fsync out/)")
    file_only = checkers._lost_entries(["ckpt.pt"], ["ckpt.pt"], {"out/ckpt.pt"})
    assert checkers.LostCheckpoint(10, [], ["ckpt.pt"], file_only).describe().endswith(
        "(the entry ckpt.pt in out/ was lost: out/ was never fsynced after it was created or"
        " renamed there; fsync out/)")
