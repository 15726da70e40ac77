"""Export a scenario file's node-level faults as Chaos Mesh manifests.

torchchaos injects faults into simulated nodes on one machine; on a Kubernetes
cluster the same schedule can be played by Chaos Mesh against the job's real
pods. A node is a pod, chosen by a label whose value is the node index
(`--node-label`, default `torchchaos.io/node`; e.g. a PyTorchJob's
`training.kubeflow.org/replica-index`). With `pod_per_rank` every rank has a
pod of its own, labelled with its global rank, so rank faults map too.
Each fault kind maps itself (`FaultKind.chaos_mesh`, in `faults/`); this module
turns steps into times, builds the manifests and the Workflow, and checks them.

    kill (node; rank with pod_per_rank)  PodChaos pod-kill (SIGTERM: gracePeriod)
    partition isolate/halves/majority/sides  NetworkChaos partition, direction both
    partition oneway                     NetworkChaos partition, direction to
    storage enospc / eio                 IOChaos fault, errno 28 / 5
    storage slow                         IOChaos latency
    storage bitrot, bitflip checkpoint   IOChaos mistake on reads (random bytes)

Everything else has no cluster counterpart and is listed as not exported with
the reason: faults inside a process (bit flips in tensors, hangs, stragglers,
kills of one rank among several in a pod), power loss, torn writes, Toxiproxy
toxics on one TCP port, and faults triggered by a checkpoint phase or a
probability (Chaos Mesh schedules by time only).

torchchaos fires at steps, Chaos Mesh at times: a step becomes seconds from
the job's start with a fixed seconds-per-step, or with the time that step was
first reached in a run's history. The manifests are wrapped in one Workflow:
a Parallel node with one Serial branch per fault (Suspend for its offset, then
the chaos; a flapping partition repeats chaos and Suspend), so overlapping
faults keep their own timing. The bare manifests carry their offset as an
annotation, for whoever applies them by hand. Every manifest is validated
against `chaos/scenario/schemas/chaosmesh.json` before it is returned.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchchaos.errors import ChaosError, UsageError
from torchchaos.faults.contract import ClusterChaos as Chaos
from torchchaos.faults.contract import NotExported, ResolvedFault
from torchchaos.faults.registry import get_kind
from torchchaos.rundir.layout import CHAOS_DIR
from torchchaos.scenario import schema

if TYPE_CHECKING:  # the CLI's parser imports this module: keep its import light
    from torchchaos.scenario.files import ScenarioFile

API_VERSION = "chaos-mesh.org/v1alpha1"
DEFAULT_NODE_LABEL = "torchchaos.io/node"
DEFAULT_VOLUME_PATH = "/ckpt"
FAULT_ANNOTATION = "torchchaos.io/fault"
START_ANNOTATION = "torchchaos.io/start-after"  # bare manifests: apply this long after start
EMBED_KEYS = {"PodChaos": "podChaos", "NetworkChaos": "networkChaos", "IOChaos": "ioChaos"}
# torchchaos's fault filesystem operations as Chaos Mesh's IOChaos methods (FUSE names)
NODE_LABEL = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ManifestError(ChaosError):
    """A manifest the exporter built does not validate: a bug in the exporter."""


@dataclass(frozen=True)
class Options:
    namespace: str = "default"
    node_label: str = DEFAULT_NODE_LABEL
    volume_path: str = DEFAULT_VOLUME_PATH  # where the checkpoint volume is mounted in a pod
    seconds_per_step: float | None = None
    step_times: dict[int, float] | None = None  # step -> seconds after start (a run's history)
    pod_per_rank: bool = False  # every rank has its own pod, labelled with its global rank
    name: str = "torchchaos"  # prefix of every object's name

    def check(self) -> None:
        """Raise UsageError for an option Kubernetes would refuse."""
        if not DNS_LABEL.match(self.namespace):
            raise UsageError(f"--namespace {self.namespace!r} is not a Kubernetes namespace name"
                             " (lower-case letters, digits and '-', at most 63)")
        if not NODE_LABEL.match(self.node_label):
            raise UsageError(f"--node-label {self.node_label!r} is not a label key"
                             " (e.g. training.kubeflow.org/replica-index)")
        if not self.volume_path.startswith("/"):
            raise UsageError(f"--volume-path must be an absolute path, got {self.volume_path!r}")
        if self.seconds_per_step is not None and not self.seconds_per_step > 0:
            raise UsageError(f"--seconds-per-step must be > 0, got {self.seconds_per_step}")


@dataclass
class Planned:
    """An exported fault: when it starts (seconds after the job's start) and what it is."""

    number: int
    fault: ResolvedFault
    start: float
    chaos: list[Chaos]
    repeats: int = 1  # a flapping partition: the chaos this many times ...
    gap: float = 0.0  # ... with this many seconds healed in between


@dataclass
class Export:
    """What `export` made: bare manifests, the Workflow, and what it could not export."""

    manifests: list[dict[str, Any]] = field(default_factory=list)  # bare, in schedule order
    workflow: dict[str, Any] | None = None
    not_exported: list[str] = field(default_factory=list)  # "<fault> — <reason>"
    kept: list[str] = field(default_factory=list)  # the specs of those: torchchaos injects them
    approximations: list[str] = field(default_factory=list)  # "<fault> — <what differs>"


def export(loaded: ScenarioFile, options: Options) -> Export:
    """The Chaos Mesh manifests of a loaded scenario file (`torchchaos.scenario.files.load`).

    Raises UsageError for options that cannot work (a step with no way to time it),
    ManifestError if a built manifest does not validate against the schema."""
    from torchchaos.scenario.files import resolve

    options.check()
    scenario = loaded.scenario
    result = Export()
    planned = []
    for number, fault in enumerate(resolve(scenario)):
        try:
            plan = _plan(number, fault, scenario.nproc, scenario.nodes, options, result)
        except NotExported as why:
            result.not_exported.append(f"{fault.spec} — {why}")
            result.kept.append(fault.spec)
            continue
        planned.append(plan)
    planned.sort(key=lambda p: (p.start, p.number))
    result.manifests = [m for p in planned for m in _bare(p, options)]
    if planned:
        result.workflow = _workflow(planned, options)
    for manifest in [*result.manifests, *([result.workflow] if result.workflow else [])]:
        errors = validate(manifest)
        if errors:
            raise ManifestError(f"{manifest['kind']} {manifest['metadata']['name']}: {errors[0]}")
    return result


def validate(manifest: Any) -> list[str]:
    """Every way a manifest breaks the schema (and a Workflow its references); [] if none."""
    errors = schema.errors("chaosmesh", manifest)
    if not errors and manifest.get("kind") == "Workflow":
        errors = _workflow_references(manifest["spec"])
    return errors


def step_times(run_dir: Path) -> dict[int, float]:
    """Seconds from the job's first launch to the first time each step was reached, from
    a run directory (or a `--out` directory holding `chaos/`)."""
    from torchchaos.rundir.history import History

    run_dir = Path(run_dir)
    if not (run_dir / CHAOS_DIR).is_dir() and (run_dir / "chaos" / CHAOS_DIR).is_dir():
        run_dir = run_dir / "chaos"
    if not (run_dir / CHAOS_DIR / "history").is_dir():
        raise UsageError(f"{run_dir}: not a torchchaos run directory (no {CHAOS_DIR}/history)")
    history = History.of_run(run_dir)
    launches = history.of("launch")
    start = launches[0]["t"] if launches else (history.events or [{"t": 0.0}])[0]["t"]
    times: dict[int, float] = {}
    for event in history.steps():
        times.setdefault(int(event["step"]), event["t"] - start)
    if not times:
        raise UsageError(f"{run_dir}: its history has no steps to time faults by")
    return times


def name_of(path: Path) -> str:
    """An object-name prefix from a scenario file's name: torn_checkpoint.chaos.yaml ->
    torn-checkpoint; a run's replay.yaml is named after its folder."""
    path = Path(path)
    stem = path.name.split(".")[0]
    if stem == "replay" and path.resolve().parent.name:
        stem = path.resolve().parent.name
    slug = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:40].strip("-")
    return slug if slug and slug[0].isalpha() else f"torchchaos-{slug}".strip("-")


