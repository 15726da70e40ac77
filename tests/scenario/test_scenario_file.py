"""Scenario files: every scenario round-trips through YAML and JSON, and anything
malformed, however odd, is a one-line UsageError (exit 2 from the CLI), never a
traceback."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml
from conftest import TARGET
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchchaos.cli import main as cli
from torchchaos.errors import UsageError
from torchchaos.explore import strategies
from torchchaos.scenario import files as scenario_file
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import parse_fault_spec

SHAPE = strategies.JobShape(world_size=4, final_step=20, checkpoint_every=5,
                            save_events={1: 5, 2: 5})
ALL_KINDS = strategies.faults(SHAPE, sorted(strategies.by_name(SHAPE)))
FILE = TARGET.parent / "x.chaos.yaml"  # where a loaded file says it was (never written)
notes = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30)


@st.composite
def scenario_files(draw) -> scenario_file.ScenarioFile:
    faults = draw(strategies.schedules(ALL_KINDS, 3, 0))
    bounds = draw(st.fixed_dictionaries({}, optional={
        "max_lost_steps": st.integers(0, 50), "max_lost_seconds": st.floats(0.5, 100),
        "hang_timeout": st.floats(1, 60), "timeout": st.floats(1, 900),
        "max_restarts": st.integers(0, 5), "max_relaunches": st.integers(0, 3)}))
    scenario = Scenario.build(str(TARGET), faults=faults, nproc=4,
                              args=draw(st.lists(st.sampled_from(["--steps", "20", "-x"]))),
                              seed=draw(st.integers(0, 2**31)), **bounds,
                              checks=draw(st.none() | st.just(["completes", "no_orphans"])))
    expect = draw(st.none() | st.builds(
        scenario_file.Expectation, st.sampled_from(scenario_file.VERDICTS),
        st.dictionaries(st.sampled_from(["completes", "atomic_recovery"]),
                        st.sampled_from([True, False, None]))))
    resolved = draw(st.booleans())
    return scenario_file.ScenarioFile(
        scenario, name=draw(notes), summary=draw(notes), source=draw(notes),
        notes=[draw(notes) for _ in faults], expect=expect,
        resolved=[f.to_dict() for f in scenario_file.resolve(scenario)] if resolved else None)


def same(a: scenario_file.ScenarioFile, b: scenario_file.ScenarioFile) -> bool:
    return (a.scenario == b.scenario and a.expect == b.expect and a.resolved == b.resolved
            and (a.name, a.summary, a.source, a.notes) == (b.name, b.summary, b.source,
                                                           b.notes))


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(scenario_files(), st.sampled_from(["yaml", "json"]))
def test_every_scenario_round_trips(original, fmt):
    text = original.dumps(FILE.parent, fmt)
    loaded = scenario_file.loads(text, FILE.with_suffix(f".{fmt}"))
    assert same(loaded, original), text
    assert loaded.dumps(FILE.parent, fmt) == text  # and writes back the same text


def test_a_saved_file_names_its_script_relative_to_itself(tmp_path):
    scenario = Scenario.build(str(TARGET), faults=["kill:rank=1,step=12"])
    path = scenario_file.ScenarioFile(scenario).save(tmp_path / "r.yaml")
    script = yaml.safe_load(path.read_text())["job"]["script"]
    assert not Path(script).is_absolute() and script.endswith("targets/ddp_lm.py")
    assert scenario_file.load(path).scenario.script == str(TARGET)


def test_the_human_forms_of_a_fault_mean_the_same():
    text = f"""job: {{script: {TARGET}, args: [--steps, 20]}}
faults:
  - kill:rank=1,step=12
  - {{fault: "kill:rank=0,step=7", note: first}}
  - {{kind: kill, rank: 0, step: 17, signal: SIGTERM, note: preemption}}
