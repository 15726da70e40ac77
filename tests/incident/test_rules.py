"""Rules told on small logs written as the scripts print them (the corpus has real runs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from torchchaos.incident.attribute import attribute
from torchchaos.incident.gather import gather

HARNESS = Path(__file__).resolve().parents[1] / "data" / "incidents" / "harness"


def _import(tmp_path, first: str, second: str):
    (tmp_path / "launch-0-node-0.log").write_text(first)
    (tmp_path / "launch-1-node-0.log").write_text(second)
    gathered = gather([tmp_path])
    return attribute(gathered.observations, gathered.sources).finding


def test_a_finished_save_the_restart_did_not_find_is_a_power_loss(tmp_path):
    first = "step 5 loss 4.2\nsaved checkpoint ckpt/step-5.pt\nstep 10 loss 4.1\n" \
        "saved checkpoint ckpt/step-10.pt\nstep 11 loss 4.0\n"
    found = _import(tmp_path, first, "resumed from ckpt/step-5.pt at step 5\nstep 20 loss 3\n")
    assert (found.kind, found.phase) == ("power_loss", "between_saves"), found.rules
    assert any("checkpoint of step 10 was saved" in r and "resumed from step 5" in r
               for r in found.rules), found.rules


def test_a_node_lost_after_its_last_save_is_a_node_loss(tmp_path):
    first = "step 5 loss 4.2\nsaved checkpoint ckpt/step-5.pt\nstep 10 loss 4.1\n" \
        "saved checkpoint ckpt/step-10.pt\nstep 11 loss 4.0\n"
    found = _import(tmp_path, first, "resumed from ckpt/step-10.pt at step 10\nstep 20 loss 3\n")
    assert found.kind == "node" and "power_loss" in found.alternatives, found.rules


def test_a_save_begun_is_not_a_save_done(tmp_path):
    first = "step 5 loss 4.2\nsaved checkpoint ckpt/step-5.pt\nstep 10 loss 4.1\n" \
        "saving checkpoint to ckpt/step-10.pt\n"
    found = _import(tmp_path, first, "resumed from ckpt/step-5.pt at step 5\nstep 20 loss 3\n")
    assert found.kind == "node", found.rules


def test_a_launch_that_stopped_short_of_its_relaunch_is_a_node_loss(tmp_path):
    """No resume line, and the relaunch's first step line is a later step's (a script
    that resumes silently): it printed every kind of line the first did and went on."""
    found = _import(tmp_path, "hidden=260\nstep 5 loss 2.2451\n",
                    "hidden=260\nstep 10 loss 2.2366\ndone at step 10, param sum 4.68e+01\n")
    assert found.kind == "node" and "power_loss" in found.alternatives, found.rules
    # the relaunch's own step 10 does not bound when the first launch went down
    assert found.step_window == (5, None), found.step_window
    assert any("went on past it" in r for r in found.rules), found.rules


def test_a_relaunch_that_printed_the_first_launchs_saves_again_started_over(tmp_path):
    """bench/targets/adamw_trainer.py's words (a step's line only at its saves): the
    relaunch printed the first launch's "step 5 ... saved" again, word for word, so it
    found no checkpoint, and the save said done was lost: a power loss, whose phase the
    log, silent between saves, does not tell."""
    found = _import(tmp_path, "hidden=260\nstep 5 loss 2.2451 saved\n",
                    "hidden=260\nstep 5 loss 2.2451 saved\nstep 10 loss 2.2366 saved\n"
                    "done at step 10, param sum 4.68e+01\n")
    assert (found.kind, found.phase_seen) == ("power_loss", False), found.rules
    assert found.alternatives == ["node"]  # a script that never resumes leaves the same
    assert any("checkpoint of step 5 was saved" in r and "found no checkpoint" in r
               for r in found.rules), found.rules


def test_a_relaunch_started_over_is_told_through_its_clock_and_its_other_lines(tmp_path):
    """Timestamps differ between the two prints of one step's line; the losses do not.
    Without "saved" in the step's line, no save was said done: a node's death, whose
    relaunch restarted from scratch."""
    first = "2026-11-28 15:11:15,270 INFO step 5 loss 2.2451\n"
    again = "2026-11-28 15:12:01,004 INFO step 5 loss 2.2451\n" \
        "2026-11-28 15:12:01,090 INFO step 10 loss 2.2366\n2026-11-28 15:12:01,100 INFO done\n"
    (tmp_path / "launch-0-node-0.log").write_text(first)
    (tmp_path / "launch-1-node-0.log").write_text(again)
    gathered = gather([tmp_path])
    incident = attribute(gathered.observations, gathered.sources)
    assert incident.finding.kind == "node", incident.finding.rules
    assert incident.recovery.startswith("restarted from scratch: its step (or save) lines begin as")
    resumed = again.replace("step 5 loss 2.2451", "step 5 loss 2.3001")  # another loss
    (tmp_path / "launch-1-node-0.log").write_text(resumed)
    gathered = gather([tmp_path])
    incident = attribute(gathered.observations, gathered.sources)
    assert incident.recovery == "restarted; no resume line in the logs", incident.recovery


def test_a_save_past_every_line_of_a_launch_that_vanished_is_not_placed(tmp_path):
    """A log that prints a step's line only with its save, and a relaunch that resumed
    from a later save: where the log went on after the death (a peer's echo), the death
    is at that save's end (barrier_inside_the_save); where the log itself stopped (a node
    gone, its tail perhaps lost with it), the phase is not placed from the log."""
    found = _import(tmp_path, "step 5 loss 2.2451 saved\nstep 10 loss 2.2366 saved\n",
                    "resumed from step 15\nstep 20 loss 2.2221 saved\ndone at step 20\n")
    assert found.kind == "node", found.rules
    assert not found.phase_seen and found.save is None, found.rules


def test_a_relaunch_that_printed_every_step_line_of_the_first_and_more_went_on_past_it(
        tmp_path):
    """nanoGPT's own train.py, its node killed (scored blind): the relaunch started from
    scratch and printed the same kinds of lines, only more of them; its step lines are the
    first launch's, but for each step's milliseconds and mfu, and then more. Said nothing
    known before."""
    def iters(upto: int, ms: float) -> str:
        return "".join(f"iter {n}: loss {4.5 - n / 100:.4f}, time {ms + n:.2f}ms, mfu"
                       f" {n / 3:.2f}%\n" for n in range(upto))

    found = _import(tmp_path, "Initializing a new model from scratch\n" + iters(10, 25.0),
                    "Initializing a new model from scratch\n" + iters(20, 9.0))
    assert found.kind == "node", found.rules
    assert found.step_window == (9, None), found.step_window


def test_a_launch_that_printed_nothing_before_its_relaunch_is_a_node_loss(tmp_path):
    found = _import(tmp_path, "", "done step 30 loss 0.519\n")
    assert (found.kind, found.phase, found.step_window) == ("node", "unknown", (None, None))


def test_a_log_too_varied_to_compare_tells_no_vanished_launch(tmp_path):
    """A line per request id (letters and digits) in every line: no kinds of lines to
    compare, so no claim that the relaunch went on past the first launch."""
    from torchchaos.incident.formats import text

    def word(n: int) -> str:  # letters only: no number to blank
        return "".join(chr(97 + n // 26**k % 26) for k in range(4))

    varied = "step 1 loss 3.0\n" + "".join(f"request {word(n)} done\n"
                                          for n in range(text.MAX_SHAPES + 5))
    found = _import(tmp_path, varied, varied + "all done\n")  # the same step lines
    assert found.kind == "unknown", found.rules


def test_a_finished_run_launched_again_is_no_failure(tmp_path):
    """The same kinds of lines twice (a run that finished, started again from scratch):
    no launch vanished, no failure is told, and none is placed at a step or phase."""
    run = "step {} loss 4.{}\nsaved checkpoint ckpt/step-{}.pt\ndone at step 10\n"
    found = _import(tmp_path, run.format(10, 1, 10), run.format(10, 2, 10))
    assert (found.kind, found.phase, found.step_window) == ("unknown", "unknown",
                                                             (None, None)), found.rules


def test_a_finished_save_a_relaunch_found_no_checkpoint_of_is_a_power_loss(tmp_path):
    """tests/scripts/logging_trainer.py's words: the save of step 5 committed, the save of
    step 10 begun; the relaunch looked, found nothing, and trained from scratch."""
    first = "global_step=5 loss=3.44\ncheckpoint global_step=5 committed in 0.007s\n" \
        "global_step=10 loss=3.42\nwriting checkpoint for global_step=10 to runs/ckpt\n"
    found = _import(tmp_path, first, "no usable checkpoint under runs/ckpt, training from"
                    " scratch (global_step=0)\nglobal_step=1 loss=3.45\n")
    assert (found.kind, found.phase, found.phase_seen) == ("power_loss", "mid_save", True)
    assert any("found no checkpoint to resume from" in r for r in found.rules), found.rules


def test_a_done_line_with_no_step_finishes_the_save_begun_before_it(tmp_path):
    """tests/scripts/dcp_trainer.py's words: the step is in the line that begins a save,
    not in the one that ends it."""
    first = "step: 5 loss: 5.43\nSaving the checkpoint at step 5 to outputs/checkpoint/" \
        "step-5.\nFinished saving the checkpoint in 0.07 seconds.\nstep: 10 loss: 4.81\n" \
        "Saving the checkpoint at step 10 to outputs/checkpoint/step-10.\n"
    found = _import(tmp_path, first, "No checkpoint found in outputs/checkpoint; training"
                    " starts from scratch.\nstep: 1 loss: 5.70\n")
    assert (found.kind, found.phase) == ("power_loss", "mid_save"), found.rules
    assert any("checkpoint of step 5 was saved" in r for r in found.rules), found.rules
    assert any("began the save of step 10" in r for r in found.rules), found.rules


def test_a_relaunch_that_found_no_checkpoint_where_none_was_said_saved_is_a_node_loss(
        tmp_path):
    found = _import(tmp_path, "global_step=5 loss=3.44\n",
                    "No checkpoint found in outputs/checkpoint; training starts from"
                    " scratch.\nglobal_step=1 loss=3.45\n")
    assert found.kind == "node" and "power_loss" in found.alternatives, found.rules


def _case(tmp_path, name: str, shards: bool):
    """A corpus case copied without its expected.json, with or without the DCP shards of
    a job of two ranks (the newest save of `dcp_oom_under_record`, the same script)."""
    shutil.copytree(HARNESS / name, tmp_path / name,
                    ignore=shutil.ignore_patterns("expected.json", "ckpt"))
    if shards:
        shutil.copytree(HARNESS / "dcp_oom_under_record" / "ckpt", tmp_path / name / "ckpt")
    gathered = gather([tmp_path / name])
    return attribute(gathered.observations, gathered.sources).finding


def test_an_untagged_crash_dump_is_the_rank_the_shards_show_said_nothing(tmp_path):
    """torchrun named rank 0's echo; the faulthandler dump names no rank. Rank 1 is known
    only from its checkpoint shard, and it is the only rank with no word of its own."""
    assert _case(tmp_path / "a", "faulthandler_in_the_launch_log", shards=False).rank is None
    found = _case(tmp_path / "b", "faulthandler_in_the_launch_log", shards=True)
    assert (found.kind, found.rank) == ("crash", 1), found.rules
    assert any("the dump is rank 1's" in r for r in found.rules), found.rules


def test_an_oom_kill_of_an_unnamed_pid_is_the_rank_the_shards_show_said_nothing(tmp_path):
    found = _case(tmp_path / "a", "dcp_oom_under_record", shards=False)
    assert (found.kind, found.rank) == ("oom", None), found.rules
    assert any("nothing tells how many ranks" in r or "rank is not known" in r
               for r in found.rules), found.rules
    found = _case(tmp_path / "b", "dcp_oom_under_record", shards=True)
    assert (found.kind, found.rank, found.phase) == ("oom", 1, "between_saves"), found.rules


def test_a_kernel_line_is_placed_in_the_log_by_the_peers_echo(tmp_path):
    """The OOM killer's line is in kernel.log, which has no place among the training
    log's lines: the step window ends where rank 0 saw its peer go."""
    found = _case(tmp_path, "dcp_oom_under_record", shards=True)
    assert found.step_window[0] == 10, found.rules