def go_duration(seconds: float) -> str:
    """Seconds as a Go duration string, to the millisecond: 12s, 0.05s, 1.5s."""
    text = f"{round(seconds, 3):.3f}".rstrip("0").rstrip(".")
    return f"{text}s"


def _workflow_references(spec: dict[str, Any]) -> list[str]:
    """What the Workflow webhook checks beyond the schema: unique names, known children."""
    names = [t["name"] for t in spec["templates"]]
    errors = [f"templates: duplicate name {n!r}" for n in sorted({n for n in names
                                                                     if names.count(n) > 1})]
    if spec["entry"] not in names:
        errors.append(f"entry: no template named {spec['entry']!r}")
    for template in spec["templates"]:
        errors += [f"templates.{template['name']}.children: no template named {child!r}"
                   for child in template.get("children", []) if child not in names]
    return errors


# -- fault -> chaos ----------------------------------------------------------------------

def _plan(number: int, fault: ResolvedFault, nproc: int, nodes: int, options: Options,
          result: Export) -> Planned:
    chaos, note = get_kind(fault.kind).chaos_mesh(fault, _Job(nproc, nodes, options))
    start = _start(fault, options)
    if note:
        result.approximations.append(f"{fault.spec} — {note}")
    repeats, gap = 1, 0.0
    if "flaps" in fault.params:  # a flapping partition
        repeats = int(fault.params["flaps"])  # type: ignore[call-overload]
        gap = float(fault.params.get("gap", fault.params["for"]))  # type: ignore[arg-type]
    return Planned(number, fault, start, chaos, repeats, gap)


