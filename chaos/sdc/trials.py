"""Many SDC trials in one launch: each rank of a real torchrun job runs them in lockstep.

A chaos run per trial costs a whole job (about 4.5 s on 2 cores); a detection
probability with an interval that means something needs hundreds of trials per cell.
A trial that needs no restart does not need a new job: this loop trains a few warm-up
steps, keeps the state in memory (weights, optimizer state, each detector's history),
runs the fault-free steps once as the reference, and then for each trial restores the
state, injects the trial's fault on its rank, runs the same steps with every detector
watching, compares the weights after each step with the reference's (bitwise: equal
all along means the fault was masked) and restores again. The training is the
trainee's own (real DDP on gloo, its model, its optimizer, its batches); every step is
seeded by its number, so a clean trial repeats the reference bit for bit.

Run by `torchchaos detectors` as `torchrun ... -m torchchaos.sdc.trials CONFIG`; rank 0
writes one JSON line per trial to `trials.jsonl` and the costs to `costs.json`.

A trainee is a Python file with a `build(rank, world)` function that returns a `Trainee`,
or the same parts by name in a dict or an object, so that it need not import torchchaos
(the bundled one: `targets/sdc_trainee.py`).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from torchchaos.faults import bits, miscompute
from torchchaos.faults.contract import FireContext, ResolvedFault, Trigger
from torchchaos.sdc import detectors as detector_kinds
from torchchaos.sdc.models import CLEAN, MODELS, Trial, plan
from torchchaos.sdc.view import StepView, weights_hash


@dataclass
class Trainee:
    """What a trainee file's `build` returns: its training, one step at a time."""

    model: torch.nn.Module  # DDP-wrapped where the job is data-parallel
    optimizer: torch.optim.Optimizer
    batch: Callable[[int], Any]  # the batch of a step number (the same every time)
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]
    guard: Any = None  # the trainee's own defence: check(step, loss, params) -> reason|None
    params: list[torch.Tensor] = field(default_factory=list)  # default: the model's


def load_trainee(spec: str, rank: int, world: int) -> Trainee:
    """'path/file.py[:function]' built on this rank (the file's folder on sys.path, as
    torchrun gives a script its own)."""
    path, _, function = spec.partition(":")
    sys.path.insert(0, str(Path(path).resolve().parent))
    module_spec = importlib.util.spec_from_file_location("torchchaos_trainee", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    parts = getattr(module, function or "build")(rank, world)
    if isinstance(parts, Trainee):
        trainee = parts
    else:  # a dict or an object: a trainee file need not import torchchaos
        get = parts.get if isinstance(parts, dict) else lambda k, d=None: getattr(parts, k, d)
        trainee = Trainee(model=get("model"), optimizer=get("optimizer"), batch=get("batch"),
                          loss=get("loss"), guard=get("guard"), params=get("params") or [])
    if not trainee.params:
        trainee.params = [p for p in trainee.model.parameters() if p.requires_grad]
    return trainee


def seed_step(step: int) -> None:
    """Every RNG a trainee may use, from the step number alone."""
    torch.manual_seed(1_000_003 * step + 7)
    np.random.seed(step % 2**32)
    random.seed(step)


def rerun_step(t: Trainee, number: int, batch: Any) -> tuple[float, list[torch.Tensor]]:
    """Step `number`'s loss and gradients computed again on the same batch (the second
    look of the `rerun` detectors), the first gradients put back: a detector watches,
    the step goes on with what it computed first."""
    first = [p.grad for p in t.params]
    for p in t.params:
        p.grad = None
    seed_step(number)
    loss = t.loss(t.model, batch)
    loss.backward()
    again = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in t.params]
    for p, g in zip(t.params, first, strict=True):
        p.grad = g
    return float(loss.detach()), again