LAUNCHER_STOPS_RANK_1 = (
    "W1128 10:52:12.721000 29670 site-packages/torch/distributed/elastic/multiprocessing/"
    "api.py:1028] Sending process 29674 closing signal SIGTERM\n")
RANK_0_KILLED = (
    "E1128 10:52:13.194000 29670 site-packages/torch/distributed/elastic/multiprocessing/"
    "api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 29673) of binary: python\n")


def _one_log(tmp_path, text: str):
    (tmp_path / "logs").mkdir(parents=True)
    (tmp_path / "logs" / "launch-0-node-0.log").write_text(text)
    gathered = gather([tmp_path / "logs"])
    return attribute(gathered.observations, gathered.sources).finding


def test_a_sigterm_a_rank_says_it_caught_with_no_launcher_stop_before_it_is_a_preemption(
        tmp_path):
    """Lightning's handler ends the fit with exit 0: its line is all that is left."""
    found = _one_log(tmp_path, "[rank: 0] Seed set to 0\n[rank: 0] Received SIGTERM: 15\n")
    assert (found.kind, found.rank) == ("preempt", 0), found.rules


def test_a_sigterm_the_launcher_sent_first_is_its_stop_not_a_preemption(tmp_path):
    """lightning/00's lines: torchrun stops rank 1 after rank 0's SIGKILL, and rank 1's
    handler says so."""
    found = _one_log(tmp_path, LAUNCHER_STOPS_RANK_1 + "[rank: 1] Received SIGTERM: 15\n"
                     + RANK_0_KILLED)
    assert (found.kind, found.rank) == ("kill", 0), found.rules


