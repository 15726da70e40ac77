"""Ready-made chaos cases for any training job, placed from its fault-free run.

The `suites/` pytest modules name their cases ("kill rank 0 mid-interval");
this module turns a name into a concrete fault for the user's job. Steps and
file events come from the job's fault-free reference run, through the
planners the CLI uses (`torchchaos.explore.battery.plan`, `torchchaos.explore.crash.points.plan`,
`torchchaos.explore.campaign.plan`), so a name means the same thing for a 20-step toy and
for a 10,000-step job: "mid-interval" lands between two of its checkpoints
wherever they are. pytest parametrizes before anything runs, hence names
first and faults later; a case that cannot apply to the job raises
`NotApplicable` (the test skips with the reason).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from torchchaos.errors import ChaosError, UsageError
from torchchaos.explore import battery, campaign
from torchchaos.explore.crash import points as crashpoints
from torchchaos.explore.rows import Entry
from torchchaos.faults.registry import get_kind
from torchchaos.faults.storage import dir_pairs
from torchchaos.harness.reference import get_reference
from torchchaos.host import netns
from torchchaos.progress import Progress
from torchchaos.rundir.history import Event, History
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import FaultSpec, Pairs, Spec, pairs

PARTITION_SECONDS = 8  # long enough for a job tuned to react (collective timeout) to react
STRAGGLER_STEPS = 5

T = TypeVar("T")


class NotApplicable(Exception):
    """The case does not fit this job (the message says why): its test skips."""


def _quiet(_message: str) -> None:
    pass


class Plan:
    """One job's reference run and the faults planned from it, each computed once per
    session, failures included (a reference that cannot run fails every case fast)."""

    def __init__(self, base: Scenario, cache_dir: Path, progress: Progress = _quiet) -> None:
        self.base = base
        self.cache_dir = cache_dir
        self.progress = progress
        self._memo: dict[str, Any] = {}

    def cached(self, key: str, compute: Callable[[], T]) -> T:
        """compute() the first time `key` is asked for; its value (or its ChaosError)
        every time after."""
        if key not in self._memo:
            try:
                self._memo[key] = compute()
            except ChaosError as exc:
                self._memo[key] = exc
        value = self._memo[key]
        if isinstance(value, ChaosError):
            raise value
        return value

    def fresh_base(self) -> Scenario:
        """The planners may set fields of the scenario they get; never ours."""
        return dataclasses.replace(self.base, env=dict(self.base.env))

    def history(self) -> History:
        return self.cached("history", lambda: get_reference(
            self.fresh_base(), self.cache_dir, self.progress).history())

    def battery(self) -> list[tuple[Entry, FaultSpec]]:
        entries = self.cached("battery", lambda: battery.plan(
            self.fresh_base(), self.cache_dir, self.progress))
        return [(e, e.fault.parse()) for e in entries]

    def crash_points(self, mode: str) -> list[crashpoints.CrashPoint]:
        """The crash points of the 2nd save, started from step 0 (no snapshot: the
        suite's one reference run serves every case)."""
        self.save_events()  # not applicable without a 2nd save
        return self.cached(f"points-{mode}", lambda: crashpoints.plan(
            self.fresh_base(), self.cache_dir, self.progress, save=2, modes=[mode], cap=None,
            from_snapshot=False).points)

    def mid_step(self) -> int:
        """The battery's mid-interval step: between two checkpoints, past the middle."""
        return next(s.trigger.step for _, s in self.battery() if s.trigger.step is not None)

    def writer(self) -> int:
        return self.history().checkpoint_writer()

    def save_events(self, save: int = 2) -> list[Event]:
        """The file events of the writer's `save`-th checkpoint save in the reference."""
        events = [e for e in self.history().of("file") if e.get("save") == save
                  and e["rank"] == self.writer() and e.get("launch", 0) == 0]
        if not events:
            raise NotApplicable(f"the job's fault-free run made no checkpoint save #{save}"
                                " with file events (it saves too rarely, or not through"
                                " files torchchaos sees)")
        return events

    def last_rank(self, why: str) -> int:
        if self.base.world_size < 2:
            raise NotApplicable(f"the job has one rank; {why} needs two or more")
        return self.base.world_size - 1

    def scenario(self, case: str) -> Scenario:
        """The base scenario with the case's fault (and seed) on it."""
        if case not in CASES:
            raise UsageError(f"unknown suite case {case!r} (known: {', '.join(CASES)})")
        entry = CASES[case](self)
        scenario = dataclasses.replace(self.fresh_base(), faults=[entry.fault.parse()])
        if entry.seed is not None:
            scenario.seed = entry.seed
        return scenario


Resolver = Callable[[Plan], Entry]
CASES: dict[str, Resolver] = {}


def case(name: str) -> Callable[[Resolver], Resolver]:
    def register(resolve: Resolver) -> Resolver:
        CASES[name] = resolve
        return resolve
    return register


def _from_battery(plan: Plan, pick: Callable[[FaultSpec], bool], missing: str) -> Entry:
    found = next((entry for entry, spec in plan.battery() if pick(spec)), None)
    if found is None:
        raise NotApplicable(missing)
    return found


def _kill_at_step(rank: int) -> Callable[[FaultSpec], bool]:
    return lambda s: (s.kind == "kill" and s.target_type == "rank" and s.target == str(rank)
                      and s.trigger.step is not None and "signal" not in s.params)


# -- kills -------------------------------------------------------------------------------

@case("kill rank 0 mid-interval")
def _kill_rank_0(plan: Plan) -> Entry:
    return _from_battery(plan, _kill_at_step(0), "the battery planned no kill of rank 0")


@case("kill last rank mid-interval")
def _kill_last_rank(plan: Plan) -> Entry:
    last = plan.last_rank("killing another rank than rank 0")
    return _from_battery(plan, _kill_at_step(last), f"the battery planned no kill of rank {last}")


@case("kill node 0 mid-interval")
def _kill_node_0(plan: Plan) -> Entry:
    return _from_battery(plan, lambda s: s.kind == "kill" and s.target_type == "node",
                         "the battery planned no node kill")


def _kill_in_save(plan: Plan, op: str) -> Entry:
    ops = {e["index"]: e["op"] for e in plan.save_events()}
    return _from_battery(plan, lambda s: s.kind == "kill" and s.trigger.phase is not None
                         and ops.get(s.trigger.event) == op,
                         f"the writer's 2nd checkpoint save has no {op} event")


@case("kill mid-write in 2nd save")
def _kill_mid_write(plan: Plan) -> Entry:
    return _kill_in_save(plan, "write")


@case("kill after rename in 2nd save")
def _kill_after_rename(plan: Plan) -> Entry:
    return _kill_in_save(plan, "rename")


@case("preempt rank 0 with SIGTERM")
def _preempt(plan: Plan) -> Entry:
    return _from_battery(plan, lambda s: s.params.get("signal") == "SIGTERM",
                         "the battery planned no preemption")


# -- storage (the fault filesystem over the checkpoint folder) ---------------------------

def _storage_dir(plan: Plan) -> Pairs:
    """`dir=X` for the folder the 2nd save writes in (`History.checkpoint_dir`), when it
    is not the default `ckpt`; the fault filesystem is mounted there, so a fault
    elsewhere would test nothing. The battery's and the crash points' storage specs
    carry it already."""
    reason = get_kind("storage").unavailable_reason()
    if reason:
        raise NotApplicable(f"storage faults need the fault filesystem: {reason}")
    events = plan.save_events()
    folder = plan.history().checkpoint_dir(2)
    if folder is None:
        tops = sorted({Path(e["path"]).parts[0] for e in events if e.get("path")})
        raise NotApplicable(f"the 2nd save writes outside one folder of the run directory"
                            f" ({', '.join(tops)}); put the checkpoints under"
                            " '{run_dir}/...' in the script's arguments")
    return dir_pairs(folder)


def _first_point(plan: Plan, mode: str, op: str) -> crashpoints.CrashPoint:
    writer = plan.writer()
    point = next((p for p in plan.crash_points(mode)
                  if p.rank == writer and p.event["op"] == op), None)
    if point is None:
        raise NotApplicable(f"the writer's 2nd checkpoint save has no {op} event for {mode}")
    return point


@case("power loss after rename in 2nd save")
def _power_loss_after_rename(plan: Plan) -> Entry:
    _storage_dir(plan)  # not applicable where the fault filesystem has nowhere to go
    return _from_battery(plan, lambda s: s.params.get("mode") == "lose_unsynced",
                         "the writer's 2nd checkpoint save has no rename event")


@case("power loss mid-write in 2nd save")
def _power_loss_mid_write(plan: Plan) -> Entry:
    _storage_dir(plan)
    point = _first_point(plan, "lose_unsynced", "write")
    return Entry(point.name, point.spec(2))


@case("torn write in 2nd save")
def _torn_write(plan: Plan) -> Entry:
    _storage_dir(plan)
    point = _first_point(plan, "torn", "write")
    return Entry(point.name, point.spec(2))


@case("ENOSPC in 2nd save")
def _enospc(plan: Plan) -> Entry:
    where = _storage_dir(plan)
    point = _first_point(plan, "torn", "write")  # armed on the event before the write
    return Entry(f"ENOSPC on rank {point.rank}'s first write of its 2nd save",
                 Spec.make("storage", mode="enospc", rank=point.rank, phase="checkpoint_save",
                         save=2, event=point.event["index"] - 1).plus(where))


@case("bit rot in the newest checkpoint")
def _bit_rot(plan: Plan) -> Entry:
    where, step = _storage_dir(plan), plan.mid_step()
    saved = [e for e in plan.history().of("save_begin") if e.get("after_step", step) < step
             and e.get("launch", 0) == 0]
    if not saved:
        raise NotApplicable(f"no checkpoint is saved before step {step}")
    return Entry(f"bit rot after step {step}",
                 Spec.make("storage", mode="bitrot", bits=64, rank=plan.writer(), step=step)
                 .plus(where))


# -- silent data corruption --------------------------------------------------------------

def _flip(plan: Plan, tensor: str, bit: str) -> Entry:
    """One seeded flip, as a campaign of one picks it (rank, step, element)."""
    return plan.cached(f"flip-{tensor}-{bit}", lambda: campaign.plan(
        plan.fresh_base(), plan.cache_dir, plan.progress, runs=1, seed=plan.base.seed,
        tensors=[tensor], bit_classes=[bit])[0])


@case("flip a weight's exponent bit")
def _flip_weight(plan: Plan) -> Entry:
    return _flip(plan, "param", "exp_high")


@case("flip an optimizer state sign bit")
def _flip_optimizer(plan: Plan) -> Entry:
    return _flip(plan, "optim", "sign")


@case("NaN in the loss")
def _nan_loss(plan: Plan) -> Entry:
    rank, step = plan.base.world_size - 1, plan.mid_step()
    return Entry(f"NaN loss on rank {rank} at step {step}",
                 Spec.make("bitflip", rank=rank, step=step, tensor="loss", value="nan"))


# -- hangs -------------------------------------------------------------------------------

def _hang(plan: Plan, mode: str) -> Entry:
    rank, step = plan.last_rank("a hang someone else notices"), plan.mid_step()
    extra = f",mode={mode}" if mode else ""
    return Entry(f"hang{extra} rank {rank} at step {step}",
                 Spec.make("hang", rank=rank, step=step, mode=mode or None))


@case("stop a rank with SIGSTOP")
def _sigstop(plan: Plan) -> Entry:
    return _hang(plan, "")


@case("hold a rank before a collective")
def _held(plan: Plan) -> Entry:
    return _hang(plan, "collective")


@case("collective order mismatch")
def _mismatch(plan: Plan) -> Entry:
    return _hang(plan, "mismatch")


@case("straggler")
def _straggler(plan: Plan) -> Entry:
    """A rank slowed by about one step's time for a few steps: slower, never hung."""
    rank, step = plan.last_rank("a straggler the others wait for"), plan.mid_step()
    times = [e["t"] for e in plan.history().steps(rank)]
    per_step = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.1
    steps = max(1, min(STRAGGLER_STEPS, plan.history().final_step() - step))
    return Entry(f"straggler rank {rank} from step {step}",
                 Spec.make("straggler", rank=rank, step=step,
                         delay=f"{max(per_step, 0.05):.3f}", steps=steps))


# -- partitions --------------------------------------------------------------------------

def _partition(plan: Plan, shape: str) -> Entry:
    nodes = plan.base.nodes
    if nodes < 2:
        raise NotApplicable(f"partitions need 2+ simulated nodes (the job has {nodes}):"
                            " nodes = 2 under [tool.torchchaos], or --chaos-nodes 2")
    if plan.base.network_kind != "netns":
        raise NotApplicable(netns.unavailable_reason() or "partitions need network = netns")
    target = pairs(node=nodes - 1) if shape == "isolate" else pairs(shape=shape)
    step = plan.mid_step()
    spec = Spec.make("partition", target, step=step, **{"for": PARTITION_SECONDS})
    return Entry(f"partition {'='.join(target[0])} at step {step}", spec)


@case("isolate the last node")
def _isolate(plan: Plan) -> Entry:
    return _partition(plan, "isolate")


@case("cut off the rendezvous store")
def _store(plan: Plan) -> Entry:
    return _partition(plan, "store")
