"""Crash-point enumeration: which points exist, sampling, and a real (capped) run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TARGET

from torchchaos.explore.crash.points import CrashPoint, PointPlan, entries, enumerate_points, sample
from torchchaos.faults.faultfs.mount import unavailable_reason
from torchchaos.rundir.history import History


def _event(index: int, op: str, rank: int = 0) -> dict:
    return {"rank": rank, "index": index, "op": op, "path": f"ckpt/f{index}", "save": 2}


EVENTS = [_event(1, "open"), _event(2, "write"), _event(3, "fsync"), _event(4, "rename"),
          _event(1, "open", rank=1), _event(2, "write", rank=1)]


def test_every_event_gets_every_mode_but_torn_only_hits_writes():
    points = enumerate_points(EVENTS, ["kill", "lose_unsynced", "torn"])
    assert len(points) == 6 * 2 + 2  # two writes can be torn
    torn = [p for p in points if p.mode == "torn"]
    assert [(p.rank, p.event["op"]) for p in torn] == [(0, "write"), (1, "write")]


def test_points_become_the_specs_that_crash_there():
    write = _event(2, "write")
    assert str(CrashPoint(0, write, "kill").spec(2)) == (
        "kill:rank=0,phase=checkpoint_save,save=2,event=2")
    assert str(CrashPoint(0, write, "lose_unsynced").spec(2)) == (
        "storage:mode=lose_unsynced,rank=0,phase=checkpoint_save,save=2,event=2")
    # a torn write is armed right after the event before it, and tears the next write
    assert str(CrashPoint(0, write, "torn").spec(2)) == (
        "storage:mode=torn,rank=0,phase=checkpoint_save,save=2,event=1")


def test_storage_points_name_the_folder_their_fault_filesystem_goes_on():
    write = _event(2, "write")
    points = enumerate_points([write], ["kill", "lose_unsynced", "torn"], folder="out")
    assert [str(p.spec(2)) for p in points] == [
        "kill:rank=0,phase=checkpoint_save,save=2,event=2",  # a kill needs no mount
        "storage:mode=lose_unsynced,rank=0,phase=checkpoint_save,save=2,event=2,dir=out",
        "storage:mode=torn,rank=0,phase=checkpoint_save,save=2,event=1,dir=out"]
    assert str(CrashPoint(0, write, "lose_unsynced", ".").spec(2)).endswith("event=2,dir=.")


def test_from_a_snapshot_the_save_under_test_is_the_first_of_the_process():
    kill = CrashPoint(1, _event(2, "write", rank=1), "kill")
    power = CrashPoint(1, _event(2, "write", rank=1), "lose_unsynced")
    [scratch] = entries(PointPlan([kill], 1, None), 3)
    assert str(scratch.fault).endswith("save=3,event=2") and scratch.start_from is None
    fast, slow = entries(PointPlan([kill, power], 2, Path("snap")), 3)
    assert str(fast.fault).endswith("save=1,event=2") and fast.start_from == "snap"
    # what a power loss drops depends on the earlier saves' fsyncs: a copy has none
    assert str(slow.fault).endswith("save=3,event=2") and slow.start_from is None


def test_sampling_is_capped_seeded_and_keeps_order():
    points = enumerate_points(EVENTS, ["kill", "lose_unsynced"])
    a, b = sample(points, 5, seed=3), sample(points, 5, seed=3)
    assert a == b and len(a) == 5
    assert [points.index(p) for p in a] == sorted(points.index(p) for p in a)
    assert sample(points, None, 0) == points and sample(points, 100, 0) == points


@pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())
def test_capped_enumeration_finds_the_missing_fsync(tmp_path, shared_cache):
    """Save 2 of the target without fsyncs: 6 file events, 12 points in two modes, a
    seeded sample of one each. A power loss in save 2 takes save 1 with it, though
    training had moved on from it. A kill keeps the page cache, so it passes; it
    starts from the reference's copy of the checkpoints after save 1 (step 5), the
    power loss from step 0 (a copy cannot say what was fsynced). The reference is the
    session's (the crash states test below, the doctor's and the storage tests' too)."""
    out = tmp_path / "points"
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "crashpoints", "--per-point", "--mode",
         "lose_unsynced", "--mode", "kill", "--cap", "2", "--seed", "1", "--out", str(out),
         "--cache-dir", str(shared_cache), "--", str(TARGET), "--steps", "20",
         "--ckpt-every", "5", "--bug", "no_fsync"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 of 12 points run, 1 broke the protocol" in done.stdout, done.stdout
    power, kill = (json.loads(p.read_text()) for p in sorted(out.glob("*/report.json")))
    assert power["checks"]["durable_checkpoints"]["ok"] is False, done.stdout
    assert kill["verdict"] == "pass", done.stdout
    starts = [History.of_run(Path(r["run_dir"])).of("restore")[0] for r in (power, kill)]
    assert [(s["launch"], s["attempt"], s["restored"]) for s in starts] == [(0, 0, 0),
                                                                           (0, 0, 5)]


@pytest.mark.slow  # 30 s; test_e2e_dcp.py covers the async sharded target's saves
@pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())
def test_capped_enumeration_over_an_async_sharded_save_passes_the_correct_target(tmp_path):
    """Save 2 of the DCP target: 15 file events on rank 0, 4 on rank 1, in three modes;
    a seeded sample of 3 runs, and the correct protocol survives each."""
    out = tmp_path / "points"
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "crashpoints", "--per-point", "--cap", "3",
         "--seed", "2", "--out", str(out), "--cache-dir", str(tmp_path / "c"),
         "--", str(REPO / "targets" / "dcp_lm.py"), "--steps", "20", "--ckpt-every", "5"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 of 42 points run" in done.stdout, done.stdout
    rows = [line for line in done.stdout.splitlines() if " rank " in line and " at #" in line]
    assert len(rows) == 3 and all(row.endswith("PASS") for row in rows), done.stdout
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("*/report.json"))]
    # each point ends 3 steps after its recovery (--steps-after-resume, default 3)
    assert all("stopped as asked" in r["checks"]["completes"]["detail"] for r in reports)