def test_a_workers_own_file_that_heard_the_launchers_sigterm_is_no_preemption(tmp_path):
    """torchrun --log-dir: rank 1's handler line is in its own stdout.log, which has no
    place among the launcher's lines; the launcher stopped that attempt's ranks."""
    (tmp_path / "logs" / "attempt_0" / "1").mkdir(parents=True)
    (tmp_path / "logs" / "launcher.log").write_text(LAUNCHER_STOPS_RANK_1 + RANK_0_KILLED)
    (tmp_path / "logs" / "attempt_0" / "1" / "stdout.log").write_text(
        "step 11\ngot signal 15, exiting\n")
    gathered = gather([tmp_path / "logs"])
    found = attribute(gathered.observations, gathered.sources).finding
    assert (found.kind, found.rank) == ("kill", 0), found.rules


def test_a_dcp_save_folder_names_the_step_of_its_shards(tmp_path):
    """dcp/03: rank 0 killed inside DCP's async save of step 10, its peer already in
    the next step's backward. The restart resumed from step 5 though the log reached
    step 10: the save of step 10 never finished. That takes the checkpoints' interval,
    which only the folders tell (`step-000010/__0_0.distcp`); the shards' own numbers
    (rank 0, shard 0) had been read as step 0, and the phase was placed by rule."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "launch-0-node-0.log").write_text(
        "step 10 loss 4.1882\n"
        "[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "pair.cc:537] Read error [127.0.0.1]:1706: Connection reset by peer.\n"
        + LAUNCHER_STOPS_RANK_1 + RANK_0_KILLED +
        "resumed from ckpt/step-000005 at step 5\nstep 10 loss 4.1882\nstep 20 loss 3.9443\n")
    shards = HARNESS / "dcp_oom_under_record" / "ckpt" / "step-000020"
    for step in (10, 15, 20):
        shutil.copytree(shards, tmp_path / "ckpt" / f"step-{step:06d}")
    gathered = gather([tmp_path / "logs", tmp_path / "ckpt"])
    found = attribute(gathered.observations, gathered.sources).finding
    assert (found.kind, found.rank, found.phase) == ("kill", 0, "mid_save"), found.rules
    assert any("save of step 10 never finished" in r for r in found.rules), found.rules


def test_a_restart_error_no_frame_places_is_not_said_to_come_after_the_resume(tmp_path):
    """accelerate/18 (before Accelerate's load frames were known): the restart's error came
    out of `accelerator.load_state`, and the import said it came after the resume."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "launch-0-node-0.log").write_text(
        "step 10 loss 4.1\n" + RANK_0_KILLED.replace("local_rank: 0", "local_rank: 1") +
        "W1128 10:52:13.300000 29670 site-packages/torch/distributed/elastic/agent/server/"
        "api.py:725] [default] Worker group FAILED. 3/3 attempts left; will restart worker"
        " group\n"
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/job/train.py", line 83, in main\n'
        "[rank0]:     setup(found[0])\n"
        "[rank0]: RuntimeError: quota exceeded\n")
    gathered = gather([tmp_path / "logs"])
    again = attribute(gathered.observations, gathered.sources).restart_failure
    assert again is not None and again.phase == "unknown", again


def test_accelerates_load_state_is_a_load():
    from torchchaos.incident.observations import phase_of_frames

    frames = ["main (accelerate_lm.py:83)", "load_state (accelerate/accelerator.py:3912)",
              "load_accelerator_state (accelerate/checkpointing.py:243)",
              "load_model (safetensors/torch.py:228)"]
    assert phase_of_frames(frames) == "load"


KILLED_RANK_0 = ("E1128 15:04:18.888000 21868 site-packages/torch/distributed/elastic/"
                 "multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 21874)"
                 " of binary: /usr/bin/python\n")


def test_a_save_begun_and_not_said_done_before_the_failure_is_under_way(tmp_path):
    """In a log that says when a save is done, the last save begun and not said done
    when the failure shows was under way (jsonlog_trainer.py's ckpt_save_begin)."""
    log = "step 5 loss 4.2\nsaving checkpoint to ckpt/step-5.pt\ncheckpoint step 5 saved\n" \
        "step 10 loss 4.1\nsaving checkpoint to ckpt/step-10.pt\n" + KILLED_RANK_0
    found = _one_log(tmp_path, log)
    assert (found.kind, found.rank, found.phase, found.phase_seen) == ("kill", 0, "mid_save",
                                                                       True), found.rules
    assert found.save == 2  # saves every 5 steps: the save of step 10 is the 2nd


