"""The hang detector's parts on real processes and files, without a training job:
heartbeats, the no-progress rule, stack capture with py-spy and faulthandler,
the one-line summary, and the hang_detected check over hand-written histories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from histories import Timeline, evidence

from torchchaos.harness.hangwatch import TORCHRUN_SHUTDOWN_SECONDS, HangWatch, default_timeout
from torchchaos.host import lifeline, stacks
from torchchaos.host.busy import RunCpu
from torchchaos.host.procs import pid_stopped
from torchchaos.judge import checkers, hangs
from torchchaos.rundir.heartbeat import Beat, Heartbeat, peers_gone, read_beats

SLEEPER = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGRTMIN + 6, file=open(sys.argv[1], "a"), all_threads=True)
def wait_for_peers():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
wait_for_peers()
"""


@pytest.fixture
def sleeper(tmp_path):
    """A real Python process sleeping in `wait_for_peers`, with faulthandler armed."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "fh.txt")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


def stop(pid: int) -> None:
    """SIGSTOP, and wait until the kernel shows the process stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while not pid_stopped(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def write_beat(beats: Path, rank: int, pid: int, progress_ago: float, beat_ago: float = 0.0,
               attempt: int = 0, stopped: bool = False, doing: str = "step") -> None:
    now = time.monotonic()
    beat = Beat(rank, pid, 0, attempt, 7, doing, now - progress_ago, now - beat_ago, stopped)
    (beats / f"rank-{rank}.json").write_text(json.dumps(asdict(beat)))


def test_heartbeat_thread_keeps_beating_and_records_progress(tmp_path):
    beat = Heartbeat(tmp_path / "rank-0.json", 0, 0, 0)
    beat.start()
    beat.progress("step", 3)
    time.sleep(1.2)
    [read] = read_beats(tmp_path)
    assert read.pid == os.getpid() and read.step == 3 and read.doing == "step"
    assert time.monotonic() - read.beat_t < 1.0, "the thread rewrites the beat twice a second"
    assert read.beat_t > read.progress_t


def test_a_job_without_progress_for_the_timeout_is_hung_the_stalled_rank_first(tmp_path):
    write_beat(tmp_path, 0, os.getpid(), progress_ago=5.0)
    write_beat(tmp_path, 1, os.getpid(), progress_ago=2.0)
    assert HangWatch(tmp_path, timeout=3.0).poll()[1] is None, "rank 1 progressed 2 s ago"
    hang = HangWatch(tmp_path, timeout=1.5).poll()[1]
    assert hang is not None and hang.seconds >= 1.5
    assert [r.rank for r in hang.ranks] == [0, 1], "the rank idle longest is named first"
    assert {r.state for r in hang.ranks} == {"waiting"}


def test_a_rank_that_exited_means_the_job_reacted_and_teardown_gets_torchruns_grace(tmp_path):
    write_beat(tmp_path, 0, dead_pid(), progress_ago=20.0, beat_ago=20.0)
    write_beat(tmp_path, 1, os.getpid(), progress_ago=20.0)
    watch = HangWatch(tmp_path, timeout=5.0)
    exits, hang = watch.poll()
    assert hang is None, "torchrun is still tearing the attempt down"
    assert [b.rank for b in exits] == [0]
    exits, late = watch.poll(now=time.monotonic() + TORCHRUN_SHUTDOWN_SECONDS)
    assert exits == [], "an exit is reported once"
    assert late is not None and late.after_exit == [0]
    assert peers_gone(tmp_path, os.getpid()) == [0]


def test_no_rank_left_and_none_restarted_is_a_hang_between_attempts(tmp_path):
    """torchrun waits in its rendezvous for a node that cannot join: no worker at all."""
    write_beat(tmp_path, 0, dead_pid(), progress_ago=20.0, beat_ago=8.0)
    write_beat(tmp_path, 1, dead_pid(), progress_ago=20.0, beat_ago=6.0)
    watch = HangWatch(tmp_path, timeout=5.0)
    hang = watch.poll()[1]
    assert hang is not None and hang.between_attempts and hang.ranks == []
    assert 6.0 <= hang.seconds < 7.0 and hang.after_exit == [0, 1]
    watch.launch_began()  # a relaunch: its workers get the whole timeout to start
    assert watch.poll()[1] is None
    assert HangWatch(tmp_path, timeout=10.0).poll()[1] is None, "a restart takes seconds"
    waiting = HangWatch(tmp_path, timeout=5.0)
    waiting.excuse_until(time.monotonic() + 3)  # a partition heals in 3 s: the job may wait
    assert waiting.poll()[1] is None
    assert waiting.poll(now=time.monotonic() + 8.5)[1] is not None


def test_ranks_stuck_after_their_training_ended_are_a_hang_at_exit(tmp_path):
    """One rank exited cleanly, one is stuck in destroy_process_group: no torchrun
    teardown is under way (nothing failed), so no grace, and the hang is at exit."""
    write_beat(tmp_path, 0, dead_pid(), progress_ago=6.0, beat_ago=6.0, doing="exiting")
    write_beat(tmp_path, 1, os.getpid(), progress_ago=6.0, doing="teardown")
    hang = HangWatch(tmp_path, timeout=5.0).poll()[1]
    assert hang is not None and hang.at_exit and hang.after_exit == [0]
    write_beat(tmp_path, 0, os.getpid(), progress_ago=6.0, doing="step")  # still training
    hang = HangWatch(tmp_path, timeout=5.0).poll()[1]
    assert hang is not None and not hang.at_exit
    write_beat(tmp_path, 0, os.getpid(), progress_ago=6.0, doing="teardown after an error")
    assert not HangWatch(tmp_path, timeout=5.0).poll()[1].at_exit


def test_every_rank_exited_after_its_training_and_torchrun_waits_is_a_hang_at_exit(
        tmp_path):
    write_beat(tmp_path, 0, dead_pid(), progress_ago=20.0, beat_ago=8.0, doing="exiting")
    write_beat(tmp_path, 1, dead_pid(), progress_ago=20.0, beat_ago=6.0, doing="teardown")
    hang = HangWatch(tmp_path, timeout=5.0).poll()[1]
    assert hang is not None and hang.between_attempts and hang.at_exit
    write_beat(tmp_path, 1, dead_pid(), progress_ago=20.0, beat_ago=6.0, doing="step")
    assert not HangWatch(tmp_path, timeout=5.0).poll()[1].at_exit, "rank 1 died training"


def test_a_script_that_returned_is_told_from_one_still_training():
    returned = 'Thread 7 (idle): "MainThread"\n    <module> (/home/me/train.py:120)\n'
    training = ('Thread 7 (idle): "MainThread"\n    all_reduce (/v/torch/distributed/'
                'distributed_c10d.py:3252)\n    <module> (/home/me/train.py:40)\n')
    shutdown = 'Thread 7 (idle): "MainThread"\n    _shutdown (/usr/lib/threading.py:1590)\n'
    assert stacks.script_returned(returned) and stacks.script_returned(shutdown)
    assert not stacks.script_returned(training) and not stacks.script_returned("")


def test_a_restart_that_burns_cpu_is_busy_and_one_that_waits_is_not(tmp_path):
    """Between attempts no rank beats; a worker importing torch on a loaded machine
    works, a torchrun waiting for a node that never comes does not."""
    run_id = f"busytest{os.getpid()}"
    lifeline.own(run_id)  # another pytest worker's harness sweeps runs no harness owns
    environ = {**os.environ, "TORCHCHAOS_RUN_ID": run_id}
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"], env=environ)
    try:
        assert RunCpu(run_id).busy(1.0)  # a share of a core, also on a loaded machine
    finally:
        spin.kill()
        spin.wait()
    wait = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env=environ)
    try:
        time.sleep(0.3)  # past its start-up
        assert not RunCpu(run_id).busy(1.0)
    finally:
        wait.kill()
        wait.wait()


