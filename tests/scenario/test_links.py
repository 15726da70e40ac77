"""`--link PATH`: what every run directory shows under its own name. Checked before any
process starts, kept by name (not resolved) through scenario files, [tool.torchchaos]
and exported JobSets."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from torchchaos.cli import main as cli
from torchchaos.errors import UsageError
from torchchaos.explore import suiteconfig
from torchchaos.scenario import files as scenario_file
from torchchaos.scenario import jobset
from torchchaos.scenario.model import Scenario

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "targets" / "ddp_lm.py"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """configurator.py, and data/ as a symlink to where the data set really is."""
    (tmp_path / "configurator.py").write_text("lr = 0.1\n")
    (tmp_path / "datasets" / "tiny").mkdir(parents=True)
    (tmp_path / "data").symlink_to(tmp_path / "datasets")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("links, message", [
    (["missing.py"], "/missing.py: no such file or folder"),
    (["configurator.py", "sub/configurator.py"],
     "/sub/configurator.py: the run directory already has a 'configurator.py'"),
    (["_chaos"], "/_chaos: the run directory already has a '_chaos'"),
], ids=["missing", "same name twice", "the harness's own folder"])
def test_a_bad_link_is_one_line_and_exit_2_before_anything_runs(project, links, message):
    (project / "sub").mkdir()
    (project / "sub" / "configurator.py").write_text("")
    (project / "_chaos").mkdir()
    out = project / "never-created"
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main(["run", *[a for link in links for a in ("--link", link)], "--fault",
                         "kill:rank=0,step=3", "--out", str(out), "--", str(TARGET)])
    assert code == 2 and stderr.getvalue().count("\n") == 1, stderr.getvalue()
    assert message in stderr.getvalue()
    assert not out.exists()


def test_links_are_absolute_from_where_torchchaos_started_and_keep_their_names(project):
    scenario = Scenario.build(str(TARGET), links=["configurator.py", "data"])
    assert scenario.links == [str(project / "configurator.py"), str(project / "data")]


def test_a_scenario_file_keeps_links_relative_to_itself(project):
    scenario = Scenario.build(str(TARGET), faults=["kill:rank=1,step=6"],
                              links=["configurator.py", "data"])
    (project / "replays").mkdir()
    path = scenario_file.ScenarioFile(scenario).save(project / "replays" / "r.yaml")
    assert yaml.safe_load(path.read_text())["job"]["links"] == ["../configurator.py",
                                                                "../data"]
    assert scenario_file.load(path).scenario.links == scenario.links


def test_pyproject_links_are_relative_to_the_table(project):
    table = {"script": str(TARGET), "links": ["configurator.py", "data"]}
    scenario = suiteconfig.base_scenario(table, project, {}, "test")
    assert scenario.links == [str(project / "configurator.py"), str(project / "data")]
    with pytest.raises(UsageError, match="links must be a list of paths"):
        suiteconfig.base_scenario({"links": "data"}, project, {}, "test")


def test_an_exported_jobset_passes_the_links_to_every_node(project):
    scenario = Scenario.build(str(TARGET), nodes=2, nproc=1, links=["data"])
    options = jobset.JobOptions("job", "default", "image", "claim")
    manifest = jobset.jobset(scenario, options, "run", [], gather=False)
    (job,) = manifest["spec"]["replicatedJobs"]
    command = job["template"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "--link data --" in command
    ns = cli.build_parser().parse_args(["node", "--shared", "/s", "--node-rank", "0",
                                        "--nnodes", "2", "--rdzv-endpoint", "h:1",
                                        "--link", "data", "--", "t.py"])
    assert ns.link == ["data"]