def test_a_log_that_never_says_a_save_is_done_leaves_no_save_under_way(tmp_path):
    log = "step 5 loss 4.2\nsaving checkpoint to ckpt/step-5.pt\nstep 10 loss 4.1\n" \
        "saving checkpoint to ckpt/step-10.pt\nstep 11 loss 4.0\n" + KILLED_RANK_0
    found = _one_log(tmp_path, log)
    assert (found.kind, found.phase, found.phase_seen) == ("kill", "between_saves", False)


def test_a_handlers_system_exit_is_no_error_of_the_rank(tmp_path):
    log = "step 10 loss 4.1\nException ignored in atexit callback: <bound method A._at_exit>\n" \
        "Traceback (most recent call last):\n  File \"/job/train.py\", line 59, in on_sigterm\n" \
        "    sys.exit(143)\nSystemExit: 143\n" + KILLED_RANK_0
    assert _one_log(tmp_path, log).kind == "kill"


def test_a_resume_from_the_last_step_reached_whose_save_was_never_said_done(tmp_path):
    """Ignite's words: the log reached iteration 10, whose checkpoint the restart resumed
    from, and the line the script writes after each save is there for iteration 5 only:
    the rank died at the end of the save, its file written. Had the log reached
    iteration 11, the death would have come after the save."""
    def log(reached: int) -> str:
        steps = "".join(f"Epoch[1] Iteration[{n}/20] Loss: 2.3\n" for n in range(4, reached + 1)
                        if n != 5)
        return "Epoch[1] Iteration[5/20] Loss: 2.3\nSaved checkpoint checkpoints/" \
            f"checkpoint_5.pt at iteration 5\n{steps}{KILLED_RANK_0}Resuming from checkpoint" \
            " checkpoints/checkpoint_10.pt at iteration 10 (epoch 1)\n" \
            "Epoch[2] Iteration[11/20] Loss: 2.2\n"

    found = _one_log(tmp_path / "a", log(10))
    assert (found.kind, found.phase, found.phase_seen) == ("kill", "mid_save", True), \
        found.rules
    assert found.save is None  # one save's step alone says nothing of how often they come
    found = _one_log(tmp_path / "b", log(11))
    assert found.phase != "mid_save", found.rules


def test_a_group_found_gone_at_teardown_is_an_abort_at_a_point_not_known(tmp_path):
    """nanoGPT's own train.py with rank 1's group aborted at step 12 (scored blind): DDP
    kept its own handle and trained on, and only `destroy_process_group()` at the end
    raised. Read before as an exception in a training step's collective, after step 20:
    a wrong phase and step. The abort is told, and when it came is said not known."""
    site = "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    log = "".join(f"iter {n}: loss 4.0, time 9.26ms, mfu 0.00%\n" for n in range(21)) + (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/work/nanoGPT/train.py", line 337, in <module>\n'
        "[rank1]:     destroy_process_group()\n"
        f'[rank1]:   File "{site}", line 2382, in destroy_process_group\n'
        '[rank1]:     raise AssertionError("Process group cannot be None")\n'
        "[rank1]: AssertionError: Process group cannot be None\n"
        "E1128 17:39:26.620000 20704 site-packages/torch/distributed/elastic/multiprocessing/"
        "api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 20708) of binary: python\n")
    found = _one_log(tmp_path, log)
    assert (found.kind, found.rank, found.phase) == ("abort", 1, "unknown"), found.rules
    # it may have come after the last step line too; a double destroy raises the same
    assert found.step_window == (None, None), found.step_window
    assert found.alternatives == ["exception"]


def test_a_save_said_done_and_lost_is_not_also_a_save_that_never_finished(tmp_path):
    """A review's counter-example: the relaunch resumed from step 5 after the log said the
    save of step 10 was done. That is the lost save, not a save of step 10 cut short."""
    found = _import(tmp_path, "hidden=260\nstep 5 loss 2.2451 saved\nstep 10 loss 2.2366 saved\n",
                    "hidden=260\nresumed from step 5\nstep 10 loss 2.2366 saved\n"
                    "step 15 loss 2.2 saved\ndone at step 15\n")
    assert found.kind == "power_loss" and not found.phase_seen, found.rules


def test_a_resume_from_a_save_off_the_logs_interval_is_not_placed_at_its_end(tmp_path):
    """The log says a save done every 10 steps, and a quiet `latest` checkpoint every 5
    was resumed from (step 15): the log does not tell every save, so no end of a save."""
    died = ("E1128 17:39:26.620000 20704 site-packages/torch/distributed/elastic/"
            "multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 20708)"
            " of binary: python\n")
    found = _one_log(tmp_path, "step 10 loss 2.2366 saved\n" + died + "resumed from step 15\n"
                     "step 20 loss 2.2 saved\nstep 30 loss 2.1 saved\n")
    assert found.kind == "kill" and not found.phase_seen, found.rules


def test_a_sibling_nodes_log_is_no_relaunch(tmp_path):
    """launch-0-node-1.log prints the same all-reduced steps as launch-0-node-0.log: the
    same launch on another node, not a relaunch that started over."""
    def died(pid: int, code: int) -> str:
        return (f"E1128 17:39:26.620000 {pid} site-packages/torch/distributed/elastic/"
                f"multiprocessing/api.py:1002] failed (exitcode: {code}) local_rank: 0"
                f" (pid: {pid + 1}) of binary: python\n")

    def steps(n: int) -> str:
        return "".join(f"step {i} loss {3 - i / 10:.2f}\n" for i in range(1, n + 1))

    (tmp_path / "launch-0-node-0.log").write_text(steps(7) + died(100, -9))
    (tmp_path / "launch-0-node-1.log").write_text(
        steps(8) + "[rank1]: RuntimeError: Connection closed by peer\n" + died(200, 1))
    gathered = gather([tmp_path])
    incident = attribute(gathered.observations, gathered.sources)
    assert not incident.recovery.startswith("restarted from scratch"), incident.recovery


