"""Each shipped incident postmortem passes on the reference target and fails on the
planted bug it describes, through the same loader `torchchaos replay` and pytest use."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import cases

from torchchaos.engine import run_scenario
from torchchaos.errors import Unavailable
from torchchaos.scenario import files as scenario_file

INCIDENTS = Path(__file__).resolve().parents[2] / "suites" / "incidents"

# incident -> (the flag that plants its bug in targets/ddp_lm.py, the check that must fail)
PLANTED = {
    "torn_checkpoint": (["--bug", "write_in_place"], "atomic_recovery"),
    "ecc_hang": (["--default-timeouts"], "hang_detected"),
    "replayed_data": (["--bug", "replay_data"], "deterministic_resume"),
    "second_resume": (["--bug", "resume_twice"], "deterministic_resume"),
    "gil_deadlock": (["--default-timeouts"], "hang_detected"),
    "native_crash": (["--bug", "skip_rng"], "deterministic_resume"),
    "exception_mid_save": (["--bug", "publish_on_error"], "atomic_recovery"),
    "oom_kill": (["--bug", "skip_optim"], "deterministic_resume"),
    "dataloader_worker_killed": (["--bug", "replay_data"], "deterministic_resume"),
    "communicator_abort": (["--bug", "skip_sched"], "deterministic_resume"),
    "cuda_sticky_error": (["--bug", "skip_rng"], "deterministic_resume"),
}
# Each field-fault incident's passing run is its kind's run on this very target in
# tests/e2e/test_e2e_field_faults.py (the GIL's, with torchrun's 30 s grace, in
# tests/e2e/test_e2e_hang.py): only with -m slow here.
FIELD = frozenset({"gil_deadlock", "native_crash", "exception_mid_save", "oom_kill",
                   "dataloader_worker_killed", "communicator_abort"})


def available(name: str) -> None:
    """Skip an incident whose faults this machine cannot have (a GPU error without one)."""
    try:
        scenario_file.load(INCIDENTS / f"{name}.chaos.yaml")
    except Unavailable as exc:
        pytest.skip(str(exc))


def test_every_shipped_incident_has_a_planted_bug_and_a_story():
    files = sorted(p.name.removesuffix(".chaos.yaml") for p in INCIDENTS.glob("*.chaos.yaml"))
    assert files == sorted(PLANTED)
    for name in files:
        try:
            loaded = scenario_file.load(INCIDENTS / f"{name}.chaos.yaml")
        except Unavailable:  # a GPU's incident on a machine without one: read as text
            doc = yaml.safe_load((INCIDENTS / f"{name}.chaos.yaml").read_text())
            assert doc["name"] and doc["summary"] and doc["source"], name
            assert doc["faults"] and all(f["note"] for f in doc["faults"]), name
            assert doc["expect"]["verdict"] == "pass", name
            continue
        assert loaded.name and loaded.summary and loaded.source
        assert len(loaded.notes) == len(loaded.scenario.faults) >= 1 and all(loaded.notes)
        assert loaded.expect is not None and loaded.expect.verdict == "pass"


# torn_checkpoint's and replayed_data's faults (a kill mid-write in the 2nd save, a
# preemption at step 12) on this very job are rows of the battery, whose test
# (tests/cli/test_cli.py) checks what these files expect of them: only with -m slow
@pytest.mark.parametrize("name", cases({name: name for name in sorted(PLANTED)},
                                       slow=frozenset({"torn_checkpoint", "replayed_data"})
                                       | FIELD))
def test_the_incident_passes_on_the_reference_target(name, tmp_path, shared_cache):
    available(name)
    loaded = scenario_file.load(INCIDENTS / f"{name}.chaos.yaml")
    report = run_scenario(loaded.scenario, tmp_path / "run", shared_cache)
    assert loaded.expect.mismatches(report) == [], report.table()


# torn_checkpoint's run on its bug is the same run as the imported incident's
# (tests/incident/test_replay.py, which asserts both files make the same fault): only
# with -m slow here
@pytest.mark.parametrize("name", cases({name: name for name in sorted(PLANTED)},
                                       slow=frozenset({"torn_checkpoint"})))
def test_the_incident_fails_on_its_planted_bug(name, tmp_path, shared_cache):
    available(name)
    flags, check = PLANTED[name]
    path = INCIDENTS / f"{name}.chaos.yaml"
    original = scenario_file.load(path)
    loaded = scenario_file.load(path, original.scenario.script,
                                [*original.scenario.args, *flags])
    report = run_scenario(loaded.scenario, tmp_path / "run", shared_cache)
    assert report.verdict == "fail", report.table()
    assert report.checks[check]["ok"] is False, report.table()
    assert loaded.expect.mismatches(report)  # the incident's own expectation catches it
