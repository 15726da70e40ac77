"""The fault-kind contract: everything a kind is and may be asked, in one place.

A kind is a subclass of `FaultKind` in a module of its own, named in
`faults/registry.py` (built in) or by an installed package's `torchchaos.faults`
entry point (a plug-in); the registry imports it the first time its name is
used. Two sides:

- an *agent* kind (`side = "agent"`: kill, crash, raise, oom, dataloader, abort,
  gpu, bitflip, hang, straggler, storage) fires inside the targeted rank:
  `fire(fault, FireContext)` runs in the training process when the trigger is
  reached, and records what it did;
- a *harness* kind (`HarnessKind`: partition, toxic) is applied from outside
  the job: the rank that sees the trigger asks the harness
  (`torchchaos.rundir.requests`), and the runner calls `cut`, which returns the heal.

Every kind declares `name`, `summary`, its `params` (text parsers) and may
check them (`validate`, `check_job`, `check_together`) and prepare the job
(`setup_job`, e.g. a mount). The optional facets tell the rest of the engine
about the kind, so that adding a kind is one file:

    strategies(shape)      how `torchchaos search` draws it (Hypothesis)
    chaos_mesh(fault, job) its Chaos Mesh objects for `torchchaos export`
    marks                  the events the timeline marks where it acted
    said(event)            what a firing did, in words, from its first marks event
    choices                the values some parameters take (help, planners)
    unavailable_reason()   why this machine cannot have it (no FUSE, not root)
    effect_event           the event that proves an armed hook acted

This module runs inside every rank too: it imports nothing heavy (Hypothesis
and torch only inside the methods that need them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from torchchaos.rundir import requests

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape
    from torchchaos.host.netns import Network


class FaultKind:
    """One kind of fault. Subclasses set `name` and `params` and implement `fire`."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    # parameter name -> parser (str -> value); parsers raise ValueError on bad input
    params: ClassVar[dict[str, Callable[[str], object]]] = {}
    side: ClassVar[str] = "agent"  # "agent": fires in a rank; "harness": fired by the runner
    targets: ClassVar[tuple[str, ...]] = ("rank", "node")  # what `rank=` / `node=` it accepts
    # A kind whose firing only arms a hook names the event it records once the hook
    # acted: the fault counts as fired when that event (with the fault's id) is there.
    effect_event: ClassVar[str | None] = None

    # -- optional facets: what the engine asks of a kind beside firing it ----------------
    # The values some parameters accept, for help texts and planners (campaign).
    choices: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Events this kind records where it acted; the timeline marks each on its rank's lane.
    marks: ClassVar[tuple[str, ...]] = ()
    # Why no fault of this kind has a Chaos Mesh counterpart, where one reason holds for
    # all of them: `chaos_mesh` refuses with it. A kind whose answer depends on the fault
    # (its mode, its target) overrides `chaos_mesh` instead.
    not_on_a_cluster: ClassVar[str] = ""

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        """How a search draws this kind: search names (`torchchaos search --kind NAME`) to
        Hypothesis strategies of spec strings for a job of `shape` (its ranks, nodes,
        steps and saves, with strategies for each: `torchchaos.faults.shape.JobShape`);
        None for a name this job cannot have (a node kill with one node). Import
        Hypothesis inside: ranks import the kinds too."""
        return {}

    def said(self, event: dict[str, Any]) -> str:
        """What a firing did, in words, from the first of its `marks` events (the report's
        faults line: "killed by the kernel's OOM killer, ..."); "" says nothing more."""
        return ""

    def chaos_mesh(self, fault: ResolvedFault, job: ClusterJob) -> ClusterMapping:
        """This fault as Chaos Mesh objects on the job's pods (`torchchaos export`), and
        what differs from torchchaos's own fault ("" if nothing); raise NotExported
        with the reason where a cluster has no counterpart."""
        raise NotExported(self.not_on_a_cluster
                          or f"no Chaos Mesh counterpart for the {self.name} kind")

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this machine cannot have this kind at all (no /dev/fuse, not root), or
        None. Planners leave such kinds out; `check_job` refuses a run that
        needs it."""
        return None

    def validate(self, params: dict[str, object]) -> None:
        """Check the combination of parameters; raise UsageError if it makes no sense."""

    def check_job(self, params: dict[str, object], nodes: int, network: str) -> None:
        """Raise UsageError if a job of `nodes` simulated nodes on `network` ("netns"
        or "host") cannot have this fault."""

    def check_together(self, faults: list[dict[str, object]]) -> None:
        """Raise UsageError if these faults of this kind (their params) cannot share one
        job (e.g. storage: one mount per folder, and mounts cannot nest)."""

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        """Inject the fault from inside the rank (agent kinds)."""
        raise NotImplementedError

    def carry(self, fault: ResolvedFault, note: dict[str, Any], ctx: FireContext) -> None:
        """In a starting rank: a lasting effect this kind wrote down when `fault` fired
        (`note`, under `RunLayout.lasting_dir`). Carry it if it lasts where this process
        runs (a defect of this device); by default a kind's effects do not last."""

    def fire_after_step(self, fault: ResolvedFault) -> int | None:
        """For `step=N`: after which completed step to fire. A fault that acts during
        step N (it hooks the next forward or backward) fires after step N - 1."""
        return fault.trigger.step

    def setup_job(self, faults: list[ResolvedFault], ctx: JobContext) -> JobResource:
        """Prepare what this kind's faults need during a job (called with this kind's
        faults only, before the first launch); the runner closes it after the job."""
        return NoResource()