def test_the_save_a_relaunch_resumed_from_is_a_step_before_a_launch_that_printed_nothing(
        tmp_path):
    """plain_ddp's node kill, scored blind: the first launch's log is empty (its buffered
    stdout went down with the node). The job had finished the save the relaunch resumed
    from before it failed: the step window starts there, and the phase, which nothing
    shows, is placed between saves by rule, not told as seen."""
    found = _import(tmp_path, "", "rank 0 resumed from ckpt/step-0015.pt\n"
                    "done step 30 loss 0.519\n")
    assert (found.kind, found.phase, found.phase_seen, found.step_window) == \
        ("node", "between_saves", False, (15, None)), found.rules
    assert any(r.startswith("after step 15: ") and "resumed from its save" in r
               for r in found.rules), found.rules


def _checkpoints(folder: Path, *names: str) -> None:
    import torch

    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"w": torch.zeros(2)}, folder / name)


def test_a_resume_that_names_only_a_folder_takes_the_step_the_checkpoint_folder_gives(
        tmp_path):
    """The Trainer's `checkpoint-10`: no step word in the resume line, but the folder it
    names is one the checkpoint folder holds as step 10."""
    _checkpoints(tmp_path / "ckpt", "checkpoint-5/optimizer.pt", "checkpoint-10/optimizer.pt")
    found = _import(tmp_path, "", "rank 0 resumed from ckpt/checkpoint-10\n")
    assert (found.phase, found.step_window) == ("between_saves", (10, None)), found.rules


def test_a_resume_that_names_a_file_every_save_has_takes_no_step(tmp_path):
    _checkpoints(tmp_path / "ckpt", "checkpoint-5/optimizer.pt", "checkpoint-10/optimizer.pt")
    found = _import(tmp_path, "", "rank 0 resumed from optimizer.pt\n")
    assert (found.phase, found.step_window) == ("unknown", (None, None)), found.rules


def test_a_resume_past_the_logs_saves_is_not_read_as_a_step_the_log_reached(tmp_path):
    """A log that names its saves but no step: the relaunch's resume from a later save
    bounds when the node went, and is no step the log reached whose save it never said
    done (which would place the death at that save's end, as seen)."""
    first = "saved checkpoint ckpt/step-5.pt\nsaved checkpoint ckpt/step-10.pt\n"
    found = _import(tmp_path, first, "resumed from ckpt/step-15.pt at step 15\nstep 20 loss 3\n")
    assert (found.kind, found.phase_seen, found.step_window) == ("node", False, (15, None)), \
        found.rules


def test_an_abort_takes_no_step_from_the_save_resumed_after_it(tmp_path):
    """An aborted group shows where the rank next used it, which may be past the save
    the restart resumed from (plain_ddp's abort at step 17 failed at step 20's barrier):
    that save bounds the symptom, not when the group went."""
    site = "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    first = ("[rank1]: Traceback (most recent call last):\n"
             '[rank1]:   File "/job/train.py", line 90, in <module>\n'
             "[rank1]:     dist.barrier()\n"
             f'[rank1]:   File "{site}", line 4159, in barrier\n'
             "[rank1]:     default_pg = _get_default_group()\n"
             "[rank1]: ValueError: Default process group has not been initialized, please"
             " make sure to call init_process_group.\n"
             "E1128 02:34:00.248000 20574 site-packages/torch/distributed/elastic/"
             "multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 20577)"
             " of binary: python\n")
    found = _import(tmp_path, first, "rank 1 resumed from ckpt/step-0020.pt\n")
    assert (found.kind, found.rank, found.step_window) == ("abort", 1, (None, None)), \
        found.rules


def test_a_resume_that_names_the_folder_holding_every_save_takes_no_step(tmp_path):
    """"resumed from ckpt": the folder every save sits in names no step, even where it
    holds one save only."""
    _checkpoints(tmp_path / "ckpt", "step-10.pt")
    found = _import(tmp_path, "", "rank 0 resumed from ckpt\n")
    assert (found.phase, found.step_window) == ("unknown", (None, None)), found.rules


# pytorch/examples' DDP tutorial (multigpu_torchrun.py), as it prints: a line per epoch
# and rank, a line per save, none per step
TUTORIAL = "".join(f"[GPU0] Epoch {e} | Batchsize: 32 | Steps: 32\n"
                   f"Epoch {e} | Training snapshot saved at snapshot.pt\n" for e in range(2))


def test_a_relaunch_that_printed_the_first_launchs_save_lines_again_lost_its_save(tmp_path):
    """The tutorial's power loss, scored blind: the first launch said two snapshots were
    saved and vanished; the relaunch printed those save lines again, word for word, and
    went on: it found no snapshot, and a save said done was lost."""
    found = _import(tmp_path, TUTORIAL, TUTORIAL + "[GPU0] Epoch 2 | Batchsize: 32 | Steps: 32\n"
                    "Epoch 2 | Training snapshot saved at snapshot.pt\n")
    assert (found.kind, found.alternatives) == ("power_loss", ["node"]), found.rules
    assert any("says a checkpoint was saved" in r for r in found.rules), found.rules


def test_a_save_said_done_before_a_failure_in_a_log_with_no_step_line_places_it(tmp_path):
    """A kill after the tutorial's first saves: no step line, but the job was training
    past its start; placed between saves by rule, not seen. Before any save, unknown."""
    kill = ("E1128 20:11:00.148000 5066 site-packages/torch/distributed/elastic/"
            "multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 5069) of"
            " binary: python\n")
    found = _one_log(tmp_path / "a", TUTORIAL + kill)
    assert (found.kind, found.phase, found.phase_seen) == ("kill", "between_saves", False)
    assert any("said a save was done before it" in r for r in found.rules), found.rules
    early = _one_log(tmp_path / "b", "[GPU0] Epoch 0 | Batchsize: 32 | Steps: 32\n" + kill)
    assert (early.kind, early.phase) == ("kill", "unknown"), early.rules


# A review's counter-examples to the rules above (each gave a wrong answer once)

