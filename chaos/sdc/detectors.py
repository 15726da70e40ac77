"""Reference detectors of silent data corruption, small enough to read and copy.

Each one looks at one training step after its backward pass (the gradients are
all-reduced, the weights not yet updated) and says whether it sees a corruption. They
are what teams put in their loops today:

- `loss_spike`: the loss above `factor` times the median of the last `window` losses
  (finite, so NaN and inf count too);
- `grad_z`: the global gradient norm more than `z` standard deviations from the mean
  of the last `window` norms (or non-finite);
- `replica`: every `every` steps the data-parallel replicas compare a hash of their
  weights (an all-gather of 8 bytes each); unequal replicas are a corruption;
- `rerun`: the step's forward and backward are computed again on the same batch and
  the gradients compared bitwise. A transient fault does not happen twice: they differ.
  A defective device computes the same wrong result twice: they agree, and it cannot
  tell (Megatron's rerun state machine reruns on *another* GPU for that reason).

`megatron_rerun` is that state machine itself, from megatron-core (`megatron.py`).

`check` is called by every rank at every step (some detectors run a collective); it
returns this rank's finding, and the trial loop combines the ranks' findings. `action`
is what a job does when the detector fires, for the campaign's table.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from torchchaos.sdc.view import Detector, StepView, same_bits, weights_hash


class LossSpike(Detector):
    name = "loss_spike"

    def __init__(self, factor: float = 3.0, window: int = 8) -> None:
        self.factor = factor
        self.recent: deque[float] = deque(maxlen=window)

    def check(self, view: StepView) -> bool:
        loss = view.loss
        if not math.isfinite(loss):
            return True
        spike = len(self.recent) >= 3 and loss > self.factor * statistics.median(self.recent)
        if not spike:
            self.recent.append(loss)
        return spike

    def describe(self) -> str:
        return f"loss_spike:factor={self.factor:g}"


class GradNormZ(Detector):
    name = "grad_z"

    def __init__(self, z: float = 4.0, window: int = 16) -> None:
        self.z = z
        self.recent: deque[float] = deque(maxlen=window)

    def check(self, view: StepView) -> bool:
        grads = [p.grad for p in view.params if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        if not math.isfinite(norm):
            return True
        odd = False
        if len(self.recent) >= 4:
            mean, spread = statistics.fmean(self.recent), statistics.pstdev(self.recent)
            odd = spread > 0 and abs(norm - mean) > self.z * spread
        if not odd:
            self.recent.append(norm)
        return odd

    def describe(self) -> str:
        return f"grad_z:z={self.z:g}"


class ReplicaChecksum(Detector):
    name = "replica"
    action = "exclude a rank"  # the odd replica is known

    def __init__(self, every: int = 5) -> None:
        self.every = every

    def check(self, view: StepView) -> bool:
        if view.step % self.every:
            return False
        mine = torch.tensor([weights_hash(view.params)], dtype=torch.int64)
        every_rank = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every_rank, mine)
        return len({int(h) for h in every_rank}) > 1

    def describe(self) -> str:
        return f"replica:every={self.every}"


class RerunStep(Detector):
    name = "rerun"

    def check(self, view: StepView) -> bool:
        first = [p.grad.clone() for p in view.params if p.grad is not None]
        _, again = view.rerun()
        return any(not same_bits(a, b) for a, b in zip(first, again, strict=True))


class TargetGuard(Detector):
    """A target's own defence, adapted: `check(step, loss, params) -> reason or None`
    (the bundled target's `SdcGuard`). Collective as the target calls it."""

    name = "target_guard"

    def __init__(self, guard: Any) -> None:
        self.guard = guard

    def check(self, view: StepView) -> bool:
        return self.guard.check(view.step, view.loss, view.params) is not None


BUILTIN: dict[str, type[Detector]] = {
    "loss_spike": LossSpike, "grad_z": GradNormZ, "replica": ReplicaChecksum,
    "rerun": RerunStep,
}
PARAMS = {"loss_spike": {"factor": float, "window": int}, "grad_z": {"z": float, "window": int},
          "replica": {"every": int}, "rerun": {}, "target_guard": {},
          "megatron_rerun": {"spiky": float, "samples": int}}


def parse(spec: str) -> tuple[str, dict[str, Any]]:
    """'replica:every=10' -> ('replica', {'every': 10}); ValueError with the reason."""
    name, _, rest = spec.partition(":")
    if name not in PARAMS:
        raise ValueError(f"unknown detector {name!r} (known: {', '.join(PARAMS)})")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in PARAMS[name]:
            known = ", ".join(f"{k}=" for k in PARAMS[name]) or "none"
            raise ValueError(f"detector {name}: unknown parameter {item!r} (known: {known})")
        try:
            params[key] = PARAMS[name][key](value)
        except ValueError:
            raise ValueError(f"detector {name}: {key}= needs a number, got {value!r}") from None
        if params[key] <= 0:
            raise ValueError(f"detector {name}: {key}= must be above 0, got {value!r}")
    return name, params


# Detectors that live in a package of their own: the package, and how to install it.
PACKAGES = {"megatron_rerun": ("megatron.core", "megatron-core")}


def missing_package(spec: str) -> str | None:
    """Why a detector cannot be made here (its package is not installed), or None."""
    name = parse(spec)[0]
    if name not in PACKAGES:
        return None
    module, package = PACKAGES[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return None if found else (f"detector {name} needs {package}, which is not installed"
                               f" (pip install {package})")


def action_of(name: str) -> str:
    """What a job does when this detector fires, as the table shows it."""
    if name == "megatron_rerun":  # its module imports megatron-core only when one is made
        from torchchaos.sdc import megatron
        return megatron.MegatronRerun.action
    return BUILTIN.get(name, TargetGuard).action


def make(spec: str, target_guard: Any = None) -> Detector:
    name, params = parse(spec)
    if name == "target_guard":
        if target_guard is None:
            raise ValueError("detector target_guard: the trainee brings no guard of its own")
        return TargetGuard(target_guard)
    if name == "megatron_rerun":  # megatron-core is imported only when asked for
        from torchchaos.sdc import megatron
        return megatron.MegatronRerun(**params)
    return BUILTIN[name](**params)
