"""Sharded sweeps and `torchchaos merge`: the shards split the plan exactly, the
engines' variables name the shard, a merge refuses what is not one whole plan, and a
merged campaign and merged crash states equal the unsharded ones on the bundled target."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from hypothesis import given
from hypothesis import strategies as st

from torchchaos.errors import UsageError
from torchchaos.explore.rows import Entry
from torchchaos.explore.shards import (
    Shard,
    from_environment,
    merge,
    search_seed,
    write_manifest,
    write_search_manifest,
)
from torchchaos.faults.faultfs.mount import unavailable_reason
from torchchaos.report.report_file import Report
from torchchaos.scenario.spec import Spec


@given(total=st.integers(0, 60), count=st.integers(1, 9))
def test_the_shards_split_the_plan_exactly_once(total: int, count: int) -> None:
    parts = [Shard(i, count).numbers(total) for i in range(1, count + 1)]
    flat = sorted(n for part in parts for n in part)
    assert flat == list(range(1, total + 1))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1  # round robin: balanced


@pytest.mark.parametrize("text", ["0/2", "3/2", "x", "1/0", "2", "1/2/3"])
def test_a_bad_shard_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="--shard"):
        Shard.parse(text)


@pytest.mark.parametrize("environ, shard", [
    ({"TORCHCHAOS_SHARD_INDEX": "2", "TORCHCHAOS_SHARD_COUNT": "4"}, "2/4"),  # a CI matrix
    ({"JOB_COMPLETION_INDEX": "0", "TORCHCHAOS_SHARD_COUNT": "4"}, "1/4"),  # Kubernetes
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4",
      "SLURM_ARRAY_TASK_MIN": "0"}, "4/4"),  # Slurm, --array=0-3
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4",
      "SLURM_ARRAY_TASK_MIN": "1"}, "1/4"),  # Slurm, --array=1-4
])
def test_auto_reads_the_shard_the_engine_started(monkeypatch, environ, shard) -> None:
    for name in ("TORCHCHAOS_SHARD_INDEX", "TORCHCHAOS_SHARD_COUNT", "JOB_COMPLETION_INDEX",
                 "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert str(from_environment()) == shard


def test_auto_without_the_variables_is_bad_input_before_any_run(tmp_path) -> None:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("TORCHCHAOS_SHARD", "JOB_COMPLETION", "SLURM_"))}
    done = subprocess.run([sys.executable, "-m", "torchchaos.cli", "battery", "--shard", "auto",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          env={**environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--shard auto: none of TORCHCHAOS_SHARD_INDEX" in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _plan(faults: list[str]) -> list[Entry]:
    return [Entry(f"run {n}", Spec.read(fault)) for n, fault in enumerate(faults, 1)]


def _shard_dirs(tmp: Path, count: int, faults: list[str], command: str = "battery"
                ) -> list[Path]:
    dirs = []
    for index in range(1, count + 1):
        folder = tmp / f"shard-{index}"
        folder.mkdir()
        write_manifest(folder, command, "torchchaos battery", Shard(index, count), _plan(faults))
        dirs.append(folder)
    return dirs


FAULTS = ["kill:rank=0,step=5", "kill:rank=1,step=5", "kill:node=0,step=5"]


@pytest.mark.parametrize("case, message", [
    ("missing", "shard(s) 2/2 missing"),
    ("twice", "shard 1/2 given twice"),
    ("another plan", "is a shard of another plan"),
    ("another count", "is of 2 shards"),
    ("not a shard", "has no shard.json"),
])
def test_a_merge_refuses_what_is_not_one_whole_plan(tmp_path, case, message) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    one, two = _shard_dirs(tmp_path / "a", 2, FAULTS)
    dirs = {"missing": [one], "twice": [one, one, two], "not a shard": [one, tmp_path],
            "another plan": [one, _shard_dirs(tmp_path / "b", 2, FAULTS[:2])[1]]
            if case == "another plan" else [],
            "another count": [one, _shard_dirs(tmp_path / "b", 3, FAULTS)[1]]
            if case == "another count" else []}[case]
    with pytest.raises(UsageError, match=re.escape(message)):
        merge(dirs, tmp_path / "merged")


def test_shards_of_two_recordings_are_not_merged(tmp_path) -> None:
    """Two recordings of one save name its temporary files differently: their states are
    not one plan, and the error says how to give the shards one recording."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    one = _shard_dirs(tmp_path / "a", 2, FAULTS, "crashstates")[0]
    other = _shard_dirs(tmp_path / "b", 2, FAULTS[:2], "crashstates")[1]
    with pytest.raises(UsageError, match="see `crashpoints --record-only`"):
        merge([one, other], tmp_path / "merged")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchchaos.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=900)