def test_a_checkpoint_named_by_its_epoch_gives_a_resume_no_step(tmp_path):
    """`epoch_3.pt` is epoch 3, not step 3: a resume that names it says nothing of the
    step, and the log's last save (step 3000) is not a save the restart missed."""
    _checkpoints(tmp_path / "ckpt", "epoch_1.pt", "epoch_2.pt", "epoch_3.pt")
    first = "".join(f"step {e * 1000} loss 3\nsaved checkpoint ckpt/epoch_{e}.pt at step"
                    f" {e * 1000}\n" for e in (1, 2, 3)) + "step 3050 loss 2\n"
    found = _import(tmp_path, first, "Resuming from checkpoint ckpt/epoch_3.pt\nstep 3001\n")
    assert found.kind == "node" and not found.phase_seen, found.rules
    assert found.step_window == (3050, None), found.step_window


def test_a_save_announced_at_start_is_no_save_lost(tmp_path):
    found = _import(tmp_path, "Checkpoints will be saved to ckpt/ every 500 steps\n"
                    "step 10 loss 4.2\nstep 20 loss 4.1\n",
                    "Checkpoints will be saved to ckpt/ every 500 steps\n"
                    "No checkpoint found in ckpt/, training from scratch\nstep 10 loss 4.3\n")
    assert found.kind == "node", found.rules


def test_save_lines_without_a_number_tell_no_relaunch_that_started_over(tmp_path):
    """"Saved checkpoint to ckpt/last.pt" reads the same from a fresh start and a resume."""
    save = "Saved checkpoint to ckpt/last.pt\n"
    first = "".join(f"Epoch {e} loss 4\n{save}" for e in range(2))
    second = "".join(f"Epoch {e} loss 3\n{save}" for e in range(2, 5)) + "Training complete\n"
    tmp_path.joinpath("x").mkdir()
    (tmp_path / "x" / "launch-0-node-0.log").write_text(first)
    (tmp_path / "x" / "launch-1-node-0.log").write_text(second)
    gathered = gather([tmp_path / "x"])
    incident = attribute(gathered.observations, gathered.sources)
    assert incident.finding.kind == "node" and "power_loss" in incident.finding.alternatives
    assert not incident.recovery.startswith("restarted from scratch"), incident.recovery


def test_only_the_restart_right_after_a_failure_bounds_its_step(tmp_path):
    """The first restart started over and trained; only the second resumed, from a save
    the first restart made: it says nothing of when the first launch died."""
    kill = ("E1128 20:11:00.148000 5066 site-packages/torch/distributed/elastic/"
            "multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 5069) of"
            " binary: python\n")
    for name, text in [("launch-0-node-0.log", "[GPU0] Epoch 0 | Batchsize: 32\n" + kill),
                       ("launch-1-node-0.log", "step 100 loss 4\nsaved checkpoint"
                        " ckpt/step-100.pt at step 100\nstep 110 loss 3\n" + kill),
                       ("launch-2-node-0.log", "resumed from ckpt/step-100.pt at step 100\n")]:
        (tmp_path / name).write_text(text)
    gathered = gather([tmp_path])
    found = attribute(gathered.observations, gathered.sources).finding
    assert (found.kind, found.step_window) == ("kill", (None, None)), found.rules


def test_another_ranks_log_of_the_same_launch_is_no_relaunch():
    from torchchaos.incident.launches import relaunch_of

    assert not relaunch_of("logs/rank-0.log", "logs/rank-1.log")
    assert not relaunch_of("logs/launch-0-node-0.log", "logs/launch-0-node-1.log")
    assert relaunch_of("logs/slurm-41.out", "logs/slurm-42.out")


def test_a_later_restarts_resume_places_no_death_at_a_saves_end(tmp_path):
    """The first restart found no checkpoint and trained to a save of step 8; the second
    resumed from that save. Read before as the first launch dying at the end of a save of
    step 8, a save only the first restart made."""
    def steps(first: int, last: int, saves: tuple[int, ...]) -> str:
        return "".join(f"step {n} loss 2.{n:02d}\n" + (
            f"saved checkpoint ckpt/step-{n}.pt at step {n}\n" if n in saves else "")
            for n in range(first, last + 1))

    kill = ("E1128 20:11:00.148000 5066 site-packages/torch/distributed/elastic/"
            "multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 5069) of"
            " binary: python\n")
    for name, text in [
            ("launch-0-node-0.log", steps(1, 7, (4,)) + kill + "restarting workers\n"),
            ("launch-1-node-0.log", "no checkpoint found\n" + steps(1, 9, (4, 8)) + kill),
            ("launch-2-node-0.log", "resumed from ckpt/step-8.pt at step 8\n"
             + steps(9, 12, (12,)))]:
        (tmp_path / name).write_text(text)
    gathered = gather([tmp_path])
    found = attribute(gathered.observations, gathered.sources).finding
    assert (found.kind, found.step_window) == ("kill", (7, None)), found.rules
    assert found.phase != "mid_save" and not found.phase_seen, found.rules


def test_a_slurm_arrays_other_task_is_no_relaunch(tmp_path):
    """Two tasks of one Slurm array (sbatch's default slurm-%A_%a.out) run side by side:
    task 1 training from step 1 is no relaunch that lost task 0's save. Read before as a
    power loss that dropped the save of step 4."""
    from torchchaos.incident.launches import relaunch_of

    def steps(last: int, saves: tuple[int, ...]) -> str:
        return "".join(f"step {n} loss 2.{n:02d}\n" + (
            f"saved checkpoint ckpt/step-{n}.pt at step {n}\n" if n in saves else "")
            for n in range(1, last + 1))

    (tmp_path / "slurm-41_0.out").write_text(steps(6, (4,)))
    (tmp_path / "slurm-41_1.out").write_text(steps(12, (4, 8, 12)) + "done\n")
    gathered = gather([tmp_path])
    found = attribute(gathered.observations, gathered.sources).finding
    assert found.kind == "unknown", found.rules
    assert relaunch_of("logs/slurm-41_0.out", "logs/slurm-57_0.out")  # resubmitted


