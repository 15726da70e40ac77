"""An imported incident replayed end to end: on the bundled target with the bug the
incident had, the replay reproduces the incident's signature and fails the check the bug
breaks; the page beside the report shows both timelines."""

from __future__ import annotations

from pathlib import Path

from torchchaos.engine import run_scenario
from torchchaos.incident.importing import import_artefacts, judge_replay
from torchchaos.scenario import files as scenario_file
from torchchaos.scenario.model import Scenario

DATA = Path(__file__).resolve().parents[1] / "data" / "incidents"
SHIPPED = Path(__file__).resolve().parents[2] / "suites" / "incidents"
BUNDLED = Path(__file__).resolve().parents[2] / "targets" / "ddp_lm.py"
ARGS = ["--steps", "20", "--ckpt-every", "5"]


def imported_torn_checkpoint(cache: Path):
    base = Scenario.build(str(BUNDLED), args=ARGS)
    return import_artefacts([DATA / "load"], base, cache, lambda _m: None)


def test_the_imported_torn_checkpoint_is_the_shipped_incidents_fault(shared_cache):
    """Mapped onto the bundled target, the imported incident is the kill the hand-written
    suites/incidents/torn_checkpoint.chaos.yaml makes, whose run on the correct target
    tests/scenario/test_incidents.py judges."""
    imported = imported_torn_checkpoint(shared_cache)
    shipped = scenario_file.load(SHIPPED / "torn_checkpoint.chaos.yaml")
    assert [f.text for f in imported.file.scenario.faults] == \
        [f.text for f in shipped.scenario.faults]
    assert imported.file.incident["signature"] == {
        "kind": "kill", "role": "writer", "phase": "mid_save", "how": "SIGKILL",
        "recovery": "failed while loading", "rank": 0, "step": 8}


def test_on_the_bug_it_had_the_replay_reproduces_it_and_fails_atomic_recovery(
        tmp_path, shared_cache):
    imported = imported_torn_checkpoint(shared_cache)
    path = imported.file.save(tmp_path / "torn.chaos.yaml")
    loaded = scenario_file.load(path, str(BUNDLED), [*ARGS, "--bug", "write_in_place"])
    report = run_scenario(loaded.scenario, tmp_path / "run", shared_cache)
    assert report.checks["atomic_recovery"]["ok"] is False, report.table()
    assert loaded.expect.mismatches(report)  # the file fails as a test while the bug is in
    line, page = judge_replay(loaded.incident, tmp_path / "run", loaded.name, report.verdict,
                              report.failing())
    assert line.startswith("incident reproduced: kill of the writer rank mid save"), line
    assert "restart: failed while loading" in line
    html = page.read_text()
    assert "reproduced" in html and "atomic_recovery" in html and "step-0008.pt" in html
    # each column says why: the replay's own rules too, read from its artefacts
    assert html.count("ended by SIGKILL the launcher did not send") == 2, html
    assert 'href="timeline.svg"' in html


def test_the_page_tells_each_ranks_step_and_a_fix_that_holds_apart_from_a_failure(tmp_path):
    """A log whose step lines name no rank tells the job's last step; a replay that did not
    reproduce the incident and held every invariant is what a fix gives, not a failure."""
    from torchchaos.incident import page
    from torchchaos.incident.signature import Signature

    told = {"finding": {"step_window": [8, None], "rules": ["kill: rank 0 ended by SIGKILL"]},
            "ranks": {"0": {"rank": 0, "end": "SIGKILL"},
                      "1": {"rank": 1, "last_step": 7, "end": "stopped by the launcher"}},
            "recovery": "resumed: from step 5", "signature": {"kind": "kill"}}
    replay = Signature("kill", "writer", "mid_save")
    fixed = page.write(tmp_path, "torn", told, replay, told, ["recovery"], "pass", []).read_text()
    assert "<td>8 (the job)</td>" in fixed and "<td>7</td>" in fixed
    assert "<td>not told</td>" not in fixed  # each rank's end was told
    assert "the restart: resumed: from step 5" in fixed
    assert 'class="bad"' not in fixed and "Every invariant held" in fixed
    failed = page.write(tmp_path, "torn", told, replay, {}, ["recovery"], "fail",
                        ["atomic_recovery"]).read_text()
    assert 'class="bad"' in failed and "the artefacts told nothing" in failed
    nothing = page.write(tmp_path, "torn", told, replay, {"ranks": {"1": {"rank": 1}}},
                         ["recovery"], "fail", []).read_text()
    assert "<td>not told</td>" in nothing  # an end no artefact told is said so, not blank


POINTER = Path(__file__).resolve().parents[1] / "scripts" / "pointer_trainer.py"
POINTER_ARGS = [".", "--steps", "30", "--save-every", "10", "--size-mb", "0.5"]


def test_the_torn_checkpoints_replay_fails_the_pointer_first_writer_and_passes_the_atomic_one(
        tmp_path, shared_cache):
    """Issue 61: the resume that died on a torn file, imported as the torn save, replays as
    a torn write of that save: the writer that moves its pointer first fails
    atomic_recovery and reproduces the incident; the atomic writer holds every invariant,
    and the replay says it did not reproduce it (what a fix gives)."""
    case = DATA / "torn" / "pointer_first_resume_only"
    artefacts = [p for p in sorted(case.iterdir()) if p.name != "expected.json"]
    outcomes = {}
    for variant, extra in (("pointer_first", ["--pointer-first"]), ("atomic", [])):
        base = Scenario.build(str(POINTER), args=[*POINTER_ARGS, *extra])
        imported = import_artefacts(artefacts, base, shared_cache, lambda _m: None)
        assert [f.text.split(",")[0] for f in imported.file.scenario.faults] == \
            ["storage:mode=torn"], imported.file.notes
        loaded = scenario_file.load(imported.file.save(tmp_path / f"{variant}.chaos.yaml"))
        report = run_scenario(loaded.scenario, tmp_path / variant, shared_cache)
        line, _page = judge_replay(loaded.incident, tmp_path / variant, loaded.name,
                                   report.verdict, report.failing())
        outcomes[variant] = (report.checks["atomic_recovery"]["ok"], report.verdict, line)
    assert outcomes["pointer_first"][:2] == (False, "fail"), outcomes
    assert outcomes["pointer_first"][2].startswith("incident reproduced"), outcomes
    assert outcomes["atomic"][:2] == (True, "pass"), outcomes
    assert outcomes["atomic"][2].startswith("incident not reproduced"), outcomes
