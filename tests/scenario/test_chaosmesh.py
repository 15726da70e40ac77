"""Chaos Mesh export: each fault kind's manifest (or why it has none), the schema that
every manifest must pass (and that really fails broken ones), the Workflow's order and
offsets, and `torchchaos export` on the incidents and on bad input. No training runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from torchchaos.cli import main as cli
from torchchaos.errors import Unavailable, UsageError
from torchchaos.faults import storage as storage_kind
from torchchaos.faults.contract import FaultKind
from torchchaos.faults.registry import all_kinds, get_kind
from torchchaos.scenario import chaosmesh
from torchchaos.scenario import files as scenario_file
from torchchaos.scenario.chaosmesh import Options

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "targets" / "ddp_lm.py"
INCIDENTS = sorted((REPO / "suites" / "incidents").glob("*.chaos.yaml"))
LABEL = chaosmesh.DEFAULT_NODE_LABEL


def load(tmp_path: Path, faults: list[str], nodes: int = 3, nproc: int = 2
         ) -> scenario_file.ScenarioFile:
    job = {"script": str(TARGET), "nproc": nproc, "nodes": nodes}
    if any(f.startswith("toxic:") for f in faults):
        job["network"] = "host"  # where a Toxiproxy server can reach the nodes
    doc = {"torchchaos": 1, "job": job, "seed": 0, "faults": faults}
    path = tmp_path / "job.chaos.yaml"
    path.write_text(yaml.safe_dump(doc))
    return scenario_file.load(path)


def export(tmp_path: Path, *faults: str, nodes: int = 3, nproc: int = 2,
           **options: object) -> chaosmesh.Export:
    options.setdefault("seconds_per_step", 2.0)
    return chaosmesh.export(load(tmp_path, list(faults), nodes, nproc),
                            Options(**options))  # type: ignore[arg-type]


def only(result: chaosmesh.Export) -> dict:
    """The one bare manifest of a one-fault export."""
    assert result.not_exported == [] and len(result.manifests) == 1, result
    return result.manifests[0]


def pods(selector: dict) -> list[str]:
    if "labelSelectors" in selector:
        return [selector["labelSelectors"][LABEL]]
    (expression,) = selector["expressionSelectors"]
    assert expression["key"] == LABEL and expression["operator"] == "In"
    return expression["values"]


def templates(result: chaosmesh.Export) -> dict[str, dict]:
    assert result.workflow is not None
    return {t["name"]: t for t in result.workflow["spec"]["templates"]}


# -- mapping, kind by kind -----------------------------------------------------------------

def test_node_kill_is_a_pod_kill_without_grace(tmp_path: Path) -> None:
    manifest = only(export(tmp_path, "kill:node=1,step=10", namespace="train"))
    assert manifest["kind"] == "PodChaos" and manifest["metadata"]["namespace"] == "train"
    spec = manifest["spec"]
    assert (spec["action"], spec["mode"], spec["gracePeriod"]) == ("pod-kill", "all", 0)
    assert spec["selector"] == {"namespaces": ["train"], "labelSelectors": {LABEL: "1"}}
    assert manifest["metadata"]["annotations"] == {
        chaosmesh.FAULT_ANNOTATION: "kill:node=1,step=10",
        chaosmesh.START_ANNOTATION: "20s"}


def test_preemption_is_a_pod_kill_with_its_grace_period(tmp_path: Path) -> None:
    assert only(export(tmp_path, "kill:node=0,step=5,signal=SIGTERM,grace=12.5")
                )["spec"]["gracePeriod"] == 13  # whole seconds, never shorter
    assert only(export(tmp_path, "kill:node=0,step=5,signal=SIGTERM"))["spec"]["gracePeriod"] \
        == 30  # kill's default grace


def test_rank_kill_is_finer_than_a_pod_unless_each_rank_has_one(tmp_path: Path) -> None:
    result = export(tmp_path, "kill:rank=3,step=4")
    assert result.manifests == [] and result.workflow is None
    (line,) = result.not_exported
    assert line.startswith("kill:rank=3,step=4 — acts on one process (rank 3) inside node 1's")
    assert "--pod-per-rank" in line
    spec = only(export(tmp_path, "kill:rank=3,step=4", pod_per_rank=True))["spec"]
    assert pods(spec["selector"]) == ["3"]
    # ... and then a node is the pods of its ranks
    spec = only(export(tmp_path, "kill:node=1,step=4", pod_per_rank=True))["spec"]
    assert pods(spec["selector"]) == ["2", "3"]


def test_isolating_a_node_is_a_partition_from_every_other_node(tmp_path: Path) -> None:
    result = export(tmp_path, "partition:node=2,step=8,for=6", node_label="app/replica")
    spec = only(result)["spec"]
    assert (spec["action"], spec["direction"], spec["duration"]) == ("partition", "both", "6s")
    assert spec["selector"]["labelSelectors"] == {"app/replica": "2"}
    target = spec["target"]
    assert target["mode"] == "all"
    assert target["selector"]["expressionSelectors"] == [
        {"key": "app/replica", "operator": "In", "values": ["0", "1"]}]
    chaos = templates(result)["f0-partition-chaos"]
    assert chaos["deadline"] == "6s" and "duration" not in chaos["networkChaos"]


def test_split_groups_cut_each_pair_of_sides(tmp_path: Path) -> None:
    result = export(tmp_path, "partition:sides=0/1/2,step=3,for=4")
    cuts = [(pods(m["spec"]["selector"]), pods(m["spec"]["target"]["selector"]))
            for m in result.manifests]
    assert cuts == [(["0"], ["1", "2"]), (["1"], ["2"])]
    halves = only(export(tmp_path, "partition:shape=halves,step=3", nodes=4))["spec"]
    assert (pods(halves["selector"]), pods(halves["target"]["selector"])) == (
        ["0", "1"], ["2", "3"])
    assert "duration" not in halves  # no for=: in force until deleted


def test_oneway_is_direction_to_and_the_store_cut_is_not_exported(tmp_path: Path) -> None:
    result = export(tmp_path, "partition:node=0,shape=oneway,to=2,step=3,for=5")
    spec = only(result)["spec"]
    assert spec["direction"] == "to"
    assert (pods(spec["selector"]), pods(spec["target"]["selector"])) == (["0"], ["2"])
    assert result.approximations and "connections node 2 opened" in result.approximations[0]
    result = export(tmp_path, "partition:shape=store,step=3,for=5")
    assert result.manifests == [] and "one TCP port" in result.not_exported[0]


@pytest.mark.parametrize("spec,errno,methods", [
    ("storage:mode=enospc,step=3", 28, ["write"]),
    ("storage:mode=eio,step=3,op=fsync,count=2", 5, ["fsync"]),
    ("storage:mode=eio,step=3,op=truncate", 5, ["setattr"]),
    ("storage:mode=enospc,step=3,op=any", 28, None),
], ids=["enospc", "eio-fsync", "eio-truncate", "any-op"])
def test_errno_faults_are_io_faults_on_the_checkpoint_volume(
        tmp_path: Path, spec: str, errno: int, methods: list[str] | None) -> None:
    result = export(tmp_path, spec.replace("step=3", "rank=3,step=3"), volume_path="/data/ck")
    io = only(result)["spec"]
    assert (io["action"], io["errno"], io["percent"]) == ("fault", errno, 100)
    assert io.get("methods") == methods and io["volumePath"] == "/data/ck"
    assert pods(io["selector"]) == ["1"]  # rank 3's writes go through node 1's volume
    assert "fails every one while it is in force" in result.approximations[0]


def test_slow_io_is_latency_for_its_duration(tmp_path: Path) -> None:
    io = only(export(tmp_path, "storage:mode=slow,node=2,step=3,delay=0.2,duration=5"))["spec"]
    assert (io["action"], io["delay"], io["duration"]) == ("latency", "0.2s", "5s")
    assert "methods" not in io  # the fault filesystem slows every operation


@pytest.mark.parametrize("spec", ["storage:mode=bitrot,node=0,step=9,bits=3,file=step-*.pt",
                                  "bitflip:node=0,step=9,tensor=checkpoint,file=step-*.pt"])
def test_bit_rot_is_a_mistake_on_reads(tmp_path: Path, spec: str) -> None:
    io = only(export(tmp_path, spec))["spec"]
    assert (io["action"], io["methods"], io["path"]) == ("mistake", ["read"],
                                                         "/ckpt/step-*.pt")
    assert io["mistake"]["filling"] == "random" and io["mistake"]["maxLength"] == 1
    assert io["mistake"]["maxOccurrences"] == (3 if spec.startswith("storage") else 1)


@pytest.mark.parametrize("spec,reason", [
    ("storage:mode=lose_unsynced,step=3", "power loss"),
    ("storage:mode=torn,step=3", "write cut short"),
    ("storage:mode=torn,phase=checkpoint_save,event=2,via=agent", "write cut short"),
    ("bitflip:rank=0,step=5,tensor=grad", "bits of a grad tensor inside the training process"),
    ("hang:rank=1,step=5", "hang inside the rank's process (mode=stop)"),
    ("hang:rank=1,step=5,mode=collective", "(mode=collective)"),
    ("straggler:rank=1,step=5,delay=0.5", "per-step delay"),
    ("toxic:node=1,step=5,type=latency,latency=100", "Toxiproxy"),
    ("kill:node=1,phase=checkpoint_save,save=2,event=3",
     "file event of checkpoint_save (save=2, event=3)"),
    ("kill:node=1,p=0.1", "probability 0.1 per step"),
], ids=["power-loss", "torn", "torn-agent", "bitflip", "hang", "hang-collective", "straggler",
        "toxic", "phase-trigger", "p-trigger"])
def test_no_cluster_counterpart_is_listed_with_its_reason(
        tmp_path: Path, monkeypatch, spec: str, reason: str) -> None:
    # a toxic's file only loads where a Toxiproxy server answers; export needs none
    monkeypatch.setattr(get_kind("toxic"), "check_job", lambda *args: None)
    result = export(tmp_path, spec, nodes=2)
    assert result.manifests == [] and result.workflow is None
    (line,) = result.not_exported
    assert line.startswith(f"{spec} — ") and reason in line, line


@pytest.mark.parametrize("name", sorted(all_kinds()))
def test_every_kind_maps_itself_or_says_why_a_cluster_cannot_have_it(name: str) -> None:
    kind = get_kind(name)
    maps_itself = type(kind).chaos_mesh is not FaultKind.chaos_mesh
    assert maps_itself or kind.not_on_a_cluster, (
        f"{name}: set not_on_a_cluster (the reason export gives) or override chaos_mesh")


def test_time_triggers_need_no_step_timing(tmp_path: Path) -> None:
    result = export(tmp_path, "kill:node=1,time=12.25", seconds_per_step=None)
    assert only(result)["metadata"]["annotations"][chaosmesh.START_ANNOTATION] == "12.25s"


def test_steps_need_a_timing(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--seconds-per-step S or --run-dir DIR"):
        export(tmp_path, "kill:node=1,step=3", seconds_per_step=None)


def write_history(run_dir: Path, steps: dict[int, float], start: float = 100.0) -> None:
    """A run's history: a launch at `start`, then step events (each on two ranks, the
    repeats after a restart later) at start + seconds."""
    history = run_dir / "_chaos" / "history"
    history.mkdir(parents=True)
    events = [{"ev": "launch", "t": start, "source": "harness"}]
    for step, seconds in steps.items():
        events += [{"ev": "step", "t": start + seconds + rank * 0.01, "rank": rank,
                    "step": step} for rank in (0, 1)]
    events.append({"ev": "step", "t": start + 99.0, "rank": 0, "step": 2})  # after a restart
    (history / "rank-0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_steps_are_timed_by_a_runs_history(tmp_path: Path) -> None:
    write_history(tmp_path / "out" / "chaos", {1: 5.0, 2: 5.5, 3: 6.25})
    times = chaosmesh.step_times(tmp_path / "out")  # an --out folder holding chaos/
    assert times == {1: 5.0, 2: 5.5, 3: 6.25}
    result = export(tmp_path, "kill:node=1,step=3", seconds_per_step=None, step_times=times)
    assert only(result)["metadata"]["annotations"][chaosmesh.START_ANNOTATION] == "6.25s"
    with pytest.raises(UsageError, match="step 7 was never reached .* to step 3"):
        export(tmp_path, "kill:node=1,step=7", seconds_per_step=None, step_times=times)
    with pytest.raises(UsageError, match="not a torchchaos run directory"):
        chaosmesh.step_times(tmp_path)


@pytest.mark.parametrize("options,message", [
    ({"namespace": "Team_A"}, "--namespace"),
    ({"node_label": "bad label"}, "--node-label"),
    ({"volume_path": "ckpt"}, "--volume-path"),
    ({"seconds_per_step": 0.0}, "--seconds-per-step"),
])
def test_bad_options_are_usage_errors(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        export(tmp_path, "kill:node=1,time=3", **options)


# -- the Workflow keeps order and offsets --------------------------------------------------

def test_workflow_starts_each_fault_at_its_offset_in_schedule_order(tmp_path: Path) -> None:
    result = export(tmp_path, "kill:node=1,step=10", "partition:node=2,step=4,for=6",
                    "kill:node=0,time=0", "storage:mode=slow,node=0,step=7,duration=3",
                    seconds_per_step=1.5)
    by_name = templates(result)
    entry = by_name[result.workflow["spec"]["entry"]]
    assert entry["templateType"] == "Parallel"
    # children in the order the faults start; each a Serial: wait for the offset, then chaos
    assert entry["children"] == ["f2-kill", "f1-partition", "f3-storage", "f0-kill"]
    offsets = {}
    for branch in entry["children"]:
        serial = by_name[branch]
        assert serial["templateType"] == "Serial"
        first = by_name[serial["children"][0]]
        offsets[branch] = first["deadline"] if first["templateType"] == "Suspend" else "0s"
        assert by_name[serial["children"][-1]]["templateType"] in chaosmesh.EMBED_KEYS
    assert offsets == {"f2-kill": "0s", "f1-partition": "6s", "f3-storage": "10.5s",
                       "f0-kill": "15s"}
    # the bare manifests come in the same order, each with its offset
    starts = [(m["metadata"]["name"], m["metadata"]["annotations"][chaosmesh.START_ANNOTATION])
              for m in result.manifests]
    assert starts == [("torchchaos-f2-kill", "0s"), ("torchchaos-f1-partition", "6s"),
                      ("torchchaos-f3-storage", "10.5s"), ("torchchaos-f0-kill", "15s")]


def test_a_flapping_partition_repeats_chaos_and_healed_gaps(tmp_path: Path) -> None:
    result = export(tmp_path, "partition:node=1,time=30,for=3,flaps=3,gap=2")
    by_name = templates(result)
    steps = [(by_name[n]["templateType"], by_name[n].get("deadline"))
             for n in by_name["f0-partition"]["children"]]
    assert steps == [("Suspend", "30s"), ("NetworkChaos", "3s"), ("Suspend", "2s"),
                     ("NetworkChaos", "3s"), ("Suspend", "2s"), ("NetworkChaos", "3s")]
    starts = [m["metadata"]["annotations"][chaosmesh.START_ANNOTATION]
              for m in result.manifests]
    assert starts == ["30s", "35s", "40s"]  # each cut for= 3 s, then gap= 2 s healed


def test_a_cut_of_three_sides_runs_its_partitions_together(tmp_path: Path) -> None:
    by_name = templates(export(tmp_path, "partition:sides=0/1/2,step=3,for=4"))
    serial = by_name["f0-partition"]["children"]
    group = by_name[serial[-1]]
    assert group["templateType"] == "Parallel" and len(group["children"]) == 2
    assert all(by_name[c]["deadline"] == "4s" for c in group["children"])


# -- the schema ----------------------------------------------------------------------------

EVERYTHING = ["kill:node=1,step=10", "kill:node=0,step=12,signal=SIGTERM,grace=20",
              "kill:rank=1,step=5", "partition:node=2,step=8,for=6",
              "partition:sides=0/1/2,time=30,for=3,flaps=2,gap=2",
              "partition:node=0,shape=oneway,to=1,step=4", "storage:mode=enospc,step=3",
              "storage:mode=eio,step=3,op=rename", "storage:mode=slow,step=3,delay=0.2",
              "storage:mode=bitrot,step=15,bits=3", "bitflip:rank=0,step=20",
              "hang:rank=1,step=12"]


@pytest.mark.parametrize("pod_per_rank", [False, True])
def test_every_emitted_manifest_validates(tmp_path: Path, pod_per_rank: bool) -> None:
    result = export(tmp_path, *EVERYTHING, pod_per_rank=pod_per_rank,
                    node_label="training.kubeflow.org/replica-index")
    assert {m["kind"] for m in result.manifests} == {"PodChaos", "NetworkChaos", "IOChaos"}
    for manifest in [*result.manifests, result.workflow]:
        assert chaosmesh.validate(manifest) == [], manifest


def broken(result: chaosmesh.Export, kind: str) -> dict:
    return copy.deepcopy(next(m for m in result.manifests if m["kind"] == kind))


def test_the_schema_rejects_broken_manifests(tmp_path: Path) -> None:
    result = export(tmp_path, *EVERYTHING)
    cases = []
    pod = broken(result, "PodChaos")
    pod["spec"]["action"] = "pod-kil"
    cases.append((pod, "spec.action: 'pod-kil' is not one of"))
    net = broken(result, "NetworkChaos")
    net["spec"]["directon"] = "to"
    cases.append((net, "Additional properties are not allowed ('directon'"))
    io = broken(result, "IOChaos")
    del io["spec"]["selector"]
    cases.append((io, "'selector' is a required property"))
    io = broken(result, "IOChaos")
    del io["spec"]["volumePath"]
    cases.append((io, "'volumePath' is a required property"))
    net = broken(result, "NetworkChaos")
    net["spec"]["duration"] = "6 seconds"
    cases.append((net, "spec.duration: '6 seconds' does not match"))
    net = broken(result, "NetworkChaos")
    net["spec"]["direction"] = "sideways"
    cases.append((net, "spec.direction: 'sideways' is not one of"))
    pod = broken(result, "PodChaos")
    pod["spec"]["mode"] = "some"
    cases.append((pod, "spec.mode: 'some' is not one of"))
    pod = broken(result, "PodChaos")
    pod["metadata"]["name"] = "Torn_Checkpoint"
    cases.append((pod, "metadata.name: 'Torn_Checkpoint' does not match"))
    pod = broken(result, "PodChaos")
    pod["apiVersion"] = "chaos-mesh.org/v1"
    cases.append((pod, "apiVersion: 'chaos-mesh.org/v1alpha1' was expected"))
    for manifest, message in cases:
        errors = chaosmesh.validate(manifest)
        assert any(message in e for e in errors), (message, errors)


def test_the_schema_rejects_broken_workflows(tmp_path: Path) -> None:
    workflow = export(tmp_path, *EVERYTHING).workflow
    templates_of = lambda w: w["spec"]["templates"]  # noqa: E731
    cases = []
    flow = copy.deepcopy(workflow)
    chaos = next(t for t in templates_of(flow) if t["templateType"] == "PodChaos")
    chaos["podChaos"]["duration"] = "5s"  # the webhook wants deadline in a Workflow
    cases.append((flow, "should not be valid"))
    flow = copy.deepcopy(workflow)
    suspend = next(t for t in templates_of(flow) if t["templateType"] == "Suspend")
    del suspend["deadline"]
    cases.append((flow, "'deadline' is a required property"))
    flow = copy.deepcopy(workflow)
    templates_of(flow)[0]["children"].append("f99-kill")
    cases.append((flow, "no template named 'f99-kill'"))
    flow = copy.deepcopy(workflow)
    flow["spec"]["entry"] = "start"
    cases.append((flow, "entry: no template named 'start'"))
    flow = copy.deepcopy(workflow)
    templates_of(flow)[1]["templateType"] = "Sequence"
    cases.append((flow, "'Sequence' is not one of"))
    for manifest, message in cases:
        errors = chaosmesh.validate(manifest)
        assert any(message in e for e in errors), (message, errors)


def test_an_invalid_manifest_is_never_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(storage_kind.IO_METHODS, "write", "scribble")  # an exporter bug
    with pytest.raises(chaosmesh.ManifestError, match="IOChaos torchchaos-f0-storage:"
                                                      " spec.methods.0: 'scribble'"):
        export(tmp_path, "storage:mode=enospc,node=0,step=3")


def test_the_schema_ships_with_the_package() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert "\"torchchaos.rank\" = [\"_inject/*.py\"]" in text
    assert "\"torchchaos.scenario\" = [\"schemas/*.json\"]" in text
    assert '"jsonschema>=4.18"' in text


# -- the command line ----------------------------------------------------------------------

def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["export", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("path", INCIDENTS, ids=lambda p: p.name.split(".")[0])
def test_export_of_each_incident(capsys, tmp_path: Path, path: Path) -> None:
    try:
        scenario_file.load(path)
    except Unavailable as exc:  # a GPU's incident on a machine without one (known limit)
        pytest.skip(str(exc))
    out = tmp_path / "out.yaml"
    code, stdout, stderr = run_cli(capsys, path, "--seconds-per-step", "1.5",
                                   "--pod-per-rank", "--out", out)
    assert code == 0 and stdout == ""
    text = out.read_text()
    assert text.startswith(f"# Chaos Mesh manifests ({chaosmesh.API_VERSION}) exported by"
                           f" torchchaos from {path}")
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    for doc in docs:
        assert chaosmesh.validate(doc) == []
    faults = scenario_file.load(path).scenario.faults
    exported = [f for f in faults if f.kind == "kill" and f.trigger.step is not None]
    assert len(docs) == (1 if exported else 0)
    # whatever was not exported is on stderr, one line each, and in the file's header
    lines = stderr.splitlines()
    assert len(lines) == len(faults) - len(exported)
    for line in lines:
        assert line.startswith("not exported: ") and f"# {line}" in text


def test_export_without_pod_per_rank_lists_rank_kills_on_stderr(capsys) -> None:
    path = REPO / "suites" / "incidents" / "second_resume.chaos.yaml"
    code, stdout, stderr = run_cli(capsys, path)
    assert code == 0 and "nothing to apply" in stdout
    assert stderr.splitlines() == [
        "not exported: kill:rank=1,step=7 — acts on one process (rank 1) inside node 0's pod;"
        " Chaos Mesh acts on whole pods (the pod-level fault is node=0; or pass"
        " --pod-per-rank if every rank has a pod of its own)",
        "not exported: kill:rank=0,step=12 — acts on one process (rank 0) inside node 0's pod;"
        " Chaos Mesh acts on whole pods (the pod-level fault is node=0; or pass"
        " --pod-per-rank if every rank has a pod of its own)"]


def test_export_to_stdout_and_bare(capsys) -> None:
    path = REPO / "suites" / "incidents" / "replayed_data.chaos.yaml"
    code, stdout, _ = run_cli(capsys, path, "--seconds-per-step", "2", "--pod-per-rank",
                              "--namespace", "llm", "--bare")
    assert code == 0
    (manifest,) = [d for d in yaml.safe_load_all(stdout) if d]
    assert manifest["kind"] == "PodChaos" and manifest["spec"]["gracePeriod"] == 30
    assert manifest["metadata"] == {
        "name": "replayed-data-f0-kill", "namespace": "llm",
        "annotations": {chaosmesh.FAULT_ANNOTATION: "kill:rank=0,step=12,signal=SIGTERM,grace=30",
                        chaosmesh.START_ANNOTATION: "24s"}}


@pytest.mark.parametrize("argv,message", [
    (["missing.chaos.yaml", "--seconds-per-step", "1"], "cannot read scenario file"),
    (["{broken}", "--seconds-per-step", "1"], "not valid YAML"),
    (["{kil}", "--seconds-per-step", "1"], "unknown fault kind 'kil'"),
    (["{incident}", "--seconds-per-step", "-2"], "expected seconds > 0"),
    (["{incident}", "--seconds-per-step", "1", "--run-dir", "."], "not allowed with"),
    (["{incident}", "--pod-per-rank"], "--seconds-per-step S or --run-dir DIR"),
    (["{incident}", "--run-dir", "{tmp}"], "not a torchchaos run directory"),
    (["{incident}", "--seconds-per-step", "1", "--namespace", "A B"], "--namespace"),
    (["{incident}", "--seconds-per-step", "1", "--volume-pth", "/x"], "unrecognized arguments"),
    (["{incident}", "--seconds-per-step", "1", "--out", "{tmp}/no/such/dir/x.yaml"],
     "cannot write"),
], ids=["missing", "broken-yaml", "bad-fault", "bad-seconds", "both-timings", "no-timing",
        "not-a-run", "bad-namespace", "typo-option", "unwritable-out"])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path: Path, argv: list[str],
                                          message: str) -> None:
    (tmp_path / "broken.chaos.yaml").write_text("faults: [kill:node=1,step=3\n")
    (tmp_path / "kil.chaos.yaml").write_text(
        f"job: {{script: {TARGET}}}\nfaults: ['kil:node=0,step=3']\n")
    names = {"{broken}": str(tmp_path / "broken.chaos.yaml"),
             "{kil}": str(tmp_path / "kil.chaos.yaml"),
             "{incident}": str(REPO / "suites" / "incidents" / "second_resume.chaos.yaml"),
             "{tmp}": str(tmp_path)}
    argv = [a.replace(a.split("/")[0], names.get(a.split("/")[0], a.split("/")[0]))
            for a in argv]
    code, stdout, stderr = run_cli(capsys, *argv)
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("torchchaos: error: "), stderr
    assert message in stderr and "Traceback" not in stderr


def test_object_names_come_from_the_file() -> None:
    assert chaosmesh.name_of(Path("suites/incidents/torn_checkpoint.chaos.yaml")) \
        == "torn-checkpoint"
    assert chaosmesh.name_of(Path("/runs/20260101-x/replay.yaml")) == "torchchaos-20260101-x"
    assert chaosmesh.go_duration(1.0) == "1s" and chaosmesh.go_duration(0.0504) == "0.05s"
