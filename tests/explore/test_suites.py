"""The ready-made suites (`pytest --pyargs torchchaos.suites`) against a configured script.

Each case name lands where the job's fault-free run says; `[tool.torchchaos]`
and the `--chaos-*` options pick the job, with a one-line usage error for a
typo; a case passes on the bundled target and fails, with the verdict table,
once a recovery bug is planted; every run leaves its verdict in JUnit XML and
in the session's table.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import TARGET

from torchchaos.explore.rows import Entry
from torchchaos.explore.suite import CASES, NotApplicable, Plan
from torchchaos.faults.faultfs.mount import unavailable_reason
from torchchaos.host import netns
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Spec

pytest_plugins = ["pytester"]

STEPS = ["--steps", "20", "--ckpt-every", "5"]
SUITES = ("kills", "storage", "bitflips", "hangs", "partitions")

# Where each case lands on the bundled target (20 steps, a checkpoint every 5, 2 ranks;
# rank 0 saves: 1 open tmp, 2 write, 3 fsync, 4 rename, 5 fsync ckpt/, then the manifest).
SAVE2 = "rank=0,phase=checkpoint_save,save=2"
EXPECTED = {
    "kill rank 0 mid-interval": "kill:rank=0,step=12",
    "kill last rank mid-interval": "kill:rank=1,step=12",
    "kill node 0 mid-interval": "kill:node=0,step=12",
    "kill mid-write in 2nd save": f"kill:{SAVE2},event=2",
    "kill after rename in 2nd save": f"kill:{SAVE2},event=4",
    "preempt rank 0 with SIGTERM": "kill:rank=0,step=12,signal=SIGTERM,grace=30",
    "power loss after rename in 2nd save": f"storage:mode=lose_unsynced,{SAVE2},event=4",
    "power loss mid-write in 2nd save": f"storage:mode=lose_unsynced,{SAVE2},event=2",
    "torn write in 2nd save": f"storage:mode=torn,{SAVE2},event=1",
    "ENOSPC in 2nd save": f"storage:mode=enospc,{SAVE2},event=1",
    "bit rot in the newest checkpoint": "storage:mode=bitrot,bits=64,rank=0,step=12",
    "flip a weight's exponent bit": r"bitflip:rank=[01],step=\d+,tensor=param,bit=exp_high",
    "flip an optimizer state sign bit": r"bitflip:rank=[01],step=\d+,tensor=optim,bit=sign",
    "NaN in the loss": "bitflip:rank=1,step=12,tensor=loss,value=nan",
    "stop a rank with SIGSTOP": "hang:rank=1,step=12",
    "hold a rank before a collective": "hang:rank=1,step=12,mode=collective",
    "collective order mismatch": "hang:rank=1,step=12,mode=mismatch",
    "straggler": r"straggler:rank=1,step=12,delay=\d+\.\d{3},steps=5",
}
ONE_NODE = {"isolate the last node", "cut off the rendezvous store"}


def listed_cases(suite: str) -> list[str]:
    """The case names a suites module parametrizes its test with."""
    module = importlib.import_module(f"torchchaos.suites.test_{suite}")
    test = next(v for k, v in vars(module).items() if k.startswith("test_"))
    return list(next(m for m in test.pytestmark if m.name == "parametrize").args[1])


def test_every_listed_case_is_known_and_every_known_case_listed():
    listed = [name for suite in SUITES for name in listed_cases(suite)]
    assert sorted(listed) == sorted(CASES)
    assert set(EXPECTED) | ONE_NODE == set(CASES)


def test_each_case_lands_where_the_fault_free_run_says(shared_cache):
    """One reference run (the one the kill tests use), no chaos run."""
    plan = Plan(Scenario.build(str(TARGET), args=STEPS), shared_cache)
    for name, spec in EXPECTED.items():
        if "storage:" in spec and unavailable_reason():
            with pytest.raises(NotApplicable, match="fault filesystem"):
                plan.scenario(name)
            continue
        faults = plan.scenario(name).faults
        assert len(faults) == 1 and re.fullmatch(spec, faults[0].text), (name, faults)
    for name in ONE_NODE:
        with pytest.raises(NotApplicable, match=r"2\+ simulated nodes \(the job has 1\)"):
            plan.scenario(name)


def _saved_in(*paths: str) -> Plan:
    """A plan over a made-up reference whose 2nd save writes these paths."""
    plan = Plan(Scenario(script=str(TARGET)), Path("unused"))
    events = [{"ev": "save_begin", "t": 0.0, "rank": 0, "after_step": 10}]
    events += [{"ev": "file", "t": 1.0 + i, "rank": 0, "save": 2, "index": i + 1, "op": "write",
                "path": path} for i, path in enumerate(paths)]
    plan.cached("history", lambda: History(events=events))
    plan.cached("battery", lambda: [Entry("kill rank 0 at step 12",
                                          Spec.read("kill:rank=0,step=12"))])
    return plan


@pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "ok")
def test_storage_faults_go_where_the_job_writes_its_checkpoints():
    """The fault filesystem is mounted over one folder: a power loss elsewhere would drop
    nothing and pass for nothing."""
    plan = _saved_in("out/ckpt/.tmp-1", "out/ckpt/step-10.pt")
    spec = plan.scenario("bit rot in the newest checkpoint").faults[0].text
    assert spec == "storage:mode=bitrot,bits=64,rank=0,step=12,dir=out"
    with pytest.raises(NotApplicable, match=r"outside one folder of the run directory"):
        _saved_in("/data/ckpt/step-10.pt").scenario("bit rot in the newest checkpoint")


def _pyproject(pytester: pytest.Pytester, body: str) -> None:
    pytester.path.joinpath("pyproject.toml").write_text(f"[tool.torchchaos]\n{body}\n")


@pytest.mark.parametrize("body, option, message", [
    ("nprocs = 2", None, "pyproject.toml: unknown key 'nprocs' (known: script, args, nproc, "),
    ('nproc = "2"', None, "pyproject.toml: nproc must be an integer, got '2'"),
    ("nproc = 0", None, "the suites' job: --nproc and --nodes must be >= 1"),
    ('script = "missing.py"', None, "the suites' job: training script not found: "),
    ("", '--chaos-args=--steps "20', "--chaos-args: cannot split '--steps \"20'"),
], ids=["unknown key", "wrong type", "no rank", "no such script", "unbalanced quote"])
def test_a_bad_configuration_is_a_one_line_usage_error(pytester, body, option, message):
    _pyproject(pytester, body)
    result = pytester.runpytest_subprocess("--pyargs", "torchchaos.suites", "--co",
                                           *([option] if option else []))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR: ")]
    assert len(errors) == 1 and "ERROR: torchchaos: " in errors[0], result.stderr.str()
    assert message in errors[0]
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_the_suites_are_collected_from_the_package_whatever_python_files_says(pytester):
    pytester.path.joinpath("pyproject.toml").write_text(
        '[tool.pytest.ini_options]\npython_files = ["check_*.py"]\n')
    result = pytester.runpytest_subprocess("--pyargs", "torchchaos.suites", "--co", "-q",
                                           "-m", "chaos_kills")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_kills.py::test_kill?kill rank 0 mid-interval?",
                                 "*6/* tests collected*"])


def _properties(xml: Path) -> dict[str, dict[str, str]]:
    cases = ET.parse(xml).getroot().iter("testcase")
    return {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
            for case in cases}


def test_a_case_fails_once_a_recovery_bug_is_planted(pytester, shared_cache):
    """One chaos run; the reference is that of the kill and plugin tests. The same case
    passes on the bundled target in the pytest-xdist test below, with its JUnit XML."""
    _pyproject(pytester, f'script = "{TARGET}"\nargs = {json.dumps(STEPS)}')
    common = ["--pyargs", "torchchaos.suites", "-k", "test_kill and last", "-p", "no:cacheprovider",
              f"--chaos-cache-dir={shared_cache}", f"--chaos-dir={pytester.path / 'runs'}"]
    # an earlier session's run of the case, kept in --chaos-dir: this one takes the next name
    earlier = pytester.path / "runs" / "test_kills.py_test_kill_kill_last_rank_mid-interval_-0"
    (earlier / "chaos").mkdir(parents=True)
    bad = pytester.runpytest_subprocess(*common, f"--junitxml={pytester.path / 'bad.xml'}",
                                        f"--chaos-args={' '.join(STEPS)} --bug skip_optim")
    bad.assert_outcomes(failed=1)
    assert bad.ret == 1
    bad.stdout.fnmatch_lines([
        "*expected verdict 'pass', got 'fail'*",
        "*deterministic_resume  FAIL     diverged from the reference at step 11*optimizer*",
        "*torchchaos verdicts*",
        "verdict  lost  test  ?failing checks?",
        "FAIL     2     *test_kills.py::test_kill?kill last rank mid-interval?"
        "  ?deterministic_resume?",
        "               *test_kill_kill_last_rank_mid-interval_-1",
    ])
    case = "test_kill[kill last rank mid-interval]"
    props = _properties(pytester.path / "bad.xml")[case]
    assert props["chaos_verdict"] == "fail"
    assert props["chaos_check_deterministic_resume"] == "FAIL"
    assert props["chaos_check_completes"] == "PASS"
    report = json.loads(Path(props["chaos_report"]).read_text())
    assert report["verdict"] == "fail" and report["run_dir"] == props["chaos_run_dir"]
    command, replay = props["chaos_replay"].split(" replay ")
    assert command == "torchchaos" and Path(replay).is_file()
    assert "kill:rank=1,step=12" in Path(replay).read_text()
    assert Path(props["chaos_run_dir"]).parent.name.endswith("_-1")
    assert list(earlier.iterdir()) == [earlier / "chaos"]  # left as it was


INCIDENT = f"""\
torchchaos: 1
name: a forgotten optimizer restore
job:
  script: {TARGET}
  args: [{", ".join(STEPS)}, --bug, skip_optim]
