"""`torchchaos battery --list`, `-k EXPR` and `-x`, and the table's one vocabulary.

--list prints the plan and runs nothing (placed from a cached reference, else
outlined with `?`); -k picks rows by name as pytest's -k does, refusing an
expression that does not parse or selects nothing before anything runs; -x stops
at the first row that does not pass. The table names checks as `--check` does.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, TARGET, chaos_processes
from histories import Timeline

from torchchaos.errors import UsageError
from torchchaos.explore import battery, runs
from torchchaos.explore.keywords import Keywords
from torchchaos.harness import runner
from torchchaos.report.report_file import Report
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Spec

CLI = [sys.executable, "-m", "torchchaos.cli"]


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


# -- -k: pytest's expressions over row names ----------------------------------------------

NAMES = ["kill rank 0 at step 12", "kill rank 1 at step 12", "kill node 0 at step 12",
         "kill rank 0 mid-write in its 2nd save", "preempt rank 0 (SIGTERM) at step 12"]


@pytest.mark.parametrize("expression, chosen", [
    ("kill", [0, 1, 2, 3]),
    ("KILL and NODE", [2]),  # any case, as pytest's -k
    ("kill and not node", [0, 1, 3]),
    ("node or preempt", [2, 4]),
    ("not kill", [4]),
    ("kill and (node or mid-write)", [2, 3]),
    ("rank and 1 or sigterm", [0, 1, 4]),  # `and` binds tighter than `or`
    ("not (kill or preempt)", []),
    ("", [0, 1, 2, 3, 4]),  # no expression: every row, as pytest
])
def test_k_selects_rows_by_name_as_pytest_does(expression, chosen):
    keywords = Keywords(expression)
    assert [i for i, name in enumerate(NAMES) if keywords.selects(name)] == chosen


@pytest.mark.parametrize("expression, says", [
    ("kill and", "expected a word, 'not' or '(' at column 9, got the end"),
    ("kill node", "expected 'and', 'or' or the end at column 6, got 'node'"),
    ("(kill or node", "expected ')' at column 14, got the end"),
    ("kill)", "expected 'and', 'or' or the end at column 5, got ')'"),
    ("kill & node", "unexpected '&' at column 6"),
    ("or", "expected a word, 'not' or '(' at column 1, got 'or'"),
])
def test_an_expression_that_does_not_parse_is_refused(expression, says):
    with pytest.raises(UsageError, match=re.escape(f"-k {expression!r}: {says}")):
        Keywords(expression)


def test_a_number_in_k_may_select_an_outlined_row():
    """Outlined rows have `?` where the reference run puts a number: a word with a
    digit in it may or may not match there (None), one without is known."""
    keywords = Keywords("step and 12")
    assert keywords.selects("kill rank 0 at step ?") is None
    assert keywords.selects("kill rank 0 mid-write in its 2nd save") is False
    assert Keywords("not 12").selects("kill rank ? at step ?") is None
    assert Keywords("kill and not node").selects("kill rank ? at step ?") is True
    assert Keywords("node or 7").selects("kill node 0 at step ?") is True


def _reference(*saves: list[tuple[str, str]]) -> History:
    """20 steps on 2 ranks, rank 0 saving every 5 with these (op, path) file events."""
    timeline = Timeline()
    timeline.train(2, range(1, 21), save_every=0)
    for number, events in enumerate(saves, start=1):
        timeline.add("save_begin", save=number, after_step=5 * number, **timeline.proc(0))
        for index, (op, path) in enumerate(events, start=1):
            timeline.add("file", op=op, path=path, save=number, index=index,
                         **timeline.proc(0))
    return timeline.history()


ATOMIC = [("open", "ckpt/.tmp"), ("write", "ckpt/.tmp"), ("fsync", "ckpt/.tmp"),
          ("rename", "ckpt/latest.pt"), ("fsync", "ckpt")]
IN_PLACE = [("open", "ckpt/latest.pt"), ("write", "ckpt/latest.pt")]
PRUNING = [("open", "ckpt/.tmp"), ("rename", "ckpt/step-15.pt"), ("remove", "ckpt/.tmp2"),
           ("remove", "ckpt/step-5.pt")]  # keeps two: its first delete of an earlier save's


@pytest.mark.parametrize("save", [ATOMIC, IN_PLACE, []], ids=["atomic", "in place", "none"])
def test_every_placed_row_is_one_of_the_outlined_rows(monkeypatch, save):
    """What --list shows before the reference run (the outline) names every row the
    plan places, `?` standing for the numbers, so -k decided on it holds after."""
    monkeypatch.setattr("torchchaos.faults.faultfs.mount.unavailable_reason", lambda: "")
    base = Scenario(script=str(TARGET))
    outlined = [entry for entry, _ in battery.outline(base, lambda _m: None)]

    def pattern(text: str) -> re.Pattern[str]:
        """`?`: a number or a folder; `,dir=?`: none for the default folder, ckpt."""
        escaped = "".join(r"([\w.]+)" if c == "?" else re.escape(c) for c in text)
        return re.compile(escaped.replace(r",dir=([\w.]+)", r"(,dir=[\w.]+)?"))

    placed = battery.plan_from(_reference(ATOMIC, save), base, lambda _m: None)
    placed += battery.plan_from(_reference([("rename", "ckpt/step-5.pt")],
                                           [("rename", "ckpt/step-10.pt")], PRUNING),
                                base, lambda _m: None)
    assert len(placed) >= 4
    for entry in placed:
        assert any(pattern(o.name).fullmatch(entry.name) and pattern(str(o.fault)).fullmatch(
            str(entry.fault)) for o in outlined), entry


def test_the_first_save_that_deletes_gets_a_kill_right_after_its_first_delete(monkeypatch):
    """A job keeping its two newest checkpoints deletes first in save 3: a prune bug
    bites only there (issue 41). The row kills after the deletion of an earlier save's
    file, not after a temporary file's removal."""
    monkeypatch.setattr("torchchaos.faults.faultfs.mount.unavailable_reason", lambda: "")
    said: list[str] = []
    placed = battery.plan_from(_reference([("rename", "ckpt/step-5.pt")],
                                          [("rename", "ckpt/step-10.pt")], PRUNING),
                               Scenario(script=str(TARGET)), said.append)
    rows = [e for e in placed if "delete" in e.name]
    assert [(e.name, str(e.fault)) for e in rows] == [
        ("kill rank 0 right after a delete in its 3rd save (the first that deletes)",
         "kill:rank=0,phase=checkpoint_save,save=3,event=4")]
    assert any("save 3 is the first that deletes" in line for line in said)
    without = battery.plan_from(_reference(ATOMIC, ATOMIC), Scenario(script=str(TARGET)),
                                said.append)
    assert not [e for e in without if "delete" in e.name]


