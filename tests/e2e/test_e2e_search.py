"""Search, shrink and replay on real runs: a planted bug that only a pair of failures
shows (ddp_lm --bug resume_twice: two kills with a checkpoint committed between them)
is found by Hypothesis, shrunk to that pair, saved, and the replay file reproduces it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TARGET

from torchchaos.scenario import files as scenario_file
from torchchaos.scenario.spec import parse_fault_spec

PAIR_BUG = [str(TARGET), "--steps", "20", "--ckpt-every", "5", "--bug", "resume_twice"]


def torchchaos(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchchaos.cli", *args], capture_output=True,
                          text=True, timeout=600)


def interval_of(spec: str) -> int:
    return (parse_fault_spec(spec).trigger.step - 1) // 5


def test_search_finds_the_pair_shrinks_to_it_and_the_replay_reproduces(tmp_path, shared_cache):
    out = tmp_path / "search"
    # --repeats 1 and no Hypothesis shrinking keep this to a handful of runs in CI; the
    # repeats and the shrinker are tested on their own in tests/explore/test_search.py
    found = torchchaos("search", "--kind", "kill", "--max-faults", "3", "--repeats", "1",
                       "--shrink-runs", "0", "--max-runs", "12", "--out", str(out),
                       "--cache-dir", str(shared_cache), "--quiet", *PAIR_BUG)
    assert found.returncode == 1, found.stdout + found.stderr
    minimal = scenario_file.load(out / "minimal.yaml")
    specs = [f.text for f in minimal.scenario.faults]
    assert len(specs) == 2 and all(s.startswith("kill:") for s in specs), found.stdout
    assert interval_of(specs[0]) != interval_of(specs[1]), specs  # a save between them
    assert minimal.expect.verdict == "fail"
    assert minimal.expect.checks == {"deterministic_resume": False}
    assert "minimal failing schedule (2 fault(s))" in found.stdout

    replayed = torchchaos("replay", str(out / "minimal.yaml"), "--out", str(tmp_path / "r"),
                          "--cache-dir", str(shared_cache), "--quiet")
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert "expected fail and got it" in replayed.stdout
    assert "diverged from the reference" in replayed.stdout


@pytest.mark.slow  # the same shrinking, by delta debugging alone, from a 3-fault file
def test_shrink_drops_the_fault_the_failure_does_not_need(tmp_path, shared_cache):
    doc = {"job": {"script": str(TARGET), "args": PAIR_BUG[1:]},
           "faults": ["kill:rank=1,step=7", "kill:rank=0,step=8", "kill:rank=0,step=12"]}
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(doc))
    shrunk = torchchaos("shrink", str(path), "--repeats", "1", "--out", str(tmp_path / "s"),
                        "--cache-dir", str(shared_cache), "--quiet")
    assert shrunk.returncode == 1, shrunk.stdout + shrunk.stderr
    specs = [f.text for f in scenario_file.load(tmp_path / "s" / "minimal.yaml").scenario.faults]
    assert len(specs) == 2 and "kill:rank=0,step=12" in specs


def test_replay_of_a_file_that_does_not_load_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: {script: nowhere.py}\nfaults: [kill:rank=1]\n")
    result = torchchaos("replay", str(bad), "--out", str(tmp_path / "r"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "bad.yaml" in result.stderr, result.stderr
    assert not (tmp_path / "r").exists()


def test_shrink_refuses_a_file_without_faults(tmp_path):
    path = tmp_path / "none.yaml"
    path.write_text(f"job: {{script: {TARGET}}}\n")
    result = torchchaos("shrink", str(path), "--out", str(tmp_path / "s"))
    assert result.returncode == 2 and "no faults to shrink" in result.stderr
    assert not Path(tmp_path / "s").exists()


@pytest.mark.slow  # two searches of up to 12 runs each
def test_two_search_shards_merge_into_the_pair(tmp_path, shared_cache):
    outs = [tmp_path / f"shard-{i}" for i in (1, 2)]
    for index, out in enumerate(outs, 1):
        shard = torchchaos("search", "--kind", "kill", "--max-faults", "3", "--repeats", "1",
                           "--shrink-runs", "0", "--max-runs", "12", "--shard", f"{index}/2",
                           "--out", str(out), "--cache-dir", str(shared_cache), "--quiet",
                           *PAIR_BUG)
        assert shard.returncode in (0, 1), shard.stdout + shard.stderr
    merged = torchchaos("merge", *map(str, outs), "--out", str(tmp_path / "m"))
    assert merged.returncode == 1, merged.stdout + merged.stderr
    assert "minimal failing schedule (2 fault(s))" in merged.stdout
    specs = [f.text for f in scenario_file.load(tmp_path / "m" / "minimal.yaml").scenario.faults]
    assert len(specs) == 2 and interval_of(specs[0]) != interval_of(specs[1])