class Loop:
    """One rank's trials (see the module's docstring)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.config = config
        self.trainee = load_trainee(config["trainee"], self.rank, self.world)
        self.steps, self.warmup = int(config["steps"]), int(config["warmup"])
        self.labels = list(config["detectors"])
        self.detectors = [detector_kinds.make(s, self.trainee.guard) for s in self.labels]
        self.check_seconds = [0.0] * len(self.labels)
        self.checked_steps = 0
        self.step_seconds = 0.0
        self.products = 0  # matrix products per step, counted once
        self.decisions: list[str | None] = []  # the detectors' at the last step

    # -- one step ----------------------------------------------------------------
    def step(self, number: int, watched: bool, detectors: list[Any]) -> list[bool]:
        """Train global step `number`; returns, for each detector, whether any rank's
        fired (all ranks agree)."""
        t = self.trainee
        seed_step(number)
        started = time.perf_counter()
        t.optimizer.zero_grad(set_to_none=True)
        batch = t.batch(number)
        loss = t.loss(t.model, batch)
        loss.backward()
        if watched:
            self.step_seconds += time.perf_counter() - started
        view = StepView(number - self.warmup, float(loss.detach()), t.params,
                                       lambda: rerun_step(t, number, batch))
        flags = []
        for k, detector in enumerate(detectors):
            began = time.perf_counter()
            flags.append(detector.check(view))
            if watched:
                self.check_seconds[k] += time.perf_counter() - began
        self.decisions = [d.decision for d in detectors]
        found = torch.tensor([float(f) for f in flags] or [0.0])
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        t.optimizer.step()
        self.checked_steps += int(watched)
        return [bool(x) for x in found.tolist()][:len(detectors)]

    # -- the campaign ------------------------------------------------------------
    def run(self, out: Path) -> None:
        for number in range(1, self.warmup + 1):
            self.step(number, False, self.detectors)
        self.products = self._count_products(self.warmup + 1)
        model_state = copy.deepcopy(self.trainee.model.state_dict())
        optim_state = copy.deepcopy(self.trainee.optimizer.state_dict())
        kept = copy.deepcopy(self.detectors)

        def restore() -> list[Any]:
            self.trainee.model.load_state_dict(model_state)
            # the optimizer keeps the tensors it is given: a copy each time
            self.trainee.optimizer.load_state_dict(copy.deepcopy(optim_state))
            return copy.deepcopy(kept)

        detectors = restore()
        reference = []  # this rank's weights after each step, as hashes
        for number in self._numbers():
            self.step(number, True, detectors)
            reference.append(weights_hash(self.trainee.params))
        trials = plan(self.config["models"], int(self.config["trials"]),
                      int(self.config["clean"]), self.steps, self.world,
                      int(self.config["seed"]))
        began = time.monotonic()
        results = out / "trials.jsonl"
        for trial in trials:
            detectors = restore()
            found = self.trial(trial, detectors, reference)
            if self.rank == 0:
                with results.open("a") as f:
                    f.write(json.dumps(found) + "\n")
        self._write_costs(out, len(trials), time.monotonic() - began)

    def _numbers(self) -> range:
        return range(self.warmup + 1, self.warmup + self.steps + 1)

    def trial(self, trial: Trial, detectors: list[Any], reference: list[int]
              ) -> dict[str, Any]:
        """One trial. Corrupted: after some step this rank's weights differ from the
        reference's after the same step, on any rank (as the chaos runs' judge counts a
        divergence, also one that rounding heals by the end: `healed`)."""
        first: dict[str, int | None] = dict.fromkeys(self.labels)
        decided: dict[str, str | None] = dict.fromkeys(self.labels)  # what the job did next
        hits: list[dict[str, Any]] = []
        mode = None
        diverged = 0
        for number in self._numbers():
            local = number - self.warmup
            if trial.model != CLEAN and local == trial.step and trial.rank == self.rank \
                    and MODELS[trial.model].compute:
                mode = self._arm(trial, hits)
            fired = self.step(number, trial.model == CLEAN, detectors)
            if mode is not None and not MODELS[trial.model].lasting:
                mode.__exit__(None, None, None)
                mode = None
            if trial.model != CLEAN and local == trial.step and trial.rank == self.rank \
                    and not MODELS[trial.model].compute:
                hits.append(self._flip_weight(trial))
            for label, seen, decision in zip(self.labels, fired, self.decisions, strict=True):
                if seen and first[label] is None:
                    first[label], decided[label] = local, decision
            if not diverged and weights_hash(self.trainee.params) \
                    != reference[local - 1]:
                diverged = local
        if mode is not None:
            mode.__exit__(None, None, None)
        ended_equal = weights_hash(self.trainee.params) == reference[-1]
        found = torch.tensor([float(bool(diverged)), float(not ended_equal)])
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        corrupted, ended_apart = (bool(x) for x in found.tolist())
        struck = torch.tensor([float(len(hits))])
        dist.all_reduce(struck, op=dist.ReduceOp.SUM)
        told: list[Any] = [hits[0] if hits else None]
        if trial.model != CLEAN:  # what the struck rank did, for rank 0's line
            dist.broadcast_object_list(told, src=trial.rank)
        return {**trial.to_dict(), "corrupted": corrupted,
                "healed": corrupted and not ended_apart, "struck": int(struck.item()),
                "detected": first, "decided": decided, "first_hit": told[0]}

    def _arm(self, trial: Trial, hits: list[dict[str, Any]]) -> Any:
        """The trial's wrong products on this rank, from this step on."""
        model = MODELS[trial.model]
        params: dict[str, object] = dict(model.params)
        if trial.bit_class:
            params["bit"] = trial.bit_class
        if not model.lasting:  # which product of the step is the wrong one
            params["every"] = random.Random(trial.seed).randint(1, max(1, self.products))
        fault = ResolvedFault(f"trial-{trial.index}", "miscompute", "rank", self.rank,
                              Trigger(step=trial.step), params, trial.model, trial.seed)

        def record(event: str, **fields: Any) -> None:
            if event == "bitflip":
                hits.append({k: fields.get(k) for k in ("name", "index", "bit", "before",
                                                        "after", "elements")})

        ctx = FireContext(self.rank, 0, 0, record, training=_AtStep(trial.step - 1))
        return miscompute.arm(fault, ctx, f"rank{self.rank}")

    def _flip_weight(self, trial: Trial) -> dict[str, Any]:
        rng = random.Random(trial.seed)
        param = self.trainee.params[rng.randrange(len(self.trainee.params))]
        data = param.detach()
        index = rng.randrange(data.numel())
        bit = bits.choose_bit(data.dtype, trial.bit_class, rng)
        return bits.flip_bit(data, index, bit).to_dict()

    def _count_products(self, number: int) -> int:
        """The matrix products one step computes (forward and backward), counted on a
        throwaway copy of the state."""
        state = copy.deepcopy(self.trainee.model.state_dict())
        optim = copy.deepcopy(self.trainee.optimizer.state_dict())
        fault = ResolvedFault("count", "miscompute", "rank", self.rank, Trigger(step=1),
                              {"every": 1 << 40}, "count", 0)  # counts, never strikes
        mode = miscompute.arm(fault, FireContext(self.rank, 0, 0, lambda *a, **k: None,
                                                 training=_AtStep(0)), "count")
        try:
            self.step(number, False, [])
        finally:
            mode.__exit__(None, None, None)
        self.trainee.model.load_state_dict(state)
        self.trainee.optimizer.load_state_dict(optim)
        return int(mode.calls)

    def _write_costs(self, out: Path, trials: int, seconds: float) -> None:
        if self.rank != 0:
            return
        steps = max(1, self.checked_steps)
        costs = {"check_ms": {label: 1000 * s / steps
                              for label, s in zip(self.labels, self.check_seconds, strict=True)},
                 "step_ms": 1000 * self.step_seconds / max(1, self.checked_steps),
                 "trials": trials, "seconds": seconds, "products_per_step": self.products,
                 "world": self.world}
        (out / "costs.json").write_text(json.dumps(costs, indent=1))


class _AtStep:
    """The TrainingView a miscompute needs: the step it records."""

    def __init__(self, step: int) -> None:
        self._step = step

    def step(self) -> int:
        return self._step


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    Loop(config).run(Path(config["out"]))
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()
    # Seen here once in a few runs: "terminate called without an active exception" from
    # a gloo thread torn down at interpreter exit, after every result was written. The
    # results are on disk: leave without the C++ destructors' race.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
