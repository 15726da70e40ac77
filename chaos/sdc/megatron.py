"""Megatron-Core's rerun state machine, scored as a detector: the field's public one.

Megatron validates a step's results through `RerunStateMachine.validate_result`: the
loss NaN or Inf (fatal), the loss 10 times the largest of its first 100 values (a
"spiky loss", not fatal), and the same for the gradient norm. A rejected result makes
the machine run the step again in place. A result that does not come back was a
transient fault, and the job stops; one that comes back the same needs a third run on
*another* GPU to tell a defective device from a correct but surprising result, so the
job checkpoints and exits to be resumed elsewhere. That last run needs a new job on a
new device, which a trial in memory cannot be: what is scored here is the detection
and the first rerun's decision, recorded per trial as what the job did next.

The machine is Megatron's own (megatron-core from the package registry, its state
machine, rejection functions and comparison unchanged), driven from the trial loop as
Megatron's training loop drives it: `should_run_forward_backward` around the step,
`validate_result` on its results, `should_checkpoint_and_exit` at the end. Two
differences, both said in the campaign's notes: the step is already computed when the
detector is asked (the first `should_run_forward_backward` only opens the machine), and
the gradient norm checked is the all-reduced one (torch's DDP reduces inside backward;
Megatron checks each rank's local norm before its own reduction).

On a machine without CUDA the machine needs three things a CPU build of torch lacks:
it all-reduces its flags in CUDA tensors, saves the CUDA RNG state, and asks for the
current device's index. A subclass all-reduces on CPU and saves the CPU generators only
(the trial loop seeds every step anyway), and the device index reads as the local rank
while the machine runs. With CUDA, Megatron's class runs as it is.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import warnings
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from torchchaos.sdc.view import Detector, StepView

# What the first rerun decided, as the job goes on (Megatron's exit codes 16 and 17).
RESUME_ELSEWHERE = "checkpoint, resume on another GPU"
STOP_TRANSIENT = "stop: not reproducible (transient)"
GO_ON = "go on (not fatal)"


@functools.cache
def _module() -> Any:
    """megatron-core's rerun state machine module, imported (and quieted) once."""
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
        warnings.simplefilter("ignore")
        from megatron.core import rerun_state_machine
    logging.getLogger(rerun_state_machine.__name__).setLevel(logging.CRITICAL)
    return rerun_state_machine


def _machine_class(rsm: Any) -> Any:
    if torch.cuda.is_available():
        return rsm.RerunStateMachine

    class OnCpu(rsm.RerunStateMachine):
        def _reduce_any(self, value: Any) -> Any:
            flags = torch.tensor(value if isinstance(value, list) else [value],
                                 dtype=torch.int32)
            dist.all_reduce(flags)
            found = tuple(x > 0 for x in flags.tolist())
            return found if isinstance(value, list) else found[0]

        def _save_state(self) -> None:
            self.saved_state = {"rng_state": {"random": random.getstate(),
                                              "numpy": np.random.get_state(),
                                              "torch": torch.get_rng_state()},
                                "other_state": None}

        def _restore_state(self) -> None:
            saved = self.saved_state["rng_state"]
            random.setstate(saved["random"])
            np.random.set_state(saved["numpy"])
            torch.set_rng_state(saved["torch"])

    return OnCpu


@contextlib.contextmanager
def _device_index() -> Iterator[None]:
    """The machine's `torch.cuda.current_device()` on a CPU build: the local rank."""
    if torch.cuda.is_available():
        yield
        return
    before = torch.cuda.current_device
    torch.cuda.current_device = lambda: int(os.environ.get("LOCAL_RANK", "0"))  # type: ignore
    try:
        yield
    finally:
        torch.cuda.current_device = before  # type: ignore[assignment]


def _grad_norm(grads: list[torch.Tensor | None]) -> torch.Tensor:
    norms = [torch.linalg.vector_norm(g.detach()) for g in grads if g is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


class MegatronRerun(Detector):
    name = "megatron_rerun"
    action = "Megatron decides per trial"  # see `decision`

    def __init__(self, spiky: float = 10.0, samples: int = 100) -> None:
        rsm = _module()  # (not kept on the instance: the trial loop deep-copies detectors)
        self.machine = _machine_class(rsm)(mode=rsm.RerunMode.VALIDATE_RESULTS)
        self.spiky, self.samples = spiky, samples
        self.decision: str | None = None

    def _validate(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Megatron's checks of a step's results, as its training loop and its DDP's
        gradient buffers call them."""
        m = self.machine
        large = partial(m.is_unexpectedly_large, threshold=self.spiky,
                        num_samples=self.samples)
        m.validate_result(loss, torch.isnan, "found NaN in local forward loss calculation",
                          tolerance=0.0, fatal=True)
        m.validate_result(loss, torch.isinf, "found Inf in local forward loss calculation",
                          tolerance=0.0, fatal=True)
        m.validate_result(loss, partial(large, context="loss"), "Spiky loss",
                          tolerance=0.0, fatal=False)
        m.validate_result(grad_norm, torch.isnan, "found NaN in grad norm",
                          tolerance=0.001, fatal=True)
        m.validate_result(grad_norm, torch.isinf, "found Inf in grad norm",
                          tolerance=0.001, fatal=True)
        m.validate_result(grad_norm, partial(large, context="grads"),
                          "found unexpected large grads", tolerance=0.001, fatal=False)

    def check(self, view: StepView) -> bool:
        m = self.machine
        self.decision = None
        reran = False
        with _device_index():
            m.should_run_forward_backward(None)  # opens the initial run (already computed)
            self._validate(torch.tensor(view.loss), _grad_norm([p.grad for p in view.params]))
            while m.should_run_forward_backward(None):  # Megatron asks for the step again
                reran = True
                loss, grads = view.rerun()
                self._validate(torch.tensor(loss), _grad_norm(grads))
            _, stop, code = m.should_checkpoint_and_exit()
        if not reran:
            return False
        rsm = _module()
        self.decision = GO_ON if not stop else (
            RESUME_ELSEWHERE if code == rsm.EXIT_CODE_RESUME_TO_DISAMBIGUATE
            else STOP_TRANSIENT)
        if stop:  # the job exits here; the one resumed from its checkpoint watches on
            m.state = rsm.RerunState.NOT_RUNNING_YET
        return True

    def describe(self) -> str:
        return f"megatron_rerun:spiky={self.spiky:g},samples={self.samples}"