def test_a_rank_kept_from_the_cpu_by_load_is_slow_and_a_stopped_one_is_hung(tmp_path):
    """Issue 43: a rank in a long step on a core shared with three busy processes waits
    for the core most of the time. That is load, not a stall: the bound counts the time
    it could have run. A stopped rank waits for no core: its bound is the wall clock."""
    core = {min(os.sched_getaffinity(0))}
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 preexec_fn=lambda: os.sched_setaffinity(0, core))
                for _ in range(4)]
    try:
        working, stopped = spinners[0], spinners[1]
        stop(stopped.pid)
        (tmp_path / "slow").mkdir()
        (tmp_path / "hung").mkdir()
        write_beat(tmp_path / "slow", 0, working.pid, progress_ago=0.0)
        write_beat(tmp_path / "hung", 0, stopped.pid, progress_ago=0.0)
        slow, hung = HangWatch(tmp_path / "slow", 1.5), HangWatch(tmp_path / "hung", 1.5)
        for watch in (slow, hung):  # each reads the rank's wait when it sees the progress
            assert watch.poll()[1] is None
        time.sleep(3.0)
        assert slow.poll()[1] is None, "a quarter of a core for 3 s: about 0.75 s of work"
        hang = hung.poll()[1]
        assert hang is not None and hang.seconds >= 3.0
        assert hang.culprit.state == "stopped"
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def test_the_default_bound_holds_three_start_ups_of_the_reference():
    """A restart pays torchrun's and the workers' start-up again (launch to boot)."""
    slow = Timeline()
    slow.add("launch", launch=0, pids=[1])
    slow.t += 4.0  # each event adds a second: the boot comes 5 s after the launch
    slow.add("boot", **slow.proc(0))
    slow.t += 1.0
    slow.add("step", step=1, **slow.proc(0))
    assert default_timeout(slow.history()) == pytest.approx(15.0)