def _start(fault: ResolvedFault, options: Options) -> float:
    """Seconds after the job's start at which the fault fires."""
    trigger = fault.trigger
    if trigger.time is not None:
        return trigger.time
    if trigger.phase is not None:
        raise NotExported(f"fires at a file event of {trigger.phase} (save={trigger.save},"
                          f" event={trigger.event}); Chaos Mesh schedules by time only")
    if trigger.p is not None:
        raise NotExported(f"fires with probability {trigger.p:g} per step; Chaos Mesh"
                          " schedules by time only")
    step = int(trigger.step)  # type: ignore[arg-type]
    if options.step_times is not None:
        if step not in options.step_times:
            raise UsageError(f"--run-dir: step {step} was never reached in that run (it got"
                             f" to step {max(options.step_times)})")
        return options.step_times[step]
    if options.seconds_per_step is None:
        raise UsageError(f"{fault.spec} fires at step {step}: give --seconds-per-step S or"
                         " --run-dir DIR to turn steps into seconds")
    return step * options.seconds_per_step


@dataclass(frozen=True)
class _Job:
    """How the job's nodes and ranks are pods."""

    nproc: int
    nodes: int
    options: Options

    def node_pods(self, node: int) -> list[str]:
        """Label values of node `node`'s pods."""
        if self.options.pod_per_rank:
            return [str(r) for r in range(node * self.nproc, (node + 1) * self.nproc)]
        return [str(node)]

    def pods_of(self, fault: ResolvedFault) -> list[str] | None:
        """The pods a fault's target is, or None for a rank that shares its pod."""
        if fault.target_type == "node":
            return self.node_pods(fault.index)
        return [str(fault.index)] if self.options.pod_per_rank else None

    def host_pods(self, fault: ResolvedFault) -> list[str]:
        """The pods whose volume a fault's target writes to (a rank: its own pod)."""
        pods = self.pods_of(fault)
        return pods if pods is not None else self.node_pods(fault.index // self.nproc)

    def selector(self, values: list[str]) -> dict[str, Any]:
        key = self.options.node_label
        chosen: dict[str, Any] = {"namespaces": [self.options.namespace]}
        if len(values) == 1:
            chosen["labelSelectors"] = {key: values[0]}
        else:
            chosen["expressionSelectors"] = [{"key": key, "operator": "In", "values": values}]
        return chosen

    def io_base(self, fault: ResolvedFault) -> dict[str, Any]:
        return {"mode": "all", "selector": self.selector(self.host_pods(fault)),
                "volumePath": self.options.volume_path}

    def read_mistake(self, fault: ResolvedFault, bits: int) -> tuple[list[Chaos], str]:
        spec = self.io_base(fault)
        spec.update(action="mistake", methods=["read"],
                    mistake={"filling": "random", "maxOccurrences": bits, "maxLength": 1})
        if "file" in fault.params:
            spec["path"] = f"{self.options.volume_path.rstrip('/')}/{fault.params['file']}"
        return [Chaos("IOChaos", spec)], ("torchchaos flips bits in the committed file once"
                                          " and crashes the job; IOChaos returns random bytes"
                                          " to reads of it while in force")

    def go_duration(self, seconds: float) -> str:
        return go_duration(seconds)

    def rank_reason(self, fault: ResolvedFault) -> str:
        node = fault.index // self.nproc
        return (f"acts on one process (rank {fault.index}) inside node {node}'s pod; Chaos"
                f" Mesh acts on whole pods (the pod-level fault is node={node}; or pass"
                " --pod-per-rank if every rank has a pod of its own)")




# -- manifests ---------------------------------------------------------------------------

def _object_name(plan: Planned, options: Options, part: int, repeat: int) -> str:
    name = f"{options.name}-f{plan.number}-{plan.fault.kind}"
    if len(plan.chaos) > 1:
        name += f"-{part}"
    if plan.repeats > 1:
        name += f"-r{repeat}"
    return name


def _bare(plan: Planned, options: Options) -> list[dict[str, Any]]:
    """The chaos objects on their own: each says when to apply it, and lasts `duration`."""
    manifests = []
    for repeat in range(plan.repeats):
        start = plan.start + repeat * ((plan.chaos[0].duration or 0.0) + plan.gap)
        for part, chaos in enumerate(plan.chaos):
            spec = copy.deepcopy(chaos.spec)  # no shared objects: YAML would alias them
            if chaos.duration is not None:
                spec["duration"] = go_duration(chaos.duration)
            manifests.append({
                "apiVersion": API_VERSION, "kind": chaos.kind,
                "metadata": {"name": _object_name(plan, options, part, repeat),
                             "namespace": options.namespace,
                             "annotations": {FAULT_ANNOTATION: plan.fault.spec,
                                             START_ANNOTATION: go_duration(start)}},
                "spec": spec})
    return manifests


def _workflow(planned: list[Planned], options: Options) -> dict[str, Any]:
    """One Workflow: a Parallel of one Serial branch per fault, in the order they start."""
    templates: list[dict[str, Any]] = [{"name": "schedule", "templateType": "Parallel",
                                        "children": []}]
    for plan in planned:
        branch = f"f{plan.number}-{plan.fault.kind}"
        steps = []
        if plan.start > 0:
            steps.append(_suspend(f"{branch}-wait", plan.start))
        for repeat in range(plan.repeats):
            if repeat:
                steps.append(_suspend(f"{branch}-gap{repeat}", plan.gap))
            steps += _chaos_step(plan, branch if plan.repeats == 1 else f"{branch}-r{repeat}")
        top = [t for t in steps if not t.pop("_nested", False)]
        templates[0]["children"].append(branch)
        templates.append({"name": branch, "templateType": "Serial",
                          "children": [t["name"] for t in top]})
        templates += steps
    return {"apiVersion": API_VERSION, "kind": "Workflow",
            "metadata": {"name": options.name, "namespace": options.namespace},
            "spec": {"entry": "schedule", "templates": templates}}


def _suspend(name: str, seconds: float) -> dict[str, Any]:
    return {"name": name, "templateType": "Suspend", "deadline": go_duration(seconds)}


def _chaos_step(plan: Planned, name: str) -> list[dict[str, Any]]:
    """The templates of one occurrence of a fault: one chaos node, or a Parallel of them
    (a cut of three sides or more). Nested ones are marked `_nested`."""
    nodes = []
    for part, chaos in enumerate(plan.chaos):
        template: dict[str, Any] = {"name": f"{name}-{part}" if len(plan.chaos) > 1 else
                                    f"{name}-chaos", "templateType": chaos.kind,
                                    EMBED_KEYS[chaos.kind]: copy.deepcopy(chaos.spec)}
        # In a Workflow a chaos lasts its template's deadline (the webhook refuses a
        # duration); without one it stays until the Workflow is deleted.
        deadline = chaos.duration if chaos.duration is not None else chaos.deadline
        if deadline is not None:
            template["deadline"] = go_duration(deadline)
        nodes.append(template)
    if len(nodes) == 1:
        return nodes
    group = {"name": f"{name}-cut", "templateType": "Parallel",
             "children": [t["name"] for t in nodes]}
    return [group, *({**t, "_nested": True} for t in nodes)]


# -- the file `torchchaos export` writes -------------------------------------------------

def render(result: Export, source: Path, options: Options, bare: bool = False) -> str:
    """Multi-document YAML: a header that says what it is and how to use it, then the
    Workflow (or, with `bare`, the chaos objects, each to be applied at its offset)."""
    import yaml

    timing = ("seconds per step from the run's history" if options.step_times is not None
              else f"{options.seconds_per_step:g} s per step"
              if options.seconds_per_step is not None else "steps not timed")
    unit = "rank" if options.pod_per_rank else "node"
    header = [f"# Chaos Mesh manifests ({API_VERSION}) exported by torchchaos from {source}",
              f"# namespace {options.namespace}; a {unit}'s pod is the one labelled"
              f" {options.node_label}=<{unit} index>; {timing}"]
    if bare:
        docs = result.manifests
        header.append(f"# apply each object {START_ANNOTATION} after the job starts;"
                      " it lasts its duration")
    else:
        docs = [result.workflow] if result.workflow else []
        header.append("# kubectl apply -f THIS_FILE as the job starts: each fault waits"
                      " for its offset; kubectl delete -f THIS_FILE ends what is in force")
    header += [f"# not exported: {line}" for line in result.not_exported]
    header += [f"# approximate: {line}" for line in result.approximations]
    if not docs:
        header.append("# nothing to apply: no fault of this schedule has a Chaos Mesh"
                      " counterpart")
    body = yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True, width=100)
    return "\n".join(header) + "\n" + (body if docs else "")
