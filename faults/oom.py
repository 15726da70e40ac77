"""oom: a rank runs out of memory.

- `mode=kill` (default): the rank is moved into a memory cgroup of its own
  with a limit of `limit=` MiB (default 64) above nothing, swap off, and
  allocates tensors until the limit is reached: the kernel's OOM killer
  kills it (SIGKILL, "Memory cgroup out of memory" in the kernel log), as
  it kills a rank of a real job, and nothing else on the machine feels it.
  The run's cgroups (`torchchaos.host.cgroups`) are made before the first
  launch and removed after the job, or by the lifeline if the harness dies.
  Where no cgroup is writable (not root, no memory controller) the limit is
  the rank's address space (`RLIMIT_AS`) instead: the allocation fails and
  the rank meets the allocator's error, not the kernel; the `oom` event says
  which happened.
- `mode=raise`: one allocation larger than the device has is made where the
  model's parameters live, so the real allocator error is raised out of the
  step: `torch.cuda.OutOfMemoryError` on a GPU; on CPU, torch's
  `DefaultCPUAllocator: can't allocate memory` (a RuntimeError). Where the
  kernel would grant it anyway (`vm.overcommit_memory=1`), the address-space
  limit makes it fail.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchchaos import env
from torchchaos.faults.contract import (
    FaultKind,
    FireContext,
    JobContext,
    JobResource,
    NoResource,
    ResolvedFault,
)
from torchchaos.faults.params import choice, positive_int
from torchchaos.host import cgroups
from torchchaos.rundir.layout import RunLayout

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

MODES = ("kill", "raise")
DEFAULT_LIMIT_MIB = 64
CHUNK_BYTES = 16 << 20  # what each allocation on the way to the limit asks for


class OutOfMemory(FaultKind):
    name = "oom"
    summary = ("a rank runs out of memory: killed by the kernel's OOM killer under a cgroup"
               " limit of its own, or an allocation that fails with the allocator's error")
    not_on_a_cluster = ("an out-of-memory kill of one rank; Chaos Mesh's StressChaos fills a "
                        "pod's memory from outside, which is another fault (the pod's limit, "
                        "every rank of it)")
    targets = ("rank",)
    params = {"mode": choice(MODES), "limit": positive_int}
    choices = {"mode": MODES}
    marks = ("oom",)

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        from hypothesis import strategies as st

        return {"oom": st.builds(lambda r, s, m: f"oom:rank={r},step={s},mode={m}",
                                 shape.a_rank(), shape.a_step(), st.sampled_from(list(MODES)))}

    def said(self, event: dict[str, Any]) -> str:
        if event.get("mode") == "raise":
            return (f"out of memory: an allocation of {event.get('bytes', 0) >> 20} MiB on"
                    f" {event.get('device')} failed with the allocator's error")
        limit = f"{int(event.get('limit', 0)) >> 20} MiB"
        if event.get("by") == "cgroup":
            return f"out of memory: killed by the kernel's OOM killer at its own {limit} limit"
        return f"out of memory: allocations failed at a {limit} address-space limit (no cgroup)"

    def setup_job(self, faults: list[ResolvedFault], ctx: JobContext) -> JobResource:
        root = cgroups.memory_root()
        if root is None or not any(f.params.get("mode", "kill") == "kill" for f in faults):
            return NoResource()
        return RunCgroup(cgroups.create_run_group(root, ctx.run_id),
                         RunLayout(ctx.run_dir).logs_dir / "kernel.log")

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        step = ctx.step()
        if fault.params.get("mode", "kill") == "raise":
            _fail_one_allocation(fault, ctx, step)
            return
        limit = int(fault.params.get("limit", DEFAULT_LIMIT_MIB)) << 20  # type: ignore[call-overload]
        group = os.environ.get(env.OOM_CGROUP)
        if group:
            child = cgroups.confine(Path(group), f"rank-{ctx.rank}-{os.getpid()}", limit,
                                    os.getpid())
            ctx.record("oom", id=fault.id, mode="kill", by="cgroup", limit=limit,
                       cgroup=str(child), step=step)
        else:
            _limit_address_space(limit)
            ctx.record("oom", id=fault.id, mode="kill", by="rlimit", limit=limit, step=step,
                       note="no writable memory cgroup: the allocation fails instead of the"
                            " kernel killing the rank")
        _allocate_until_stopped()


@dataclass
class RunCgroup:
    """The run's cgroup folder, removed when the job ends; what the kernel's OOM killer
    said of its ranks is kept in the run's logs (`_chaos/logs/kernel.log`), where an
    incident import of the run finds it as it finds a real job's."""

    group: Path
    kernel_log: Path
    environ: dict[str, str] = field(default_factory=dict)
    rendezvous_endpoint: str | None = None

    def __post_init__(self) -> None:
        self.environ = {env.OOM_CGROUP: str(self.group)}

    def settle(self) -> None:
        pass

    def close(self) -> None:
        if self.group.is_dir():
            # the folder's name holds the run id: no other run's report names it
            said = cgroups.oom_reports(cgroups.kernel_log(), self.group)
            if said:
                self.kernel_log.parent.mkdir(parents=True, exist_ok=True)
                self.kernel_log.write_text("\n".join(said) + "\n")
        # the ranks are reaped by now; one killed a moment ago may still count (a zombie)
        cgroups.remove(self.group, wait=10.0)  # else the lifeline's sweep removes it


def _allocate_until_stopped() -> None:
    """Real tensors, touched page by page, until the kernel or the allocator says no."""
    import torch

    kept: list[Any] = []
    while True:
        kept.append(torch.ones(CHUNK_BYTES // 4))


def _limit_address_space(extra: int) -> None:
    """Cap this process's address space `extra` bytes above what it has mapped now."""
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, hard))


def _fail_one_allocation(fault: ResolvedFault, ctx: FireContext, step: int | None) -> None:
    import torch

    device = _parameters_device(ctx)
    if device.type == "cuda":
        _free, total = torch.cuda.mem_get_info(device)
        ask = total * 2
    else:
        ask = 4 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    ctx.record("oom", id=fault.id, mode="raise", device=str(device), bytes=ask, step=step)
    before = resource.getrlimit(resource.RLIMIT_AS)
    if device.type == "cpu" and _overcommits():
        _limit_address_space(ask // 2)
    try:
        torch.empty(ask, dtype=torch.uint8, device=device)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, before)
    raise RuntimeError(f"oom:mode=raise: {ask} bytes on {device} were granted")


def _parameters_device(ctx: FireContext) -> Any:
    import torch

    params = ctx.training.named_parameters() if ctx.training is not None else []
    return params[0][1].device if params else torch.device("cpu")


def _overcommits() -> bool:
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() == "1"
    except OSError:
        return False