def _same(text: str, out: Path) -> str:
    """What may differ between two executions of the same runs: where they are, and how
    long they took."""
    text = text.replace(str(out.resolve()), "OUT")
    return re.sub(r'time="[0-9.]+"', 'time="T"', text)


def _table(stdout: str) -> str:
    return stdout[:stdout.index("runs: ")]


def test_a_merged_campaign_equals_the_unsharded_one(tmp_path, shared_cache) -> None:
    """2 flips on the bundled target, once whole and once as 2 shards merged: the same
    table, campaign.json, index.html and JUnit XML."""
    common = ["--quiet", "--runs", "2", "--cache-dir", str(shared_cache)]
    whole = _cli("campaign", *common, "--out", str(tmp_path / "whole"), "--junitxml",
                 str(tmp_path / "whole.xml"), cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    for index in (1, 2):
        shard = _cli("campaign", *common, "--shard", f"{index}/2", "--out",
                     str(tmp_path / f"shard-{index}"), cwd=tmp_path)
        assert shard.returncode == 0, shard.stdout + shard.stderr
        assert sorted(p.name for p in (tmp_path / f"shard-{index}").glob("0*")) == (
            ["01"] if index == 1 else ["02"])
    # as a CI merge job gets them: downloaded elsewhere (the reports name the old place)
    (tmp_path / "downloaded").mkdir()
    moved = (tmp_path / "shard-2").rename(tmp_path / "downloaded" / "shard-2")
    merged = _cli("merge", str(moved), str(tmp_path / "shard-1"), "--out",
                  str(tmp_path / "merged"), "--junitxml", str(tmp_path / "merged.xml"),
                  cwd=tmp_path)
    assert merged.returncode == whole.returncode, merged.stdout + merged.stderr
    assert _table(merged.stdout) == _table(whole.stdout)
    one, other = tmp_path / "whole", tmp_path / "merged"
    assert json.loads((other / "campaign.json").read_text()) == json.loads(
        (one / "campaign.json").read_text())
    assert _same((other / "index.html").read_text(), other) == _same(
        (one / "index.html").read_text(), one)
    assert _same((tmp_path / "merged.xml").read_text(), other) == _same(
        (tmp_path / "whole.xml").read_text(), one)
    for name in ("01", "02"):  # each names the merged folder, wherever its shard went
        report = json.loads((other / name / "report.json").read_text())
        assert report["run_dir"].startswith(str(other.resolve())), report["run_dir"]
    assert (other / "02" / "report.html").is_file()


@pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())
def test_merged_crash_states_equal_the_unsharded_sweep(tmp_path, shared_cache) -> None:
    """Every kill, torn and power-loss state of save 2 of the bundled target, judged from
    one recording: dozens of states, a handful of recoveries (the resume reads the
    manifest and the step file it names; most states show it the same), all pass. Then
    the same as 2 shards on one cache (one recording) merged: the same table, grouped by
    recovery as one sweep groups it although the shards ran their own, the same
    index.html and JUnit XML. The reference is the battery's (the session's cache)."""
    job = ["--", str(REPO / "targets" / "ddp_lm.py"), "--steps", "20", "--ckpt-every", "5"]
    # one save, as shards take (without --save the whole sweep would first print its
    # choice of saves, which a merge of shards does not)
    common = ["crashpoints", "--quiet", "--save", "2", "--cache-dir", str(shared_cache)]
    whole = _cli(*common, "--out", str(tmp_path / "whole"), "--junitxml",
                 str(tmp_path / "whole.xml"), *job, cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    summary = re.search(r"save 2: (\d+) of (\d+) crash states judged \(\d+ at the chosen"
                        r" cuts, \d+ built; (\d+) distinct folder images\), (\d+) recoveries"
                        r" run, 0 broke", whole.stdout)
    assert summary, whole.stdout
    judged, _total, images, recoveries = map(int, summary.groups())
    reports = [json.loads(p.read_text())
               for p in sorted((tmp_path / "whole").glob("[0-9]*/report.json"))]
    assert judged == len(reports) > 40 and images > 10 and 1 < recoveries < 10
    assert all(r["verdict"] == "pass" for r in reports)
    assert {r["crash_state"].split()[0] for r in reports} == {"kill", "torn", "power"}
    assert len({r["run_dir"] for r in reports}) == recoveries  # each serves many states
    # a recovery keeps what rebuilds its image (extents of the recording), not a copy
    first = sorted((tmp_path / "whole" / "recoveries").iterdir())[0]
    assert not (first / "chaos" / "ckpt").exists()
    rebuilt = subprocess.run([sys.executable, "-m", "torchchaos.explore.crash.states",
                              str(first / "image.json"), str(tmp_path / "rebuilt")])
    assert rebuilt.returncode == 0 and (tmp_path / "rebuilt" / "manifest.json").is_file()
    shards = [_cli(*common, "--shard", f"{i}/2", "--out", str(tmp_path / f"shard-{i}"), *job,
                   cwd=tmp_path) for i in (1, 2)]
    for shard in shards:
        assert shard.returncode == 0, shard.stdout + shard.stderr
    ran = sum(len(list((tmp_path / f"shard-{i}" / "recoveries").iterdir())) for i in (1, 2))
    merged = _cli("merge", str(tmp_path / "shard-2"), str(tmp_path / "shard-1"), "--out",
                  str(tmp_path / "merged"), "--junitxml", str(tmp_path / "merged.xml"),
                  cwd=tmp_path)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    # the summary line under the table: the merge tells what the shards ran, not a speed
    rows = [_table(done.stdout).splitlines()[:-1] for done in (whole, merged)]
    assert rows[0] == rows[1] and len(rows[0]) > 3
    one, other = tmp_path / "whole", tmp_path / "merged"
    assert _same((other / "index.html").read_text(), other) == _same(
        (one / "index.html").read_text(), one)
    assert _same((tmp_path / "merged.xml").read_text(), other) == _same(
        (tmp_path / "whole.xml").read_text(), one)
    assert (f"{recoveries} recoveries run, 0 broke the protocol (merged from 2 shards, which"
            f" ran {ran} recoveries)") in merged.stdout
    states = sorted(other.glob("[0-9][0-9][0-9]/report.json"))
    assert len(states) == len(list(one.glob("[0-9][0-9][0-9]/report.json"))) > 40
    for path in states:  # each names the merged recording and a recovery that came along
        report = json.loads(path.read_text())
        assert report["recording"] == str(other.resolve() / "record")
        assert Path(report["run_dir"]).is_dir() and report["run_dir"].startswith(
            str(other.resolve()))


def _search_shard(tmp: Path, index: int, minimal: list[str] | None, runs: int) -> Path:
    folder = tmp / f"search-{index}"
    folder.mkdir()
    plan = {"seed": 0, "examples": 20, "kind": None, "max_faults": 3}
    found = {"runs": runs, "found": minimal, "minimal": minimal, "flaky": [],
             "budget_spent": False}
    write_search_manifest(folder, Shard(index, 3), plan, found)
    if minimal is not None:
        (folder / "minimal.yaml").write_text(f"# shard {index}\n")
    return folder


def test_merged_searches_answer_with_the_smallest_failing_schedule(tmp_path) -> None:
    dirs = [_search_shard(tmp_path, 1, ["kill:rank=0,step=7", "kill:rank=1,step=12"], 9),
            _search_shard(tmp_path, 2, None, 10),
            _search_shard(tmp_path, 3, ["kill:rank=0,step=12"], 4)]
    done = _cli("merge", *map(str, dirs), "--out", str(tmp_path / "m"), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "shard 2/3: 10 run(s), no failing schedule" in done.stdout
    assert ("minimal failing schedule (1 fault(s)): kill:rank=0,step=12 (shard 3/3)"
            in done.stdout)
    assert (tmp_path / "m" / "minimal.yaml").read_text() == "# shard 3\n"
    assert "23 run(s) in 3 shard(s)" in done.stdout


def test_merged_searches_without_a_failure_exit_0(tmp_path) -> None:
    dirs = [_search_shard(tmp_path, n, None, 5) for n in (1, 2, 3)]
    done = _cli("merge", *map(str, dirs), "--out", str(tmp_path / "m"), cwd=tmp_path)
    assert done.returncode == 0 and "no failing schedule in 15 run(s) of 3 shard(s)" in done.stdout


def test_search_shards_draw_with_seeds_of_their_own() -> None:
    seeds = {search_seed(0, Shard(i, 4)) for i in range(1, 5)}
    assert len(seeds) == 4 and search_seed(0, Shard(1, 4)) == search_seed(0, Shard(1, 4))


@pytest.mark.slow  # the battery twice: 16 chaos runs
def test_a_merged_battery_equals_the_unsharded_one(tmp_path, shared_cache) -> None:
    common = ["--quiet", "--cache-dir", str(shared_cache)]
    whole = _cli("battery", *common, "--out", str(tmp_path / "whole"), cwd=tmp_path)
    for index in (1, 2, 3):
        shard = _cli("battery", *common, "--shard", f"{index}/3", "--out",
                     str(tmp_path / f"shard-{index}"), cwd=tmp_path)
        assert shard.returncode in (0, 1), shard.stdout + shard.stderr
    merged = _cli("merge", *[str(tmp_path / f"shard-{i}") for i in (1, 2, 3)], "--out",
                  str(tmp_path / "merged"), cwd=tmp_path)
    assert merged.returncode == whole.returncode == 0, merged.stdout + whole.stdout
    assert _table(merged.stdout) == _table(whole.stdout)
    one, other = tmp_path / "whole", tmp_path / "merged"
    assert _same((other / "index.html").read_text(), other) == _same(
        (one / "index.html").read_text(), one)


def _shards_with_runs(tmp: Path, count: int, faults: list[str]) -> list[Path]:
    """Shards of a battery whose runs all passed: each run folder with its report.json."""
    dirs = []
    for index in range(1, count + 1):
        folder = tmp / f"shard-{index}"
        folder.mkdir()
        entries = _plan(faults)
        for number in Shard(index, count).numbers(len(entries)):
            entries[number - 1].report = Report(verdict="pass", run_dir=str(folder))
            (folder / f"{number:02d}").mkdir()
            entries[number - 1].report.write(folder / f"{number:02d}")
        write_manifest(folder, "battery", "torchchaos battery", Shard(index, count), entries)
        dirs.append(folder)
    return dirs


def _damage(case: str, dirs: list[Path]) -> None:
    manifest = dirs[1] / "shard.json"
    if case == "a list":
        manifest.write_text("[1, 2]\n")
    elif case == "{}":
        manifest.write_text("{}\n")
    elif case == "runs outside the plan":
        data = json.loads(manifest.read_text())
        data["runs"]["9"] = {"error": None, "report": True}
        manifest.write_text(json.dumps(data))
    elif case == "report truncated":
        report = dirs[1] / "02" / "report.json"
        report.write_text(report.read_text()[:40])
    elif case == "a number that is no number":  # "²".isdigit() is True
        data = json.loads(manifest.read_text())
        data["runs"]["²"] = {"error": None, "report": False}
        manifest.write_text(json.dumps(data))
    elif case == "a run in two shards":
        data = json.loads(manifest.read_text())
        first = json.loads((dirs[0] / "shard.json").read_text())
        number = next(iter(first["runs"]))
        data["runs"][number] = first["runs"][number]
        manifest.write_text(json.dumps(data))
        shutil.copytree(dirs[0] / f"{int(number):02d}", dirs[1] / f"{int(number):02d}")
    elif case == "run folder missing":  # shard 1's 01 comes first: it would be half merged
        (dirs[1] / "02" / "report.json").unlink()
        (dirs[1] / "02").rmdir()


@pytest.mark.parametrize("case, message", [
    ("a list", "shard.json: not a shard manifest (a JSON list, not an object)"),
    ("{}", "shard.json: not a shard manifest (no 'command')"),
    ("runs outside the plan", "run '9' is not in its plan of 3 run(s)"),
    ("report truncated", "02/report.json cannot be read"),
    ("run folder missing", "run folder 02 is missing"),
    ("a number that is no number", "run '²' is not in its plan of 3 run(s)"),
    ("a run in two shards", "was run by shard"),
])
def test_a_damaged_shard_is_refused_with_nothing_merged(tmp_path, case, message) -> None:
    """One line naming the shard and what is wrong, exit 2, and no merged folder at all
    (not one holding the runs of the shards before the damaged one)."""
    dirs = _shards_with_runs(tmp_path, 2, FAULTS)
    _damage(case, dirs)
    done = _cli("merge", *map(str, dirs), "--out", str(tmp_path / "merged"), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchchaos: error: "), done.stderr
    assert message in lines[0] and str(dirs[1]) in lines[0], lines[0]
    assert not (tmp_path / "merged").exists()


def test_whole_shards_with_runs_merge(tmp_path) -> None:
    """The shards the test above damages merge when whole."""
    dirs = _shards_with_runs(tmp_path, 2, FAULTS)
    done = _cli("merge", *map(str, dirs), "--out", str(tmp_path / "merged"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "merged").glob("0*")) == ["01", "02", "03"]


def test_a_campaign_interrupted_before_any_run_writes_its_empty_tally(tmp_path) -> None:
    """Ctrl-C during the first run: the table and campaign.json still come out (zeros)."""
    from torchchaos.explore import campaign

    entries = _plan(FAULTS)
    assert "runs:" in campaign.table(entries, [])
    written = json.loads(campaign.write(entries, tmp_path, []).read_text())
    assert written["runs"] == [] and set(written["all"].values()) == {0}


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_merge_that_runs_out_of_space_leaves_nothing_half_merged(tmp_path) -> None:
    """The shards pass every check, then the disk fills while their runs are copied
    (another filesystem: copies, not links): one line, exit 2, no merged folder and no
    staging folder left."""
    dirs = _shards_with_runs(tmp_path, 2, FAULTS)
    (dirs[1] / "02" / "weights.bin").write_bytes(b"\0" * (3 << 20))
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        done = _cli("merge", *map(str, dirs), "--out", str(disk / "merged"), cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "nothing was merged" in lines[0], done.stderr
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)