def test_no_stack_is_never_silent(tmp_path):
    text, why = stacks.capture(dead_pid(), tmp_path / "fh.txt")
    assert text == "" and why.startswith("py-spy: ") and "faulthandler: " in why


def test_the_interpreter_waiting_at_exit_names_the_threads_it_waits_for():
    dump = """Process 7: python train.py
Thread 7 (idle): "MainThread"
    _shutdown (/usr/lib/python3.11/threading.py:1590)
Thread 9 (idle): "torchchaos-heartbeat"
    Heartbeat._run (/x/chaos/rundir/heartbeat.py:83)
Thread 12 (idle): "uploader"
    Thread.run (/usr/lib/python3.11/threading.py:982)
"""
    assert stacks.summarize(dump).endswith("waiting for thread(s) still running: uploader")


def test_ranks_stopped_on_purpose_and_older_attempts_do_not_count(tmp_path):
    write_beat(tmp_path, 0, os.getpid(), progress_ago=50.0, stopped=True)
    write_beat(tmp_path, 1, dead_pid(), progress_ago=50.0)
    assert HangWatch(tmp_path, timeout=1.0).poll()[1] is None
    write_beat(tmp_path, 1, os.getpid(), progress_ago=0.0, attempt=1)  # a restart began
    assert HangWatch(tmp_path, timeout=1.0).poll()[1] is None


def test_a_sigstopped_rank_is_named_as_stopped(tmp_path, sleeper):
    write_beat(tmp_path, 0, os.getpid(), progress_ago=3.0)
    write_beat(tmp_path, 1, sleeper.pid, progress_ago=4.0)
    stop(sleeper.pid)
    hang = HangWatch(tmp_path, timeout=1.0).poll()[1]
    assert hang is not None and hang.culprit.rank == 1 and hang.culprit.state == "stopped"


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
def test_py_spy_takes_the_stack_of_a_running_or_stopped_process(tmp_path, sleeper, stopped):
    if stopped:
        stop(sleeper.pid)
    text, how = stacks.capture(sleeper.pid, tmp_path / "unused.txt")
    assert how == "py-spy", text
    frames = stacks.main_thread(text)
    assert [f.func for f in frames[:2]] == ["wait_for_peers", "<module>"]
    assert stacks.summarize(text).startswith("wait_for_peers (sleeper.py:")