def test_a_snapshot_that_records_its_own_folder_is_not_started_from(tmp_path):
    """Lightning pickles the checkpoint folder's absolute path: copied into a crash
    point's run directory, it resumes otherwise than the job does (issue 17)."""
    from torchchaos.explore.crash.points import _holds_path

    run = tmp_path / "ref" / "run-0"
    snapshot = tmp_path / "snapshot" / "ckpt"
    snapshot.mkdir(parents=True)
    (snapshot / "plain.pt").write_bytes(b"\0weights\0")
    assert _holds_path(snapshot.parent, run) is None
    (snapshot / "last.ckpt").write_bytes(b"\0dirpath\0" + str(run / "ckpt").encode())
    assert _holds_path(snapshot.parent, run) == "ckpt/last.ckpt"


def _crash_states(tmp_path: Path, cache: Path, *job: str,
                  mode: tuple[str, ...] | list[str] = (), cap: int | None = None
                  ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    tmp_path.mkdir(exist_ok=True)
    out = tmp_path / "states"
    narrow = [*(a for m in mode for a in ("--mode", m)), *(["--cap", str(cap)] if cap else [])]
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "crashpoints", *narrow, "--out", str(out),
         "--cache-dir", str(cache), "--", str(TARGET), "--steps", "20",
         "--ckpt-every", "5", *job],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    return done, [json.loads(p.read_text()) for p in sorted(out.glob("[0-9]*/report.json"))]


@pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())
def test_crash_states_catch_the_missing_fsync_and_the_in_place_write(tmp_path, shared_cache):
    """The planted bugs the per-point mode catches (test_capped_enumeration_finds_the_
    missing_fsync, the battery's in-place rows), caught from recordings: without fsync a
    power loss takes the finished checkpoint of step 5 (kills pass: the page cache
    keeps it); written in place, a torn write leaves no checkpoint to resume. The
    references (and recordings) are the session's: the doctor's and the storage tests'
    jobs are these."""
    # 6 of its ~2000 states, seeded, the modes taking turns: 3 kills at cuts across the
    # save (they pass) and 3 power losses of everything pending (they fail); 2 recoveries
    done, reports = _crash_states(tmp_path / "a", shared_cache, "--bug", "no_fsync",
                                  mode=["kill", "lose_unsynced"], cap=6)
    assert done.returncode == 1, done.stdout + done.stderr
    durable = [r for r in reports if r["checks"]["durable_checkpoints"]["ok"] is False]
    assert durable and all(r["crash_state"].startswith("power loss") for r in durable)
    kills = [r for r in reports if r["crash_state"].startswith("kill")]
    assert kills and all(r["verdict"] == "pass" for r in kills), done.stdout
    assert "lose_unsynced" in durable[0]["faults"][0]["spec"]
    replay = Path(durable[0]["replay"])  # the nearest chaos run, for `torchchaos replay`
    assert replay.is_file() and "lose_unsynced" in replay.read_text()
    # every torn write of the in-place file leaves a cut checkpoint: 3 of them suffice
    done, reports = _crash_states(tmp_path / "b", shared_cache, "--bug", "write_in_place",
                                  mode=["torn"], cap=3)
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(reports) == 3 and all(r["verdict"] == "fail" for r in reports), done.stdout
    atomic = [r["checks"]["atomic_recovery"] for r in reports]
    assert all(c["ok"] is False and "written in place" in c["detail"] for c in atomic)
    # each recovery started once: its resume read the torn file and died, which no
    # restart changes (the crash is the run's one restart)
    assert all(r["restarts"] == 1 and "the resume read the checkpoint and died before its"
               " first step" in r["checks"]["completes"]["detail"] for r in reports), [
        (r["restarts"], r["checks"]["completes"]["detail"][:120]) for r in reports]
    for report in reports:  # the save's operations up to the tear: the in-place file's
        ops = report["operations"]  # (the last 40, after a line that counts the rest)
        shown = ops[1:] if ops[0].endswith("earlier operation(s) of the save") else ops
        assert shown[0].startswith("open latest.pt") or len(shown) == 40, ops[:2]
        assert all("latest.pt" in op for op in shown), ops


@pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())
def test_a_damaged_cached_recording_is_named_and_made_again(tmp_path):
    """The recording crash states are built from is kept in the cache with the size and
    digest of every file; a history cut short there is said and recorded again, never
    built from (the states would be of a save that never happened)."""
    def record() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torchchaos.cli", "crashpoints", "--record-only",
             "--cache-dir", str(tmp_path / "c"), "--", str(TARGET), "--steps", "12",
             "--ckpt-every", "5"], capture_output=True, text=True, timeout=600,
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})

    first = record()
    assert first.returncode == 0, first.stdout + first.stderr
    [history] = (tmp_path / "c").glob("*-save2/run/_chaos/history/rank-0.jsonl")
    lines = history.read_text().splitlines(keepends=True)
    history.write_text("".join(lines[: len(lines) // 2]))
    again = record()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "is damaged: " in again.stderr and "rank-0.jsonl holds" in again.stderr, again.stderr
    assert "recording save 2" in again.stderr  # made again, not reused
    third = record()
    assert "reusing the cached recording" in third.stderr, third.stderr