def _summary(*entries: tuple[int, str]) -> str:
    """torchrun's closing summary for a script not under @record: each failed rank's entry
    says where to read about tracebacks, not what the rank raised. The first is the root
    cause."""
    def entry(n: int, rank: int, code: str) -> str:
        pid = 2210 + rank
        tb = f"Signal 9 (SIGKILL) received by PID {pid}" if code == "-9" else \
            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        return (f"[{n}]:\n  time      : 2024-05-01_12:05:01\n  host      : gpu-a\n"
                f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: {pid})\n"
                f"  error_file: <N/A>\n  traceback : {tb}\n")
    (root, *others) = entries
    return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            + "=" * 60 + "\ntrain.py FAILED\n" + "-" * 60 + "\nFailures:\n"
            + "".join(entry(i + 1, *e) for i, e in enumerate(others)) + "-" * 60
            + "\nRoot Cause (first observed failure):\n" + entry(0, *root) + "=" * 60 + "\n")


ECHO_TRACEBACK = (
    "[rank{r}]: Traceback (most recent call last):\n"
    '[rank{r}]:   File "/home/u/train.py", line 100, in main\n'
    "[rank{r}]:     loss.backward()\n"
    "[rank{r}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection"
    " closed by peer [127.0.0.1]:45678\n")


def test_the_summarys_pointer_to_tracebacks_is_no_error_of_the_rank(tmp_path):
    """A review's counter-examples: the entry of a rank that exited 1 reads "traceback :
    To enable traceback see: https://...". Read before as that rank's own exception: the
    echo's rank 0 was blamed for rank 1's SIGKILL, and for rank 1's ValueError where
    torchrun saw rank 0 exit first."""
    steps = "".join(f"step {n} loss 3.9\n" for n in (10, 20, 30, 40))
    failed = ("E0501 12:05:01.100000 2200 torch/distributed/elastic/multiprocessing/api.py:869]"
              " failed (exitcode: {code}) local_rank: {r} (pid: {pid}) of binary: python3\n")
    found = _one_log(tmp_path / "kill", steps + ECHO_TRACEBACK.format(r=0)
                     + failed.format(code=-9, r=1, pid=2211) + _summary((1, "-9"), (0, "1")))
    assert (found.kind, found.rank) == ("kill", 1), found.rules
    own = ("[rank1]: Traceback (most recent call last):\n"
           '[rank1]:   File "/home/u/train.py", line 99, in main\n'
           "[rank1]:     loss = F.cross_entropy(logits, y)\n"
           "[rank1]: ValueError: Expected input batch_size (8184) to match target batch_size"
           " (8192).\n")
    found = _one_log(tmp_path / "raise", steps + own + ECHO_TRACEBACK.format(r=0)
                     + failed.format(code=1, r=0, pid=2210) + _summary((0, "1"), (1, "1")))
    assert (found.kind, found.rank) == ("exception", 1), found.rules
    assert "ValueError" in found.how


def test_slurms_node_failure_line_names_the_kind_the_peers_echo(tmp_path):
    """A review's counter-example: srun and slurmstepd say a node failed; the ranks left
    saw their peers' connections reset. Read before as a SIGKILL of a rank not known."""
    found = _one_log(tmp_path, "".join(f"step {n} loss 3.9\n" for n in (100, 200))
                     + ECHO_TRACEBACK.format(r=0).replace("closed", "reset")
                     + "srun: error: Node failure on gpu-b\nslurmstepd: error: *** JOB 4242 ON"
                     " gpu-a CANCELLED AT 2024-05-01T12:05:09 DUE TO NODE FAILURE, SEE"
                     " SLURMCTLD LOG FOR DETAILS ***\n")
    assert found.kind == "node" and found.rank is None, found.rules
    assert found.how == "NODE_FAIL on gpu-b"
    assert found.step_window == (200, None)


def test_a_requeue_into_the_same_slurm_output_is_a_new_launch(tmp_path):
    """A review's counter-example: Slurm preempted the job at step 900 and requeued it into
    the same file (--open-mode=append); the requeue resumed from step 500 and raised at
    650. Read before as one launch's exception after step 900."""
    steps = "".join(f"step {n} loss 3.9\n" for n in range(100, 1000, 100))
    found = _one_log(tmp_path, steps.replace("step 500 loss 3.9\n", "step 500 loss 3.9\n"
                                             "saved checkpoint ckpt/step_500.pt\n")
                     + "slurmstepd: error: *** JOB 4242 ON gpu017 CANCELLED AT"
                     " 2024-05-01T12:31:07 DUE TO PREEMPTION ***\n"
                     "resumed from ckpt/step_500.pt at step 500\nstep 600 loss 3.4\n"
                     "[rank0]: Traceback (most recent call last):\n"
                     '[rank0]:   File "/home/u/data.py", line 77, in __iter__\n'
                     '[rank0]:     tokens = self.tokenizer.encode(doc["text"])\n'
                     "[rank0]: KeyError: 'text'\n")
    assert (found.kind, found.step_window) == ("preempt", (900, None)), found.rules


def test_a_second_nodes_failed_worker_is_the_global_rank_its_summary_gives(tmp_path):
    """A review's counter-example: node 1's torchrun says "failed (exitcode: -9)
    local_rank: 0", and its summary "rank : 2 (local_rank: 0)" for the same pid. Read
    before as rank 0, the writer."""
    found = _one_log(tmp_path, "E0501 12:05:04.456000 1400 torch/distributed/elastic/"
                     "multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 0 (pid: 2210)"
                     " of binary: python3\n" + _summary((0, "-9")).replace(
                         "rank      : 0 (local_rank: 0)", "rank      : 2 (local_rank: 0)"))
    assert (found.kind, found.rank, found.role) == ("kill", 2, "other"), found.rules