def test_the_main_thread_is_found_by_its_id_where_py_spy_gives_no_name():
    """py-spy names threads only in a target that imported `threading` (a plain script
    in a venv does not): the main thread is then the one whose id is the process's."""
    text = ("Process 21792: /tmp/v0/bin/python sleeper.py\nPython v3.11.7\n\n"
            "Thread 21795 (idle)\n    helper (sleeper.py:3)\n"
            "Thread 21792 (idle)\n    wait_for_peers (sleeper.py:9)\n    run (sleeper.py:12)\n")
    assert [f.func for f in stacks.main_thread(text)] == ["wait_for_peers", "run"]
    assert stacks.summarize(text).startswith("wait_for_peers (sleeper.py:9)")


def test_a_process_without_the_agent_is_never_sent_the_stack_signal(monkeypatch):
    """A torchrun agent has no handler for STACK_SIGNAL, whose default action kills."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # py-spy could not attach
        monkeypatch.setattr(stacks, "_py_spy", lambda pid: ("", "Permission denied"))
        text, why = stacks.capture(proc.pid, None)
        assert text == "" and why.startswith("py-spy: Permission denied; no faulthandler")
        time.sleep(0.3)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_faulthandler_is_the_fallback_and_continues_a_stopped_process(tmp_path, sleeper):
    stop(sleeper.pid)
    text, why = stacks._faulthandler(sleeper.pid, tmp_path / "fh.txt")
    assert "wait_for_peers" in text and why == ""
    assert stacks.summarize(text).startswith("wait_for_peers (sleeper.py:")


def test_the_summary_names_the_collective_and_the_targets_own_call():
    dump = """Thread 7 (idle): "MainThread"
    all_reduce (/venv/site-packages/torch/distributed/distributed_c10d.py:3252)
    wrapper (/venv/site-packages/torch/distributed/c10d_logger.py:83)
    check (/home/me/train.py:60)
    main (/home/me/train.py:268)
    <module> (/home/me/train.py:286)
Thread 9 (idle): "pt_autograd_0"
    run (/usr/lib/python3.11/threading.py:982)
"""
    assert stacks.summarize(dump) == ("all_reduce (distributed_c10d.py:3252)"
                                      " <- check (train.py:60)")
    assert stacks.summarize("") == "no stack could be taken"


def test_the_default_bound_grows_with_the_slowest_progress_gap_of_the_reference():
    fast = Timeline()
    fast.train(2, range(1, 6))  # one second between events
    assert default_timeout(fast.history()) == 10.0
    slow = Timeline()
    slow.add("boot", **slow.proc(0))
    slow.t += 7.0
    slow.add("step", step=1, **slow.proc(0))
    assert default_timeout(slow.history()) == pytest.approx(24.0)


def test_the_default_bound_follows_the_collective_timeout_the_job_set():
    """A job that set a 60 s timeout gets it and half again: its own timeout ends a
    stopped rank's wait before the harness does. One that kept torch's default set none
    (the agent records no timeout): the bound stays the job's pace."""
    job = Timeline()
    job.train(2, range(1, 6))
    assert default_timeout(job.history()) == 10.0
    for event in job.events:
        if event["ev"] == "restore":
            event["collective_timeout"] = 60.0
    assert default_timeout(job.history()) == pytest.approx(92.0)
    for event in job.events:
        if event["ev"] == "restore":
            event["collective_timeout"] = 5.0  # the bundled target's: the pace decides
    assert default_timeout(job.history()) == 10.0