class HarnessKind(FaultKind):
    """A kind the runner applies from outside the job (`torchchaos.harness.nemesis`): the rank that
    sees the trigger asks for it; `cut` makes it and returns how to heal it."""

    side = "harness"
    targets = ("node",)
    # fired once the harness put it in force: a rank's request alone is no effect (a
    # server that refused the toxic, rules that could not be added)
    effect_event = "nemesis_begin"

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        if not requests.request(ctx.run_dir, fault.id, ctx.step()):
            ctx.record("fault_error", id=fault.id,
                       error=f"the harness did not apply it within {requests.ACK_TIMEOUT:g} s")

    def cut(self, fault: ResolvedFault, ctx: JobContext
            ) -> tuple[Callable[[], None], dict[str, Any]]:
        """Put the fault in force; returns its heal (safe to call twice) and what to
        record about it."""
        raise NotImplementedError


@dataclass(frozen=True)
class ResolvedFault:
    id: str  # unique within the run; names the fault's "fired" marker file
    kind: str
    target_type: str  # "rank" or "node"
    index: int
    trigger: Trigger
    params: dict[str, object]
    spec: str
    seed: int  # for probabilistic triggers

    def describe(self) -> str:
        return f"{self.kind}:{self.target_type}={self.index},{self.trigger.describe()}"

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["trigger"] = asdict(self.trigger)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ResolvedFault:
        fields = dict(data)
        fields["trigger"] = Trigger(**fields["trigger"])
        return cls(**fields)


@dataclass(frozen=True)
class Trigger:
    """When a fault fires. Exactly one of step / phase / time / p is set."""

    step: int | None = None
    phase: str | None = None
    event: int = 1  # N-th file event of the phase (1-based)
    save: int = 1  # K-th checkpoint save / load of the process (1-based)
    time: float | None = None  # seconds after the job started
    p: float | None = None  # probability per step

    def describe(self) -> str:
        if self.step is not None:
            return f"step={self.step}"
        if self.phase is not None:
            return f"phase={self.phase},save={self.save},event={self.event}"
        if self.time is not None:
            return f"time={self.time:g}"
        return f"p={self.p:g}"


@dataclass
class FireContext:
    """What a firing fault may use inside the rank it fires in."""

    rank: int
    local_rank: int
    node: int
    record: Callable[..., None]  # write an event to this rank's history
    path: str | None = None  # the file of the event that triggered a phase fault
    run_dir: str = ""
    training: TrainingView | None = None

    def step(self) -> int | None:
        """Optimizer steps this rank has completed (None without a view of training)."""
        return self.training.step() if self.training is not None else None


