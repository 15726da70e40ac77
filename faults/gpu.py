"""gpu: a GPU error in a rank (needs CUDA).

- `error=assert`: a device-side assert, made by indexing a CUDA tensor out of
  its bounds (`tensor[index]` with an index past its end). The error is
  sticky: the CUDA context is broken, and every later CUDA call of the
  process fails with "device-side assert triggered", as after an
  uncorrectable ECC error or a kernel's out-of-bounds access;
- `error=oom`: one allocation of twice the device's memory, so the caching
  allocator raises the real `torch.cuda.OutOfMemoryError` out of the step;
- `error=hang`: a kernel that spins for `for=` seconds (default an hour) is
  queued on the current stream (`torch.cuda._sleep`), as `hang:mode=spin`.

On a machine without a CUDA device the kind is refused, in one line, before
anything runs.
"""

from __future__ import annotations

import glob
from typing import TYPE_CHECKING, Any

from torchchaos.errors import Unavailable, UsageError
from torchchaos.faults.contract import FaultKind, FireContext, ResolvedFault
from torchchaos.faults.params import choice, seconds

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

ERRORS = ("assert", "oom", "hang")
SPIN_SECONDS = 3600.0


class GpuError(FaultKind):
    name = "gpu"
    summary = ("a GPU error in a rank: a sticky device-side assert, a CUDA out-of-memory"
               " error, or a kernel that never ends (needs CUDA)")
    not_on_a_cluster = "a CUDA error inside the training process; Chaos Mesh has no GPU fault"
    targets = ("rank",)
    params = {"error": choice(ERRORS), "for": seconds}
    choices = {"error": ERRORS}
    marks = ("gpu_error",)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        # the device files, not torch: the harness does not import torch to plan a run
        if not glob.glob("/dev/nvidia[0-9]*"):
            return "needs a CUDA device (no /dev/nvidia* on this machine)"
        return None

    def check_job(self, params: dict[str, object], nodes: int, network: str) -> None:
        why = self.unavailable_reason()
        if why:
            raise Unavailable(f"fault kind gpu {why}")

    def validate(self, params: dict[str, object]) -> None:
        if "for" in params and params.get("error") != "hang":
            raise UsageError("gpu for= applies to error=hang only")

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        from hypothesis import strategies as st

        if self.unavailable_reason():  # a search on a machine without a GPU leaves it out
            return {"gpu": None}
        return {"gpu": st.builds(lambda r, s, e: f"gpu:rank={r},step={s},error={e}",
                                 shape.a_rank(), shape.a_step(), st.sampled_from(list(ERRORS)))}

    def said(self, event: dict[str, Any]) -> str:
        return {"assert": "a device-side assert (sticky: every later CUDA call fails)",
                "oom": "CUDA out of memory", "hang": "a kernel that never ends"}.get(
                    str(event.get("error")), "") + f" on {event.get('device')}"

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        import torch

        error = str(fault.params.get("error", "assert"))
        step = ctx.step()
        if not torch.cuda.is_available():
            ctx.record("fault_error", id=fault.id, error="gpu: this rank sees no CUDA device")
            return
        device = torch.device("cuda", torch.cuda.current_device())
        ctx.record("gpu_error", id=fault.id, error=error, device=str(device), step=step)
        if error == "assert":
            data = torch.zeros(4, device=device)
            index = torch.tensor([1 << 30], device=device)
            data[index].sum().item()  # the kernel asserts; .item() waits and raises
        elif error == "oom":
            _free, total = torch.cuda.mem_get_info(device)
            torch.empty(2 * total, dtype=torch.uint8, device=device)
        else:
            khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 2_000_000)
            held = float(fault.params.get("for", SPIN_SECONDS))  # type: ignore[arg-type]
            ctx.record("hang_begin", id=fault.id, mode="gpu", device=str(device),
                       seconds=held, step=step)
            torch.cuda._sleep(int(held * khz * 1000))
