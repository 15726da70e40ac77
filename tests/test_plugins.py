"""Third-party plug-ins: a fault kind and a check from another installed package.

`examples/plugin` is installed, the way a user would install it, into a fresh
virtual environment that sees this one's packages (torch, torchchaos); the
command line run with that environment's Python finds its `pause` kind and
`pause_absorbed` check through their entry points, and the ranks torchrun
starts find the kind too. A broken entry point is a one-line usage error.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TARGET
from histories import Timeline, evidence, reference

from torchchaos import entrypoints
from torchchaos.cli.main import main as cli
from torchchaos.errors import UsageError
from torchchaos.faults import registry as kind_registry
from torchchaos.judge import checks_by_name as check_registry

EXAMPLE = REPO / "examples" / "plugin"
STEPS = ["--steps", "20", "--ckpt-every", "5"]  # test_e2e_kill's: its reference run is reused


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the example plug-in installed; its Python."""
    root = tmp_path_factory.mktemp("plugin-venv")
    source = root / "torchchaos-example-plugin"  # a copy: the build writes beside the source
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        # Run from a venv: --system-site-packages sees the base interpreter's packages,
        # not this venv's, so hand the new one this venv's (their .pth files included).
        purelib = subprocess.run([str(python), "-c", "import sysconfig;"
                                  " print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages())
        Path(purelib, "outer-venv.pth").write_text(lines)
    # pip comes from the system site; nothing from the network, nothing cached outside root
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--no-cache-dir", "--disable-pip-version-check", str(source)],
        capture_output=True, text=True, timeout=120, env={**_env(), "TMPDIR": str(root)})
    assert install.returncode == 0, install.stdout + install.stderr
    return python


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}