def test_a_run_that_said_it_finished_and_a_chained_job_that_resumed_is_no_failure(tmp_path):
    """A review's counter-example: Slurm jobs chained with afterok, each training to its
    time budget and saying so, the next resuming. Read before as a node that went down
    (the first log ended with no failure and no success)."""
    def job(first: int, resumed: bool) -> str:
        head = f"Resuming from checkpoint ckpt/step_{first}.pt at step {first}\n" if resumed \
            else "No checkpoint found in ckpt/, starting from scratch\n"
        steps = "".join(f"step {n} loss 4.5\n" for n in range(first + 100, first + 1001, 100))
        return (head + steps + f"saved checkpoint ckpt/step_{first + 1000}.pt\n"
                "Reached time budget (3h50m), exiting cleanly.\nTraining done for this job.\n")

    (tmp_path / "slurm-41001.out").write_text(job(0, False))
    (tmp_path / "slurm-41002.out").write_text(job(1000, True))
    gathered = gather([tmp_path])
    assert attribute(gathered.observations, gathered.sources).finding.kind == "unknown"
    # the same first log, cut after its last step: the node went down
    (tmp_path / "slurm-41001.out").write_text(job(0, False).split("saved")[0])
    gathered = gather([tmp_path])
    assert attribute(gathered.observations, gathered.sources).finding.kind == "node"


REVIEW = Path(__file__).resolve().parents[1] / "data" / "review"


@pytest.mark.parametrize("case, kind, rank", [
    # rank 3, on the second node, ran out of CUDA memory; node 0's ranks' watchdogs saw
    # it leave and aborted. Read before as a SIGABRT crash of rank 0: each node's log was
    # taken for a launch of its own, node0.log first
    ("nccl_oom_on_the_second_node", "oom", 3),
    # rank 1 was SIGKILLed; rank 0's watchdog aborted after ncclRemoteError. Read before
    # as a crash of rank 0
    ("nccl_watchdog_abort_after_a_peers_kill", "kill", 1),
    # a rank that hung, with the watchdogs of the others firing on both nodes: which rank
    # hung no line says (read before as rank 2, a rank whose own watchdog fired)
    ("nccl_hang_seen_from_both_nodes", "hang", None),
    # srun: "Node failure on gpu-b"; read before as a SIGKILL of a rank not known
    ("slurm_node_failure", "node", None),
    # a worker pod's rank 2 found no data shard; the two pods' logs are one launch's.
    # Read before as a node that went down (worker-1.log taken for worker-0.log's
    # relaunch, failing to read a checkpoint)
    ("kubeflow_worker_pods_missing_data_shard", "exception", 2),
    # a run that logged a bad sample's traceback, skipped it, and finished. Read before
    # as that exception (a false alarm)
    ("a_skipped_samples_traceback_in_a_finished_run", "unknown", None),
    # run9.log's ValueError came first, run10.log's OOM after. Read before as the OOM,
    # with run9's error as the restart's failure: "run10" sorts before "run9" as text
    ("run9_before_run10", "exception", 1),
    # `py-spy dump --pid $p > pyspy_$p.txt` of each rank while the job hung: the
    # number in the name is the pid (read before as rank 48212); nothing ties a pid to
    # a rank here
    ("pyspy_dumps_named_by_pid", "hang", None),
    # a DataLoader worker's faulthandler dump (its frames under _worker_loop) and its
    # rank's "worker exited unexpectedly": read before as the rank's own SIGSEGV
    ("dataloader_worker_segfault", "dataloader", 1),
    # torchrun --tee's tag before torch's ("[default1]:[rank3]: Traceback ..."): the
    # traceback is global rank 3's, not local rank 1's
    ("torchrun_tee_tags_before_torchs", "exception", 3),
    # pod statuses and the PyTorchJob: "1 Worker replica(s) failed" (exit 1), and the
    # master the operator then stopped (143). Read before as the master's preemption
    ("kubeflow_worker_failed_master_torn_down", "exception", None),
    # -- a second review, blind to the first's fixes: 39 scenarios, 2 told wrong, then
    # a Hub download's retry warning quoting "Connection reset by peer" in a run that
    # finished: read before as a rank killed without a word (a false alarm)
    ("an_http_retry_in_a_finished_run", "unknown", None),
    # rank 1's own ConnectionResetError from its data stream: read before as a peer's
    # lost connection, the rank that died not known
    ("a_ranks_own_connection_reset_from_its_data_stream", "exception", 1),
    # srun --label's "3: " and Open MPI's "[1,2]<stderr>:" before a rank's traceback:
    # read before as no failure at all
    ("srun_label_prefixes", "exception", 3),
    ("mpirun_tag_output_prefixes", "exception", 2),
    # srun's task label before torch's tag ("1: [rank3]: ..."): rank 3, not task 1
    ("srun_label_before_torchs_tag", "exception", 3),
    # slurmstepd's "CANCELLED ... DUE TO TIME LIMIT", and torchrun's "Received
    # Signals.SIGTERM death signal" from outside: read before as no failure
    ("slurm_time_limit", "preempt", None),
    ("torchrun_got_sigterm_from_outside", "preempt", None),
])
def test_a_reviews_case_is_told_as_it_happened(tmp_path, case, kind, rank):
    shutil.copytree(REVIEW / case, tmp_path / case)
    gathered = gather([tmp_path / case])
    found = attribute(gathered.observations, gathered.sources).finding
    assert (found.kind, found.rank) == (kind, rank), found.rules


def test_a_truncated_image_in_the_data_pipeline_is_no_checkpoint_load(tmp_path):
    """A review's counter-example: PIL's "image file is truncated" raised in a
    Dataset's __getitem__. Read before as a checkpoint that does not load (phase load,
    seen)."""
    shutil.copytree(REVIEW / "truncated_image_in_the_data_pipeline", tmp_path / "case")
    gathered = gather([tmp_path / "case"])
    found = attribute(gathered.observations, gathered.sources).finding
    assert (found.kind, found.rank) == ("exception", 1), found.rules
    assert found.phase != "load", found.rules


def test_a_root_cause_that_exited_1_with_no_traceback_is_an_exception(tmp_path):
    """torchrun's root cause exited 1 and no traceback of it is anywhere (a script not
    under @record, its stderr elsewhere): an exception of that rank, whose message is not
    known; read as no failure at all once the summary's pointer to tracebacks was no
    longer taken for the rank's error."""
    found = _one_log(tmp_path, "step 100 loss 3.9\nE0501 12:05:02.300000 2200 torch/distributed/"
                     "elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 1"
                     " (pid: 2211) of binary: python3\n" + _summary((1, "1")))
    assert (found.kind, found.rank) == ("exception", 1), found.rules
    assert "traceback is not in the artefacts" in found.how