class TrainingView(Protocol):
    """The training state of a rank, as the agent sees it (for faults that corrupt it)."""

    def step(self) -> int:
        """Optimizer steps completed (global numbering)."""

    def named_parameters(self) -> list[tuple[str, Any]]:
        """Every parameter an optimizer holds, named after the module it belongs to."""

    def optimizers(self) -> list[Any]: ...

    def named_modules(self) -> list[tuple[str, Any]]:
        """Every module under the modules the target ran forward on."""

    def before_next_backward(self, change: Callable[[Any], Any]) -> None:
        """Call `change(loss)` once, at the next `loss.backward()`; what it returns
        (if not None) is passed to backward as the gradient of the loss."""

    def after_every_step(self, action: Callable[[int], bool]) -> None:
        """Call `action(step)` after every optimizer step of this rank from now on,
        until it returns False."""


@dataclass
class JobContext:
    """What a kind may use to set up for one job (a chaos run)."""

    run_dir: Path
    run_id: str  # the marker every process of the run carries
    network: Network | None = None  # the simulated nodes' namespaces (`--network netns`)
    store_port: int | None = None  # the rendezvous store's port on node 0
    resources: dict[str, JobResource] = field(default_factory=dict)  # by kind, once set up
    # node K's processes now (its torchrun agent and everything under it), for kinds
    # that act on a whole node from outside (a freeze); None outside a runner
    node_pids: Callable[[int], list[int]] | None = None


class JobResource(Protocol):
    """Something a kind sets up for a whole job (a mount) and tears down after it."""

    environ: dict[str, str]  # added to every rank's environment
    # where nodes 1.. reach the rendezvous store instead of node 0 (a proxy), if anywhere
    rendezvous_endpoint: str | None

    def settle(self) -> None:
        """Before a relaunch: wait until pending fault work (a crash) is done."""

    def close(self) -> None:
        """Heal and tear down; called on every exit path, safe to call twice."""


@dataclass
class NoResource:
    environ: dict[str, str] = field(default_factory=dict)
    rendezvous_endpoint: str | None = None

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass


class ClusterJob(Protocol):
    """How the job's nodes and ranks are pods, for `FaultKind.chaos_mesh`
    (`torchchaos.scenario.chaosmesh` implements it from the export's options)."""

    nproc: int
    nodes: int

    def node_pods(self, node: int) -> list[str]:
        """Label values of node `node`'s pods."""

    def pods_of(self, fault: ResolvedFault) -> list[str] | None:
        """The pods a fault's target is, or None for a rank that shares its pod."""

    def host_pods(self, fault: ResolvedFault) -> list[str]:
        """The pods whose volume a fault's target writes to (a rank: its own pod)."""

    def selector(self, values: list[str]) -> dict[str, Any]:
        """A Chaos Mesh selector of these pods."""

    def rank_reason(self, fault: ResolvedFault) -> str:
        """Why a fault on one rank that shares its pod cannot be exported."""

    def io_base(self, fault: ResolvedFault) -> dict[str, Any]:
        """The IOChaos spec's common part for the volume the fault's target writes to."""

    def read_mistake(self, fault: ResolvedFault, bits: int) -> ClusterMapping:
        """Random bytes returned to reads of the checkpoint volume (bit rot)."""

    def go_duration(self, seconds: float) -> str:
        """Seconds as a Go duration ("1m30s"), the form Chaos Mesh reads."""


@dataclass
class ClusterChaos:
    """One Chaos Mesh object a fault becomes: its kind (PodChaos, NetworkChaos, IOChaos),
    its spec without the duration, and the duration."""

    kind: str
    spec: dict[str, Any]
    duration: float | None = None  # seconds; None: in force until deleted (or one-shot)
    deadline: float | None = None  # a one-shot chaos's time in a Workflow


# The Chaos Mesh objects of a fault and what differs from torchchaos's own ("" if nothing).
ClusterMapping = tuple[list[ClusterChaos], str]


class NotExported(Exception):
    """A fault without a Chaos Mesh counterpart; the message says why."""