def venv_cli(python: Path, *args: str, cwd: Path,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "torchchaos.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=_env())


def test_the_plugin_kind_is_listed_and_named_in_errors(venv_python, tmp_path):
    listed = venv_cli(venv_python, "faults", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith("pause ") and "(parameters: for)" in line
               for line in listed.stdout.splitlines()), listed.stdout
    assert "kill " in listed.stdout, "the built-in kinds are still there"

    unknown = venv_cli(venv_python, "run", "--fault", "explode:rank=0,step=3", "--",
                       str(TARGET), cwd=tmp_path)
    assert unknown.returncode == 2
    line, = unknown.stderr.strip().splitlines()
    assert line.startswith("torchchaos: error: unknown fault kind 'explode'")
    assert "pause" in line.partition("known: ")[2].rstrip(")").split(", "), line

    check = venv_cli(venv_python, "run", "--check", "vibes", "--", str(TARGET), cwd=tmp_path)
    assert check.returncode == 2 and "pause_absorbed" in check.stderr, check.stderr

    bad = venv_cli(venv_python, "run", "--fault", "pause:rank=0,step=3,for=0", "--",
                   str(TARGET), cwd=tmp_path)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip() == "torchchaos: error: pause: for= needs more than 0 seconds"
    assert list(tmp_path.iterdir()) == [], "bad input must not write anything"


def test_a_plugin_fault_and_check_run_end_to_end(venv_python, tmp_path, shared_cache):
    out = tmp_path / "out"
    result = venv_cli(
        venv_python, "run", "--quiet", "--fault", "pause:rank=0,step=8,for=2",
        "--check", "completes", "--check", "deterministic_resume", "--check", "no_orphans",
        "--check", "pause_absorbed", "--out", str(out), "--cache-dir", str(shared_cache),
        str(TARGET), *STEPS, cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    row, = [line.split(maxsplit=2) for line in result.stdout.splitlines()
            if line.startswith("pause_absorbed ")]
    assert row[1] == "PASS" and row[2].startswith("1 pause(s) absorbed"), result.stdout
    assert "faults: pause:rank=0,step=8,for=2 (fired at step 8)" in result.stdout

    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "pass"
    assert list(report["checks"]) == ["completes", "deterministic_resume", "no_orphans",
                                      "pause_absorbed"], "plug-in checks run where named"
    assert report["checks"]["deterministic_resume"]["ok"] is True, "a pause changes no state"
    absorbed = report["checks"]["pause_absorbed"]
    assert absorbed["ok"] is True and absorbed["longest_wait_s"] >= 2.0, absorbed
    fault, = report["faults"]
    assert fault["kind"] == "pause" and fault["params"] == {"for": 2.0}
    assert fault["fired"] is True and fault["fired_step"] == 8, fault
    # the event the kind recorded from inside rank 0, read back from the run's history
    history = out / "chaos" / "_chaos" / "history" / "rank-0.jsonl"
    pauses = [e for e in map(json.loads, history.read_text().splitlines()) if e["ev"] == "pause"]
    assert [(p["step"], p["seconds"]) for p in pauses] == [(8, 2.0)]


# -- the check on hand-written histories (no venv: the example's module, imported) ---

@pytest.fixture
def pause_absorbed(monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ in the checkout
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from torchchaos_example.checks import pause_absorbed

    return pause_absorbed


def _paused(timeline: Timeline, step: int) -> None:
    timeline.add("fault", id="f0-pause", kind="pause", spec=f"pause:rank=0,step={step}",
                 step=step, **timeline.proc(0))
    timeline.add("pause", id="f0-pause", step=step, seconds=7.0, **timeline.proc(0))


def test_pause_absorbed_fails_a_pause_that_cost_a_restart(pause_absorbed):
    timeline = Timeline()
    timeline.train(2, range(1, 9))
    _paused(timeline, 8)  # then rank 1's collective timed out: torchrun restarted both
    timeline.train(2, range(6, 21), attempt=1, restored=5)
    result = pause_absorbed(evidence(timeline.history(), reference()))
    assert result.ok is False and result.data["stuck_ranks"] == [0, 1]
    assert "never stepped again in that attempt" in result.detail


def test_pause_absorbed_passes_and_is_undecided_without_a_pause(pause_absorbed):
    timeline = Timeline()
    timeline.train(2, range(1, 9))
    _paused(timeline, 8)
    timeline.train(2, range(9, 21), restored=None)  # the same attempt goes on
    result = pause_absorbed(evidence(timeline.history(), reference()))
    assert result.ok is True and result.data["pauses"] == 1, result.detail

    plain = Timeline()
    plain.train(2, range(1, 21))
    assert pause_absorbed(evidence(plain.history(), reference())).ok is None


# -- broken plug-ins (no venv: the entry points are faked) -------------------------

@pytest.mark.parametrize("path, reason", [
    ("torchchaos_no_such_module:Broken",
     "fault kind 'broken': cannot load 'torchchaos_no_such_module:Broken'"
     " (No module named 'torchchaos_no_such_module')"),
    ("torchchaos.faults.kill:NoSuchClass",
     "fault kind 'broken': cannot load 'torchchaos.faults.kill:NoSuchClass'"),
    ("torchchaos.faults.kill:Kill",
     "fault kind 'broken': 'torchchaos.faults.kill:Kill' is not a FaultKind named 'broken'"),
], ids=["no module", "no attribute", "not a kind of that name"])
def test_a_broken_fault_entry_point_is_a_one_line_usage_error(monkeypatch, capsys, tmp_path,
                                                              path, reason):
    monkeypatch.setattr(entrypoints, "installed",
                        lambda group: {"broken": path} if group == kind_registry.ENTRY_POINT_GROUP
                        else {})
    with pytest.raises(UsageError) as raised:
        kind_registry.get_kind("broken")
    assert str(raised.value).startswith(reason) and "\n" not in str(raised.value)
    for args in (["faults"], ["run", "--fault", "broken:rank=0,step=3", "--", str(TARGET)]):
        monkeypatch.chdir(tmp_path)
        assert cli(args) == 2
        line, = capsys.readouterr().err.splitlines()
        assert line.startswith(f"torchchaos: error: {reason}"), line
    assert kind_registry.get_kind("kill").name == "kill", "the built-in kinds still load"
    assert list(tmp_path.iterdir()) == []


def test_a_broken_check_entry_point_is_a_one_line_usage_error(monkeypatch):
    monkeypatch.setattr(entrypoints, "installed",
                        lambda group: {"broken": "torchchaos_no_such_module:check",
                                       "not_callable":
                                           "torchchaos.faults.registry:ENTRY_POINT_GROUP"}
                        if group == check_registry.ENTRY_POINT_GROUP else {})
    with pytest.raises(UsageError) as raised:
        check_registry.get_check("broken")
    assert str(raised.value) == ("check 'broken': cannot load 'torchchaos_no_such_module:check'"
                                 " (No module named 'torchchaos_no_such_module')")
    with pytest.raises(UsageError, match="^check 'not_callable': .* is not callable$"):
        check_registry.get_check("not_callable")
    assert "broken" not in check_registry.default_checks(), "plug-ins run only when named"


def test_a_broken_check_is_refused_before_any_run(monkeypatch, capsys, tmp_path):
    """Named checks load when the scenario is validated, as fault kinds do: a broken
    plug-in costs no reference run and no chaos run."""
    monkeypatch.setattr(entrypoints, "installed",
                        lambda group: {"broken": "torchchaos_no_such_module:check"}
                        if group == check_registry.ENTRY_POINT_GROUP else {})
    monkeypatch.chdir(tmp_path)
    args = ["run", "--check", "broken", "--out", str(tmp_path / "out"), "--cache-dir",
            str(tmp_path / "cache"), "--", str(TARGET)]
    assert cli(args) == 2
    line, = capsys.readouterr().err.splitlines()
    assert line.startswith("torchchaos: error: check 'broken': cannot load"), line
    assert list(tmp_path.iterdir()) == []


def test_a_plugin_that_takes_a_built_in_name_is_ignored_with_a_warning(monkeypatch):
    monkeypatch.setattr(entrypoints, "installed",
                        lambda group: {"kill": "mypackage:MyKill"}
                        if group == kind_registry.ENTRY_POINT_GROUP else {})
    with pytest.warns(UserWarning, match="the plug-in fault kind 'kill' .* is ignored"):
        paths = kind_registry.kind_paths()
    assert paths["kill"] == kind_registry.BUILTIN["kill"]


def test_a_broken_plugin_does_not_stop_what_only_looks_kinds_over(monkeypatch):
    """The timeline's marks and the search's names skip a plug-in that does not load;
    `torchchaos faults` (above) and a run that names it still say it is broken."""
    from torchchaos.explore import strategies

    monkeypatch.setattr(entrypoints, "installed",
                        lambda group: {"broken": "torchchaos_no_such_module:Broken"}
                        if group == kind_registry.ENTRY_POINT_GROUP else {})
    assert "broken" not in kind_registry.loadable_kinds()
    assert "kill" in kind_registry.loadable_kinds()
    shape = strategies.JobShape(world_size=2, final_step=20, checkpoint_every=5)
    assert {"kill", "preempt", "bitflip", "hang"} <= set(strategies.by_name(shape))
