"""Sweeps with --jobs N: runs on threads, and a Ctrl-C that reaches every one of them.

A Ctrl-C raises KeyboardInterrupt in the main thread only; a run waiting on
another thread must still stop, heal and reap. These tests use a real job
(torchrun of a script that sleeps) and the real sweep loop.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import chaos_processes

from torchchaos.explore import runs
from torchchaos.harness import runner
from torchchaos.harness.runner import Job
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Spec

SLEEPER = ("import time, torch.distributed as dist\n"
           "dist.init_process_group('gloo')\ntime.sleep(120)\n")


def test_cancel_all_stops_a_job_waiting_on_another_thread(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = Job(Scenario(script=str(script), nproc=2, timeout=120), run_dir, faults=[])
    raised: list[BaseException] = []

    def wait_for_job() -> None:
        try:
            job.run()
        except BaseException as exc:  # noqa: BLE001 - what the thread ended with is the point
            raised.append(exc)

    thread = threading.Thread(target=wait_for_job)
    runner.reset_cancel()
    thread.start()
    deadline = time.monotonic() + 60
    while not chaos_processes(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert chaos_processes(run_dir), "the job never started"
    started = time.monotonic()
    runner.cancel_all()
    thread.join(60)
    runner.reset_cancel()
    assert not thread.is_alive()
    assert raised and isinstance(raised[0], KeyboardInterrupt)
    assert time.monotonic() - started < 30  # not the job's 120 s sleep, not its timeout
    assert chaos_processes(run_dir) == []


def test_parallel_sweep_runs_each_number_once_and_reports_in_order() -> None:
    seen: list[int] = []
    done: list[int] = []
    lock = threading.Lock()

    def run(number: int) -> None:
        time.sleep(0.05 * (5 - number))  # later numbers finish first
        with lock:
            seen.append(number)

    runs._in_parallel(run, done.append, range(1, 5), jobs=3)
    assert sorted(seen) == [1, 2, 3, 4]
    assert sorted(done) == [1, 2, 3, 4]
    assert done != [1, 2, 3, 4]  # reported as they finish, not held back


def test_an_interrupt_in_the_sweep_cancels_the_runs_still_going() -> None:
    cancelled = threading.Event()
    started = threading.Event()

    def run(number: int) -> None:
        if number == 1:
            started.wait(10)
            raise KeyboardInterrupt  # the first run to end carries the Ctrl-C
        started.set()
        while not runner._CANCELLED.is_set():  # what Job._wait does
            time.sleep(0.01)
        cancelled.set()

    with pytest.raises(KeyboardInterrupt):
        runs._in_parallel(run, lambda _n: None, range(1, 3), jobs=2)
    runner.reset_cancel()
    assert cancelled.is_set()  # the other run saw the cancel before the sweep returned


def test_every_error_row_of_a_sweep_says_why() -> None:
    """A run that could not be judged (no report) or judged 'error' prints its reason
    under the table, not a bare ERROR (issue 22)."""
    from torchchaos.report.report_file import Report

    judged = Report(verdict="error", checks={"completes": {"ok": True, "detail": "ok"}},
                    reason="fault(s) never fired: kill:rank=0,step=99")
    entries = [runs.Entry("kill late", Spec.read("kill:rank=0,step=99"), report=judged),
               runs.Entry("bad dir", Spec.read("storage:mode=lose_unsynced,dir=x"),
                             error="storage dir=x: leads outside the run directory")]
    table = runs.table(entries)
    assert "  kill late: could not judge: fault(s) never fired: kill:rank=0,step=99" in table
    assert "  bad dir: could not judge: storage dir=x: leads outside the run directory" in table
