"""The command line: the contract's exit codes, one-line errors, no leftovers."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TARGET, chaos_processes

HANGS = REPO / "tests" / "scripts" / "hangs.py"

CLI = [sys.executable, "-m", "torchchaos.cli"]


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=_env())


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("args,reason", [
    (["run", "--fault", "explode:rank=0,step=3", "--", str(TARGET)], "unknown fault kind"),
    (["run", "--fault", "kill:rank=0", "--", str(TARGET)], "needs exactly one trigger"),
    (["run", "--fault", "kill:rank=0,step=x", "--", str(TARGET)], "step= needs an integer"),
    (["run", "--fault", "kill:rank=5,step=3", "--", str(TARGET)], "rank 5 does not exist"),
    (["run", "--", "no/such/train.py"], "training script not found"),
    (["run", "--check", "vibes", "--", str(TARGET)], "unknown check 'vibes'"),
    (["run", "--nproc", "two", "--", str(TARGET)], "expected an integer"),
    (["run", "--nodes", "0", "--", str(TARGET)], "--nproc and --nodes must be >= 1"),
    (["run"], "the following arguments are required: SCRIPT"),
    (["report", "nowhere"], "no report.json in nowhere"),
    (["doctor", "--", "no/such/train.py"], "training script not found"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, reason):
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchchaos: error: "), result.stderr
    assert reason in lines[0]
    assert list(tmp_path.iterdir()) == [], "bad input must not write anything"


TOO_MANY = str(4 * len(os.sched_getaffinity(0)) + 1)  # ranks: more than 4 per core
NODE = ["node", "--node-rank", "0", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"]


@pytest.mark.parametrize("args,reason", [
    (["run", "--fault", "bitflip:rank=0,step=3,bit=64"], "bit 64 does not exist in any float"),
    (["run", "--fault", "bitflip:rank=0,step=3,tensor=checkpoint,bit=8"], "bit= is 0-7, got 8"),
    (["run", "--nproc", "2", "--fault", "kill:rank=5,step=3"], "rank 5 does not exist"),
    (["run", "--nodes", "2", "--network", "host", "--fault", "kill:node=3,step=3"],
     "node 3 does not exist (the job has 2 nodes)"),
    ([*NODE, "--fault", "kill:node=3,step=3"], "node 3 does not exist (the job has 2 nodes)"),
    ([*NODE, "--nproc", "2", "--fault", "kill:rank=4,step=3"], "rank 4 does not exist"),
    (["run", "--nproc", TOO_MANY], "pass --force to run anyway"),
    (["battery", "--nproc", TOO_MANY], "pass --force to run anyway"),
    (["doctor", "--nproc", TOO_MANY], "pass --force to run anyway"),
    (["crashpoints", "--nodes", "2", "--nproc", TOO_MANY], "pass --force to run anyway"),
    (["run", "--fault", "storage:mode=lose_unsynced,rank=0,step=3,dir=.",
      "--fault", "storage:mode=eio,rank=0,step=4,dir=ckpt"], "cannot be combined"),
    (["run", "--fault", "storage:mode=eio,rank=0,step=4,dir=../elsewhere"],
     "inside the run directory"),
    (["run", "--max-lost-seconds", "-1"], "--max-lost-seconds must be >= 0"),
    (["crashpoints", "--save", "0"], "expected a value >= 1, got 0"),
    (["crashpoints", "--mode", "stop"], "--mode stop needs --per-point"),
    (["campaign", "--runs", "0"], "expected a value >= 1, got 0"),
], ids=lambda value: None if isinstance(value, list) else value[:24])
def test_what_can_be_checked_before_a_run_is_refused_before_it(tmp_path, args, reason):
    """One line, exit 2, no traceback, and nothing started: no run dir, no reference run
    (its cache would appear), no process."""
    where = ["--shared", str(tmp_path / "shared")] if args[0] == "node" else [
        "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
    started = time.monotonic()
    result = cli(*args[:1], *where, *args[1:], "--", str(TARGET), cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchchaos: error: "), result.stderr
    assert reason in lines[0] and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [], "refused input must not write anything"
    assert chaos_processes(tmp_path) == []
    assert time.monotonic() - started < 30  # no job was started and waited for


@pytest.mark.parametrize("args,said", [
    (["run", "--fualt", "kill:rank=1,step=3"], "unrecognized arguments: --fualt (did you mean"
                                               " '--fault'?)"),
    (["batery"], "invalid choice: 'batery'"),
    (["batery"], "(did you mean 'battery'?)"),
])
def test_a_typo_in_an_option_or_a_command_is_answered_with_the_close_one(tmp_path, args, said):
    result = cli(*args, "--", str(TARGET), cwd=tmp_path)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_output_path_that_is_a_file_is_said_to_be_one(tmp_path):
    (tmp_path / "out").write_text("")
    result = cli("run", "--out", str(tmp_path / "out"), "--", str(TARGET), cwd=tmp_path)
    assert result.returncode == 2 and "is a file, not a folder" in result.stderr


def test_an_existing_output_directory_is_never_touched(tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "data.txt").write_text("keep me")
    result = cli("run", "--out", str(out), "--", str(TARGET), cwd=tmp_path)
    assert result.returncode == 2 and "already exists and is not empty" in result.stderr
    assert [p.name for p in out.iterdir()] == ["data.txt"]


def test_help_explains_fault_specs_and_exit_codes(tmp_path):
    from torchchaos.faults.registry import all_kinds
    from torchchaos.judge.checks_by_name import BUILTIN
    from torchchaos.scenario.spec import parse_fault_spec

    result = cli("run", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for words in ("kill:rank=1,step=30", "signal=SIGTERM", "phase=checkpoint_save",
                  "exit status", "{run_dir}", "--max-lost-steps"):
        assert words in result.stdout
    # every fault kind the registry has, with its summary's first words, from the registry
    kinds = result.stdout[result.stdout.index("fault kinds"):]
    for name, kind in all_kinds().items():
        assert re.search(rf"^  {name} +{re.escape(kind.summary[:30])}", kinds, re.M), name
    # every example spec parses, so the examples cannot drift either
    examples = re.findall(r"^  ([a-z]+:\S+=\S+)", result.stdout, re.M)
    assert {spec.partition(":")[0] for spec in examples} == set(all_kinds())
    for spec in examples:
        parse_fault_spec(spec)
    assert all(name in result.stdout for name in BUILTIN)  # --check's names
    assert "kill" in cli("faults", cwd=tmp_path).stdout
    version = cli("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("torchchaos 0."), version
    assert "torch 2." in version.stdout


@pytest.mark.parametrize("command, groups", [
    ("run", ["job", "faults", "checks", "output"]),
    ("battery", ["job", "sweeps", "checks", "output"]),
    ("crashpoints", ["job", "faults", "sweeps", "checks", "output"]),
    ("campaign", ["job", "faults", "sweeps", "checks", "output"]),
    ("search", ["job", "faults", "sweeps", "checks", "output"]),
    ("doctor", ["job", "checks", "output"]),
    ("shrink", ["job", "sweeps", "output"]),
    ("replay", ["job", "output"]),
    ("node", ["job", "faults", "output"]),
    ("export", ["cluster", "timing", "output"]),
])
def test_every_help_shows_its_options_in_groups(command, groups):
    """Grouped by what a user looks for, in this order, each option in one (only -h is
    left under `options`; export's FILE under the positional arguments); SCRIPT and
    ARGS lead the job group, torchrun's names of the job's shape after them."""
    from torchchaos.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    shown = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups
             if g._group_actions}
    assert list(shown) == [*(["positional arguments"] if command == "export" else []),
                           "options", *groups]
    assert shown["options"] == ["help"]
    text = parser.format_help()
    assert [line[:-1] for line in text.splitlines() if line[:-1] in groups] == groups
    if "nproc" in shown.get("job", []):
        assert shown["job"][:2] == ["script", "args"]
        assert "--nproc N, --nproc-per-node N" in text


def test_a_target_that_crashes_without_faults_cannot_be_judged(tmp_path):
    result = cli("run", "--quiet", "--out", str(tmp_path / "out"), "--cache-dir",
                 str(tmp_path / "cache"), "--fault", "kill:rank=1,step=5",
                 "--max-restarts", "1", "--max-relaunches", "0", "--",
                 str(TARGET), "--steps", "10", "--bug", "crash", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "the target fails without faults" in lines[0]
    assert "planted crash" in lines[0]


# A user's script that fails on its own, before any step: argparse refuses an option, a
# check raises SystemExit with a message. No torchrun banner in the answer, their words.
OWN_FAILURES = {
    "argparse": ("import argparse\np = argparse.ArgumentParser()\np.parse_args()\n",
                 ["--ckpt_dir", "x"], "error: unrecognized arguments: --ckpt_dir x"),
    "system_exit": ("raise SystemExit('no training data in /data/shards: mount it first')\n",
                    [], "no training data in /data/shards: mount it first"),
}


@pytest.mark.parametrize("command", ["run", "doctor"])
@pytest.mark.parametrize("case", sorted(OWN_FAILURES))
def test_a_script_that_fails_on_its_own_says_its_own_words_and_where_its_output_is(
        tmp_path, command, case):
    source, args, said = OWN_FAILURES[case]
    script = tmp_path / "train.py"
    script.write_text("import torch\n" + source)
    result = cli(command, "--quiet", "--out", str(tmp_path / "out"), "--cache-dir",
                 str(tmp_path / "cache"), "--", str(script), *args, cwd=tmp_path)
    shown = result.stdout + result.stderr
    reason = next(line for line in shown.splitlines() if "fails without faults" in line)
    assert said in reason, shown  # before: torchrun's banner, a row of "="
    log = re.search(r"its whole output: (\S+\.log)", reason)
    assert log and said in Path(log.group(1)).read_text(), shown
    # stopped after two attempts died alike, not after every restart and relaunch
    assert log.group(1).endswith("launch-0-node-0.log"), shown


def test_a_hung_target_meets_the_deadline_and_is_reaped(tmp_path):
    start = time.monotonic()
    result = cli("run", "--quiet", "--timeout", "8", "--out", str(tmp_path / "out"),
                 "--cache-dir", str(tmp_path / "cache"), "--", str(HANGS), cwd=tmp_path)
    assert result.returncode == 2 and "did not finish without faults within 8 s" in result.stderr
    assert time.monotonic() - start < 60
    assert chaos_processes(tmp_path) == []


# `run` writing report.json, and `report` reprinting it: tests/report/test_report_html.py's real run


@pytest.mark.parametrize("fault,said", [
    # refused before the run with faults: the reference knows the job's last step, its saves
    ("kill:rank=1,step=500", "would never fire: step=500 is past rank 1's last step, 20"),
    ("kill:rank=0,phase=checkpoint_save,save=9", "rank 0 makes 4 checkpoint save(s)"),
    # what the reference cannot tell is run, and judged: not a pass
    ("kill:rank=1,time=900", "never fired"),
])
def test_a_fault_that_never_fires_is_not_a_pass(tmp_path, shared_cache, fault, said):
    """On the battery's job: its reference is the session's."""
    result = cli("run", "--quiet", "--out", str(tmp_path / "out"), "--cache-dir",
                 str(shared_cache), "--fault", fault, "--",
                 str(TARGET), "--steps", "20", "--ckpt-every", "5", cwd=tmp_path)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    if said != "never fired":
        assert "would never fire" in result.stderr
        assert not (tmp_path / "out").exists()  # refused: --out left as it was


def test_interrupt_reaps_every_process_and_leaves_a_report(tmp_path, shared_cache):
    """Ctrl-C (or a CI job's time limit) in the chaos run: every process is reaped and
    report.json says how far it got, verdict error. The job trains for 10 s, and its
    reference is test_e2e_kill.py's (test_kill_at_a_time): made once for both."""
    proc = subprocess.Popen([*CLI, "run", "--out", str(tmp_path / "out"), "--cache-dir",
                             str(shared_cache), "--", str(TARGET), "--steps", "25",
                             "--step-sleep", "0.4"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    history = tmp_path / "out" / "chaos" / "_chaos" / "history" / "rank-1.jsonl"
    while time.monotonic() < deadline and not history.exists():
        time.sleep(0.2)
    time.sleep(2)  # the workers are training now
    assert chaos_processes(tmp_path), "the job should be running"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    assert chaos_processes(tmp_path) == []
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "error" and report["reason"].startswith("interrupted"), report
    assert "nothing was judged" in report["reason"]


def test_an_interrupted_battery_prints_and_indexes_what_finished(tmp_path, shared_cache):
    out = tmp_path / "out"
    proc = subprocess.Popen([*CLI, "battery", "--quiet", "--out", str(out), "--cache-dir",
                             str(shared_cache)], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (out / "index.html").exists():
        time.sleep(0.2)  # written once the first row is judged
    proc.send_signal(signal.SIGTERM)  # as a CI job's time limit does
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert "kill rank 0 at step" in stdout and "interrupted after" in stdout, stdout
    assert "kill rank 0 at step" in (out / "index.html").read_text()
    assert chaos_processes(tmp_path) == []


def test_the_battery_passes_the_reference_target_and_prints_one_table(tmp_path, shared_cache):
    result = cli("battery", "--quiet", "--out", str(tmp_path / "out"), "--cache-dir",
                 str(shared_cache), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines()
            if line.startswith(("kill", "preempt", "power loss", "tear", "stop"))]
    assert len(rows) == 9 and all(row.endswith("PASS") for row in rows), result.stdout
    # each row's fault fired and was recovered from, every recovery check decided and
    # true; the power loss's durability judged. tests/e2e/test_e2e_storage.py leaves this
    # very power loss to the battery, tests/scenario/test_incidents.py the incidents whose
    # faults are rows here (torn_checkpoint: the kill mid-write; replayed_data: the
    # preemption), with the checks their files expect
    reports = {r["faults"][0]["spec"]: r for r in (json.loads(p.read_text()) for p in sorted(
        (tmp_path / "out").glob("[0-9][0-9]/report.json")))}
    assert len(reports) == 9, sorted(reports)
    for spec, report in reports.items():
        assert report["faults"][0]["fired"] and report["restarts"] >= 1, spec
        undecided = {name: report["checks"][name] for name in (
            "completes", "atomic_recovery", "deterministic_resume", "bounded_lost_work",
            "no_orphans") if report["checks"][name]["ok"] is not True}
        assert not undecided, (spec, report["run_dir"], undecided)
    assert {"kill:rank=0,phase=checkpoint_save,save=2,event=2",
            "kill:rank=0,step=12,signal=SIGTERM,grace=30"} < set(reports)
    stopped = reports["hang:rank=0,phase=checkpoint_save,save=2,event=2,mode=stop"]
    assert stopped["checks"]["hang_detected"]["ok"] is True, stopped["checks"]
    power = reports["storage:mode=lose_unsynced,rank=0,phase=checkpoint_save,save=2,event=4"]
    assert power["checks"]["durable_checkpoints"]["ok"] is True, power["checks"]
    assert "power loss on rank 0 after a rename in its 2nd save" in result.stdout
    # the manifest's temporary file, written last: tearing it harms nothing published
    assert "tear rank 0's last write in its 2nd save" in result.stdout
    assert "mid-write in its 2nd save" in result.stdout
    assert "right after a rename in its 2nd save" in result.stdout


@pytest.mark.parametrize("debug", ["", "1"], ids=["plain", "TORCHCHAOS_DEBUG=1"])
def test_a_harness_bug_is_exit_2_with_or_without_the_traceback(monkeypatch, capsys, debug):
    from torchchaos.cli import main as cli_main

    def broken(ns):
        raise RuntimeError("a harness bug")

    monkeypatch.setattr(cli_main, "cmd_faults", broken)
    monkeypatch.setenv("TORCHCHAOS_DEBUG", debug)
    assert cli_main.main(["faults"]) == 2
    err = capsys.readouterr().err
    assert ("Traceback (most recent call last)" in err) == bool(debug)
    assert err.strip().splitlines()[-1].startswith(
        "torchchaos: internal error: RuntimeError: a harness bug (")


def test_torchruns_own_option_names_are_accepted(tmp_path):
    """A user's torchrun line carries over: --nproc-per-node and --nnodes are --nproc and
    --nodes (here 1000 ranks: refused by the count, before anything starts)."""
    result = cli("run", "--nproc-per-node", "5", "--nnodes", "200", "--out",
                 str(tmp_path / "out"), str(TARGET), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "--nproc 5 x --nodes 200 = 1000 ranks" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()