def hang_finding() -> dict:
    ranks = [{"rank": 1, "pid": 11, "step": 8, "doing": "step", "idle_seconds": 10.2,
              "state": "stopped", "where": "train_step (train.py:40)",
              "stacks": "_chaos/stacks/rank-1.txt"},
             {"rank": 0, "pid": 10, "step": 8, "doing": "forward", "idle_seconds": 10.0,
              "state": "waiting", "where": "all_reduce (distributed_c10d.py:3252)",
              "stacks": "_chaos/stacks/rank-0.txt"}]
    return {"seconds": 10.2, "ranks": ranks, "after_exit": [], "stacks_dir": "_chaos/stacks",
            "t": 100.0}


def test_hang_detected_says_when_the_job_reacted_but_could_not_start_again():
    timeline = Timeline()
    timeline.train(2, range(1, 9))
    hang = {"seconds": 10.0, "ranks": [], "after_exit": [0, 1], "between_attempts": True,
            "agents": [{"node": 0, "where": "DynamicRendezvousHandler.next_rendezvous"}],
            "stacks_dir": "_chaos/stacks", "t": 100.0}
    result = checkers.hang_detected(evidence(timeline.history(), completed=False, hang=hang,
                                             hang_timeout=10.0))
    assert result.ok is False
    assert result.detail.startswith("hung for 10 s, the ranks' timeouts fired but the job could"
                                    " not start again (bound 10 s): every rank had exited (ranks"
                                    " [0, 1]) and no new attempt started: torchrun waits, node 0"
                                    " in DynamicRendezvousHandler.next_rendezvous"), result.detail


def test_hang_detected_fails_with_where_each_rank_was_when_the_harness_stepped_in():
    timeline = Timeline()
    timeline.train(2, range(1, 9))
    result = checkers.hang_detected(evidence(timeline.history(), completed=False,
                                             hang=hang_finding(), hang_timeout=10.0))
    assert result.ok is False
    assert result.detail.startswith("hung for 10.2 s, no watchdog or collective timeout fired")
    assert "rank 1 stopped after step 8 in train_step (train.py:40)" in result.detail
    assert "rank 0 waiting after step 8 in all_reduce" in result.detail


def test_hang_detected_passes_when_a_peer_exits_within_the_bound_and_the_job_completes():
    timeline = Timeline()
    timeline.train(2, range(1, 9))
    timeline.add("hang_begin", id="f0-hang", mode="stop", **timeline.proc(1))
    timeline.t += 4.0
    timeline.add("rank_exit", rank=0, pid=1000)
    result = checkers.hang_detected(evidence(timeline.history(), hang_timeout=10.0))
    assert result.ok is True and result.data["reaction_seconds"] == pytest.approx(5.0)
    assert "rank 0 exited 5.0 s after the hang began" in result.detail
    not_done = checkers.hang_detected(evidence(timeline.history(), completed=False,
                                               hang_timeout=10.0))
    assert not_done.ok is False and "did not complete" in not_done.detail


def test_hang_detected_is_undecided_without_a_hang_and_reports_stragglers():
    timeline = Timeline()
    timeline.train(2, range(1, 9))
    assert checkers.hang_detected(evidence(timeline.history(), hang_timeout=10.0)).ok is None
    timeline.add("straggler", id="f0-straggler", delay=0.5, steps=None, **timeline.proc(1))
    result = checkers.hang_detected(evidence(timeline.history(), hang_timeout=10.0))
    assert result.ok is True and "straggler rank 1 (+0.5 s per step)" in result.detail
    assert result.data["slowdown"] == 2.0  # 20 s against the reference's 10 s
    assert set(result.data["step_seconds"]) == {"0", "1"}


def test_reaction_names_a_stall_that_ended_by_itself():
    timeline = Timeline()
    timeline.add("hang_begin", id="f0-hang", mode="collective", **timeline.proc(1))
    timeline.add("hang_end", id="f0-hang", how="released", **timeline.proc(1))
    found = hangs.reaction(timeline.history())
    assert found is not None and found.how == "the stall ended by itself"