"""
    loaded = scenario_file.loads(text, FILE)
    assert [f.text for f in loaded.scenario.faults] == [
        "kill:rank=1,step=12", "kill:rank=0,step=7", "kill:rank=0,step=17,signal=SIGTERM"]
    assert loaded.notes == ["", "first", "preemption"]
    assert loaded.scenario.args == ["--steps", "20"]


def test_an_edited_resolved_schedule_is_refused():
    scenario = Scenario.build(str(TARGET), faults=["kill:rank=one,step=12"], seed=4)
    good = scenario_file.ScenarioFile(scenario, resolved=[
        f.to_dict() for f in scenario_file.resolve(scenario)])
    doc = good.to_dict()
    doc["seed"] = 5  # rank=one now resolves to another rank (or another fault seed)
    with pytest.raises(UsageError, match="resolved: differs"):
        scenario_file.loads(json.dumps(doc), FILE)


def test_a_run_replay_file_expects_what_the_run_came_to():
    from torchchaos.report.report_file import Report

    scenario = Scenario.build(str(TARGET), faults=["kill:rank=1,step=12"])
    report = Report("fail", checks={"completes": {"ok": True, "detail": ""},
                                    "deterministic_resume": {"ok": False, "detail": ""}})
    replay = scenario_file.for_run(scenario, scenario_file.resolve(scenario), report)
    assert replay.expect == scenario_file.Expectation("fail", {"deterministic_resume": False})
    assert replay.expect.mismatches(report) == []
    assert replay.expect.mismatches(Report("pass", checks={})) == [
        "verdict 'pass', expected 'fail'", "deterministic_resume: ok=missing, expected ok=False"]
    assert scenario_file.for_run(scenario, [], Report("error", reason="x")).expect is None


# -- malformed input -------------------------------------------------------------------

yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3), max_leaves=8)
KEYS = ["torchchaos", "job", "faults", "seed", "bounds", "expect", "checks", "resolved",
        "name", "script", "args", "nproc", "verdict", "fault", "kind", "note", "rank", "step"]


@st.composite
def broken_files(draw) -> str:
    """A valid file with one part replaced by junk, or junk text altogether."""
    doc = {"job": {"script": str(TARGET), "args": ["--steps", "20"], "nproc": 2},
           "faults": ["kill:rank=1,step=12"], "expect": {"verdict": "pass"}}
    where = draw(st.sampled_from(["top", "job", "faults", "expect", "text", "spec"]))
    junk = draw(yaml_values)
    if where == "text":
        return draw(st.text(max_size=60))
    if where == "spec":
        doc["faults"] = [draw(st.text(max_size=40))]
    elif where == "top":
        doc[draw(st.sampled_from(KEYS))] = junk
    else:
        target = doc[where]
        if isinstance(target, dict):
            target[draw(st.sampled_from(KEYS))] = junk
        else:
            doc[where] = junk
    return yaml.safe_dump(doc)


@settings(max_examples=300)
@given(broken_files())
def test_malformed_files_are_one_line_usage_errors(text):
    try:
        scenario_file.loads(text, FILE)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(FILE))
    # some junk is harmless (an unknown nproc of 2 replaced by 3): loading is then fine


@settings(max_examples=300)
@given(st.text(max_size=50))
def test_malformed_fault_specs_are_one_line_usage_errors(text):
    try:
        parse_fault_spec(text)
    except UsageError as exc:
        assert "\n" not in str(exc).strip()


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(broken_files())
def test_the_cli_answers_a_malformed_file_with_exit_2_and_one_line(tmp_path, text):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    out = tmp_path / "never-created"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            scenario_file.load(path)
        except UsageError:
            code = cli.main(["replay", str(path), "--out", str(out)])
            assert code == 2 and stdout.getvalue() == ""
            assert stderr.getvalue().count("\n") == 1, stderr.getvalue()
            assert stderr.getvalue().startswith("torchchaos: error: ")
            assert not out.exists()


def test_a_file_that_is_not_there_or_not_text(tmp_path):
    with pytest.raises(UsageError, match="cannot read scenario file"):
        scenario_file.load(tmp_path / "missing.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(UsageError, match="not a text file"):
        scenario_file.load(tmp_path / "bin.yaml")