faults:
  - kill:rank=1,step=12
expect: {{verdict: fail, checks: {{deterministic_resume: false}}}}
"""


def test_scenario_files_are_tests_and_chaos_replay_runs_only_those(pytester, shared_cache):
    """One chaos run (the reference is the plugin test's)."""
    pytester.makepyfile(test_other="def test_not_replayed():\n    assert False\n")
    pytester.path.joinpath("optimizer.chaos.yaml").write_text(INCIDENT)
    pytester.path.joinpath("broken.chaos.yml").write_text("torchchaos: 1\njob: {nproc: 2}\n")
    listed = pytester.runpytest_subprocess("--co", "-q")
    listed.stdout.fnmatch_lines_random(["broken.chaos.yml::broken",
                                        "optimizer.chaos.yaml::optimizer",
                                        "test_other.py::test_not_replayed"])
    broken = pytester.runpytest_subprocess("broken.chaos.yml")
    broken.assert_outcomes(failed=1)
    broken.stdout.fnmatch_lines(["*torchchaos could not judge: *broken.chaos.yml: job needs"
                                 " script:*"])
    assert "Traceback" not in broken.stdout.str()
    assert "During handling" not in broken.stdout.str()
    xml = pytester.path / "replay.xml"
    replayed = pytester.runpytest_subprocess(
        "--chaos-replay=optimizer.chaos.yaml", f"--chaos-cache-dir={shared_cache}",
        f"--junitxml={xml}", "-p", "no:cacheprovider")
    replayed.assert_outcomes(passed=1)
    props = _properties(xml)["optimizer"]
    assert props["chaos_verdict"] == "fail"  # what the file expects
    assert props["chaos_check_deterministic_resume"] == "FAIL"


def test_torchchaos_suite_is_pytest_on_the_suites(tmp_path):
    result = subprocess.run([sys.executable, "-m", "torchchaos.cli", "suite", "--co", "-q",
                             "-m", "chaos_storage", "-p", "no:cacheprovider"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_storage.py::test_storage[torn write in 2nd save]" in result.stdout
    assert "5/" in result.stdout and "test_kill" not in result.stdout


@pytest.mark.slow  # 20 chaos runs: every suite on the bundled target, partitions on 2 nodes
@pytest.mark.parametrize("marker, options", [
    ("chaos_kills", []), ("chaos_storage", []), ("chaos_sdc", []), ("chaos_hangs", []),
    ("chaos_partitions", ["--chaos-nodes=2", "--chaos-nproc=1"]),
])
def test_every_suite_passes_on_the_bundled_target(pytester, shared_cache, marker, options):
    suite = {"chaos_kills": "kills", "chaos_storage": "storage", "chaos_sdc": "bitflips",
             "chaos_hangs": "hangs", "chaos_partitions": "partitions"}[marker]
    result = pytester.runpytest_subprocess("--pyargs", "torchchaos.suites", "-m", marker, *options,
                                           "-p", "no:cacheprovider", "-rs",
                                           f"--chaos-cache-dir={shared_cache}")
    needs = {"chaos_storage": unavailable_reason(),
             "chaos_partitions": netns.unavailable_reason()}
    if needs.get(marker):
        result.assert_outcomes(skipped=len(listed_cases(suite)))
    else:
        result.assert_outcomes(passed=len(listed_cases(suite)))


def test_the_kills_suite_under_pytest_xdist_makes_one_reference_and_one_table(pytester,
                                                                             monkeypatch):
    """`pytest -n 2 --pyargs torchchaos.suites -m chaos_kills -k ...`: the workers share
    the plugin's reference cache (the command line's, $XDG_CACHE_HOME/torchchaos: here a
    new one; one reference made, under its lock), the controller shows the table of every
    worker's runs, and JUnit XML carries each run's properties. Two cases, so that each
    worker runs one (xdist deals fewer tests than 2 per worker round robin) and both ask
    for the reference at once. That a case passes on the bundled target is shown here
    (the planted bug's test below runs the last rank's case too); every kill of the suite
    passing on it is the battery's test (tests/cli/test_cli.py: the same faults, same job)."""
    _pyproject(pytester, f'script = "{TARGET}"\nargs = {json.dumps(STEPS)}')
    monkeypatch.setenv("XDG_CACHE_HOME", str(pytester.path / "xdg"))
    xml = pytester.path / "kills.xml"
    result = pytester.runpytest_subprocess("--pyargs", "torchchaos.suites", "-m", "chaos_kills",
                                           "-k", "mid-interval and not node", "-n", "2", "-v",
                                           "-p", "no:cacheprovider", f"--junitxml={xml}")
    cases = ["kill rank 0 mid-interval", "kill last rank mid-interval"]
    assert set(cases) < set(listed_cases("kills"))
    result.assert_outcomes(passed=len(cases))
    result.stdout.fnmatch_lines(["*torchchaos verdicts*", "verdict  lost  test*"])
    rows = [line for line in result.stdout.lines if line.startswith("PASS ")]
    assert len(rows) == len(cases), result.stdout.str()
    assert all(any(case in row for row in rows) for case in cases), result.stdout.str()
    # each worker ran one of them: the table is the controller's, of both workers' runs
    workers = {line.split()[0] for line in result.stdout.lines
               if re.match(r"\[gw[01]\] .*PASSED", line)}
    assert workers == {"[gw0]", "[gw1]"}, result.stdout.str()
    assert all(p["chaos_verdict"] == "pass" for p in _properties(xml).values())
    assert len(_properties(xml)) == len(cases)
    # one cache for both workers, where XDG_CACHE_HOME says, with one reference in it
    assert len(list((pytester.path / "xdg" / "torchchaos").glob("ref-*/"))) == 1
    assert not list(pytester.path.rglob("torchchaos-cache"))