# -- --list and -k on the command line: nothing runs -----------------------------------------

def test_list_outlines_the_plan_without_a_cached_reference_and_runs_nothing(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out"
    started = time.monotonic()
    result = cli("battery", "--list", "--cache-dir", str(cache), "--out", str(out),
                 cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30  # no reference run was waited for
    assert list(tmp_path.iterdir()) == [], "--list writes nothing, not even the cache"
    assert chaos_processes(tmp_path) == []
    lines = result.stdout.splitlines()
    assert "the reference run is not cached" in result.stdout
    for name, fault in [("kill rank 0 at step ?", "kill:rank=0,step=?"),
                        ("kill node 0 at step ?", "kill:node=0,step=?"),
                        ("kill rank ? mid-write in its 2nd save",
                         "kill:rank=?,phase=checkpoint_save,save=2,event=?"),
                        ("preempt rank 0 (SIGTERM) at step ?",
                         "kill:rank=0,step=?,signal=SIGTERM,grace=30")]:
        at = lines.index(f"    {name}")
        assert lines[at + 1] == f"      {fault}"
    assert "(where the 2nd save makes a write)" in result.stdout


def test_list_with_k_lists_only_the_rows_it_selects(tmp_path):
    result = cli("battery", "--list", "-k", "kill and not node", "--cache-dir",
                 str(tmp_path / "cache"), cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    names = [line.strip() for line in result.stdout.splitlines() if line.startswith("    ")
             and not line.startswith("      ")]
    assert names == ["kill rank 0 at step ?", "kill rank 1 at step ?",
                     "kill rank ? mid-write in its 2nd save",
                     "kill rank ? right after a rename in its 2nd save",
                     "kill rank ? right after a delete in its ? save (the first that deletes)"]


@pytest.mark.parametrize("args, says", [
    (["-k", "kill and"], "-k 'kill and': expected a word, 'not' or '(' at column 9"),
    (["-k", "frobnicate"], "-k 'frobnicate' selects none of the battery's rows"),
    (["-k", "kill and preempt"], "-k 'kill and preempt' selects none of the battery's rows"),
    (["--list", "-k", "(kill"], "-k '(kill': expected ')' at column 6, got the end"),
    (["--list", "-k", "frobnicate"], "-k 'frobnicate' selects none of the battery's rows"),
])
def test_a_bad_or_empty_selection_is_refused_before_anything_runs(tmp_path, args, says):
    """One line, exit 2, nothing written and nothing started (no reference: its cache
    would appear)."""
    result = cli("battery", "--cache-dir", str(tmp_path / "cache"), "--out",
                 str(tmp_path / "out"), *args, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"torchchaos: error: {says}"), lines
    assert list(tmp_path.iterdir()) == []
    assert chaos_processes(tmp_path) == []


# -- -x: stop at the first row that does not pass ------------------------------------------

def _report(verdict: str) -> Report:
    ok = verdict == "pass"
    return Report(verdict=verdict, checks={"completes": {"ok": ok, "detail": "d"}})


@pytest.mark.parametrize("jobs", [1, 4])
def test_exitfirst_stops_at_the_first_run_that_does_not_pass(monkeypatch, tmp_path, jobs):
    """Row 2 fails: -x ends the sweep there; with --jobs, the runs still going are
    cancelled (they see the cancel, as a real run's Job does) and not counted."""
    verdicts = {1: "pass", 2: "fail", 3: "pass", 4: "pass"}
    cancelled = threading.Event()

    def run_entry(entry, number, total, base, out_dir, cache_dir, progress):
        if number == 2:
            time.sleep(0.2)  # after row 1 is judged
        if number > 2 and jobs > 1:
            while not runner._CANCELLED.is_set():
                time.sleep(0.01)
            cancelled.set()
            raise KeyboardInterrupt
        entry.report = _report(verdicts[number])

    monkeypatch.setattr(runs, "_run_entry", run_entry)
    monkeypatch.setattr(runs, "write_index", lambda *a, **k: None)
    entries = [runs.Entry(f"row {n}", Spec.make("kill", rank=0, step=n)) for n in verdicts]
    with pytest.raises(runs.SweepStopped) as stop:
        runs.run_entries(entries, Scenario(script=str(TARGET)), tmp_path, tmp_path,
                          lambda _m: None, jobs=jobs, exitfirst=True)
    runner.reset_cancel()
    assert stop.value.finished == [1, 2] and stop.value.planned == 4
    assert "stopped at the first row that did not pass (-x): 2 of 4" in str(stop.value)
    assert cancelled.is_set() == (jobs > 1)
    assert entries[2].report is None and entries[3].report is None


def test_x_stops_a_buggy_battery_after_its_first_failing_row(tmp_path):
    """The bundled target with its checkpoint written in place (--bug write_in_place):
    -k picks a kill between checkpoints (passes), the kill mid-write (fails) and the
    preemption after it, which -x never starts. Then --list places the rows from the
    reference run this made, running nothing."""
    job = ["--nproc", "1", "--max-restarts", "1", "--max-relaunches", "0",
           "--cache-dir", str(tmp_path / "cache")]
    script = ["--", str(TARGET), "--steps", "12", "--ckpt-every", "4", "--bug",
              "write_in_place"]
    out = tmp_path / "out"
    result = cli("battery", "--quiet", "-x", "-k", "kill and step and not node or kill and"
                 " mid-write or preempt", "--out", str(out), *job, *script, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines()
            if line.startswith(("kill", "preempt"))]
    assert rows == ["kill rank 0 at step 7                  PASS",
                    "kill rank 0 mid-write in its 2nd save  FAIL     atomic_recovery, completes"]
    assert "stopped at the first row that did not pass (-x): 2 of 3 row(s) run" in result.stdout
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["01", "02"]
    index = (out / "index.html").read_text()
    assert "mid-write" in index and "preempt" not in index
    listed = cli("battery", "--list", *job, *script, cwd=tmp_path, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "placed from the reference run cached in" in listed.stdout
    lines = listed.stdout.splitlines()
    first = lines.index("01  kill rank 0 at step 7")
    assert lines[first + 1] == "      kill:rank=0,step=7"
    assert "      storage:mode=lose_unsynced,rank=0,step=9" in lines  # after the 2nd save


# -- the table: the checks by the names --check takes ---------------------------------------

CHECKS = ["completes", "atomic_recovery", "deterministic_resume", "bounded_lost_work",
          "durable_checkpoints", "sdc_detected", "hang_detected", "no_split_brain",
          "no_orphans"]


def test_the_table_names_checks_as_check_does_and_fits_100_columns():
    def report(*failing: str) -> Report:
        return Report(verdict="fail" if failing else "pass", checks={
            name: {"ok": False if name in failing else (True if name in CHECKS[:5] else None),
                   "detail": f"{name} went wrong"} for name in CHECKS})

    entries = [runs.Entry("kill rank 0 at step 12", Spec.read("kill:rank=0,step=12"), report()),
               runs.Entry("kill rank 0 mid-write in its 2nd save", Spec("kill"),
                             report("completes", "atomic_recovery")),
               runs.Entry("power loss on rank 0 after a rename in its 2nd save", Spec("storage"),
                             error="no FUSE")]
    lines = runs.table(entries).splitlines()
    assert lines[0].split() == ["scenario", "verdict", "failing", "checks"]
    assert lines[2].endswith("  PASS")
    assert lines[3].endswith("  FAIL     atomic_recovery, completes")  # the cause first
    assert lines[4].endswith("  ERROR")
    assert "  kill rank 0 mid-write in its 2nd save / atomic_recovery: atomic_recovery went" \
           " wrong" in lines
    at = next(i for i, line in enumerate(lines) if line.startswith("checks judged"))
    judged = " ".join(line.strip() for line in lines[at:])
    assert "checks judged (each where it applies): " + ", ".join(CHECKS) in judged
    for short in ("bitwise", "lost_work ", "durable ", "orphans", "split "):
        assert short not in "\n".join(lines[:5])
    assert max(len(line) for line in lines if "/" not in line and "could not" not in line
               ) <= 100


def test_battery_help_names_the_options_and_a_planted_bug_to_try():
    result = cli("battery", "--help", cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    for words in ("--list", "-k EXPR", "-x, --exitfirst", "'kill and not node'",
                  "torchchaos battery -x -- targets/ddp_lm.py --steps 20 --ckpt-every 5"
                  " --bug write_in_place", "exit status: 0 every row passed"):
        assert words in result.stdout, words
