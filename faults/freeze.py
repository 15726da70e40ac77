"""freeze: a whole simulated node stops running for a while, then goes on.

A frozen node is not a dead one: a paused VM, a kernel stalled on a device, a machine
swapping to a standstill. Its processes keep every socket and every byte of state,
answer nothing, and resume where they were. The other nodes see a peer that is silent
inside a collective: a job whose collective timeout is shorter than the freeze fails
over (restart, resume), one with a longer timeout waits and goes on.

How (the node `node=K`, default a seeded pick, for `for=S` seconds, `flaps=`/`gap=` as
for partitions):
- container nodes (`--network docker`): `docker pause` of the node's container, whose
  cgroups the node's processes joined when they started (`torchchaos.host.docker.nodes`);
- namespace nodes (`--network netns`): the node's processes moved into a freezer cgroup
  of the run's own, `torchchaos-<run id>/node-K`, and frozen.

Both are the kernel's cgroup freezer, invisible to the frozen processes (SIGSTOP would be
seen by their parents). The fault is in force only once the kernel says the group is
frozen and every process of the node is in it; else the run cannot be judged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchchaos.errors import UsageError
from torchchaos.faults.contract import (
    ClusterChaos,
    ClusterJob,
    ClusterMapping,
    HarnessKind,
    JobContext,
    JobResource,
    ResolvedFault,
)
from torchchaos.faults.params import positive_int, seconds
from torchchaos.host import cgroups, freezer
from torchchaos.host.netns import NODE_NETWORKS


class Freeze(HarnessKind):
    name = "freeze"
    summary = ("a whole simulated node stops for for= seconds and goes on (docker pause of its"
               " container, or a freezer cgroup on namespace nodes)")
    params = {"for": seconds, "flaps": positive_int, "gap": seconds}

    def validate(self, params: dict[str, object]) -> None:
        if "for" not in params:
            raise UsageError("freeze needs for= (how long the node stays frozen; a node"
                             " that never comes back is a kill)")

    def chaos_mesh(self, fault: ResolvedFault, job: ClusterJob) -> ClusterMapping:
        duration = float(fault.params["for"])  # type: ignore[arg-type]
        spec = {"action": "pod-failure", "mode": "all",
                "selector": job.selector(job.node_pods(fault.index))}
        return [ClusterChaos("PodChaos", spec, duration)], (
            "pod-failure makes the node's pods unavailable for the duration; unlike a freeze"
            " their processes are restarted, not resumed")

    def setup_job(self, faults: list[ResolvedFault], ctx: JobContext) -> JobResource:
        return RunGroups(ctx.run_id)

    def check_job(self, params: dict[str, object], nodes: int, network: str) -> None:
        if network not in NODE_NETWORKS:
            raise UsageError("freeze needs --network netns or docker (a node of its own to"
                             " freeze; root)")
        if freezer.root() is None:
            raise UsageError("freeze needs the cgroup freezer (/sys/fs/cgroup/freezer or"
                             " cgroup v2), which this machine does not mount")

    def cut(self, fault: ResolvedFault, ctx: JobContext
            ) -> tuple[Callable[[], None], dict[str, Any]]:
        assert ctx.network is not None and ctx.node_pids is not None  # check_job, runner
        index = fault.index
        pids = ctx.node_pids(index)
        if not pids:
            raise RuntimeError(f"node {index} has no process to freeze (it has exited)")
        network: Any = ctx.network
        if hasattr(network, "pause"):  # container nodes
            group, how = _pause_container(network, index), "docker pause"

            def heal() -> None:
                network.unpause(index)
        else:
            group, how = _run_group(ctx.run_id, index), "freezer cgroup"
            freezer.freeze(group, pids)

            def heal() -> None:
                freezer.thaw(group)
        try:
            _confirm(group, index, ctx.node_pids)
        except BaseException:
            heal()
            raise
        return heal, {"node": index, "how": how, "processes": len(pids)}


def _pause_container(network: Any, index: int) -> Path:
    group = network.pause(index)
    if not network.is_paused(index):
        network.unpause(index)
        raise RuntimeError(f"docker does not say node {index}'s container is paused")
    return group


def _run_group(run_id: str, index: int) -> Path:
    """The run's freezer group for node `index` (made now; removed with the run's other
    cgroups by the lifeline's sweep if the harness dies)."""
    root = freezer.root()
    assert root is not None  # check_job
    group = cgroups.create_run_group(root, run_id) / f"node-{index}"
    group.mkdir(exist_ok=True)
    return group


def _confirm(group: Path, index: int, node_pids: Callable[[int], list[int]]) -> None:
    """In force only if the kernel says frozen and holds every process of the node, also
    one forked while the group froze (moved in now: it freezes on arrival)."""
    for pid in set(node_pids(index)) - freezer.members(group):
        freezer.join(group, pid)
    outside = set(node_pids(index)) - freezer.members(group)
    if not freezer.is_frozen(group) or outside:
        raise RuntimeError(f"node {index} is not frozen: the group {group} says"
                           f" {'frozen' if freezer.is_frozen(group) else 'not frozen'},"
                           f" processes outside it: {sorted(outside)[:5]}")


class RunGroups:
    """The run's freezer groups (namespace nodes), thawed and removed when the job ends."""

    environ: dict[str, str] = {}
    rendezvous_endpoint = None

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def settle(self) -> None:
        pass

    def close(self) -> None:
        root = freezer.root()
        if root is None:
            return
        group = cgroups.run_group(root, self.run_id)
        if group.is_dir():
            freezer.thaw(group)
            cgroups.remove(group, wait=10.0)  # else the lifeline's sweep removes it
