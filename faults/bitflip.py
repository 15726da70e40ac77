"""bitflip: silent data corruption of one element of the training state.

`tensor=` says what is hit (default `param`):
- `param`: a parameter, right after the optimizer step `step=N`;
- `optim`: an optimizer state tensor (e.g. Adam's `exp_avg_sq`), after step N;
- `grad`: a gradient on this rank during step N's backward, *before* DDP's
  all-reduce (a hook on the parameter changes the incoming gradient), so the
  corruption reaches every replica;
- `activation`: the output of a leaf module during step N's forward;
- `loss`: the loss of step N: its value changes in place and backward scales
  every gradient as if the loss had been computed wrong;
- `checkpoint`: one bit of the newest checkpoint file under `dir=` (default
  `ckpt`; `file=` a glob to choose), then the node crashes so resume reads it.

`bit=` an exact bit index or a class: `sign`, `exp_high`, `exp_low`,
`mant_high`, `mant_low` (default `exp_high`; see `torchchaos.faults.bits`); `value=nan`,
`inf` or `-inf` writes that value instead (numeric faults). `name=` narrows the
candidates with a glob over their names (`*linear1.weight`, `*exp_avg_sq`);
`element=` picks the flat element index. Everything not given is a seeded pick
from the fault's own seed, so a resolved schedule replays the same flip.
"""

from __future__ import annotations

import fnmatch
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchchaos.errors import UsageError
from torchchaos.faults.contract import (
    ClusterJob,
    ClusterMapping,
    FaultKind,
    FireContext,
    NotExported,
    ResolvedFault,
    TrainingView,
)
from torchchaos.faults.params import BIT_CLASSES, choice, non_negative_int, run_relative_dir
from torchchaos.rundir.layout import CHAOS_DIR

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

TENSORS = ("param", "grad", "optim", "activation", "loss", "checkpoint")
DURING_STEP = ("grad", "activation", "loss")  # these act inside step N, the others after it


def _bit(value: str) -> int | str:
    from torchchaos.faults.bits import MAX_WIDTH

    if value.isdigit():
        # the dtype is known only when the flip happens; no dtype has a bit past these
        if int(value) >= MAX_WIDTH:
            raise ValueError(f"bit {value} does not exist in any float dtype (at most"
                             f" {MAX_WIDTH} bits: 0-{MAX_WIDTH - 1})")
        return int(value)
    if value not in BIT_CLASSES:
        raise ValueError(f"{value!r} is neither a bit index nor one of {', '.join(BIT_CLASSES)}")
    return value


class BitFlip(FaultKind):
    name = "bitflip"
    summary = ("silent data corruption: flip a bit (or write NaN/inf) in a parameter,"
               " gradient, optimizer state, activation, the loss or a checkpoint file")
    effect_event = "bitflip"
    marks = ("bitflip",)
    choices = {"tensor": TENSORS, "bit": BIT_CLASSES}
    params = {"tensor": choice(TENSORS), "bit": _bit, "value": choice(("nan", "inf", "-inf")),
              "name": str, "element": non_negative_int, "dir": run_relative_dir, "file": str}

    def validate(self, params: dict[str, object]) -> None:
        if "bit" in params and "value" in params:
            raise UsageError("bitflip takes bit= or value=, not both")
        if params.get("tensor") == "checkpoint" and ("value" in params or "name" in params):
            raise UsageError("bitflip tensor=checkpoint flips a bit of a file: it takes bit="
                             " (0-7), file= and dir=, not value= or name=")
        bit = params.get("bit")
        if params.get("tensor") == "checkpoint" and bit is not None and not (
                isinstance(bit, int) and bit < 8):
            raise UsageError(f"bitflip tensor=checkpoint flips a bit of a seeded byte: bit= is"
                             f" 0-7, got {bit}")
        if params.get("tensor", "param") != "checkpoint" and ("dir" in params
                                                               or "file" in params):
            raise UsageError("dir= and file= apply to bitflip tensor=checkpoint only")

    def fire_after_step(self, fault: ResolvedFault) -> int | None:
        step = fault.trigger.step
        if step is not None and fault.params.get("tensor") in DURING_STEP:
            return step - 1
        return step

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        """One seeded element of a parameter, gradient or optimizer state gets one bit of
        its sign, high exponent or high mantissa flipped (`bitflips` draws others)."""
        return {"bitflip": bitflips(shape)}

    def chaos_mesh(self, fault: ResolvedFault, job: ClusterJob) -> ClusterMapping:
        tensor = fault.params.get("tensor", "param")
        if tensor != "checkpoint":
            raise NotExported(f"flips bits of a {tensor} tensor inside the training process;"
                              " Chaos Mesh has no fault in a process's memory")
        return job.read_mistake(fault, 1)

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        tensor = str(fault.params.get("tensor", "param"))
        rng = random.Random(fault.seed)
        if tensor == "checkpoint":
            _flip_checkpoint_file(fault, ctx, rng)
            return
        if ctx.training is None:
            raise RuntimeError("bitflip needs the agent's view of the training state")
        corrupt = _corrupter(fault, rng)
        arm = {"param": _hit_param, "optim": _hit_optim, "grad": _arm_grad,
               "activation": _arm_activation, "loss": _arm_loss}[tensor]
        arm(fault, ctx, ctx.training, corrupt)


Corrupter = Callable[[Any, str | None], dict[str, Any]]


def _corrupter(fault: ResolvedFault, rng: random.Random) -> Corrupter:
    """The change to make to one tensor: flip the chosen bit or write the chosen value
    in a seeded (or the given) element; returns what was done, for the history."""
    from torchchaos.faults import bits

    def corrupt(t: Any, name: str | None) -> dict[str, Any]:
        data = bits.local_data(t)
        if data.numel() == 0:
            raise RuntimeError(f"bitflip: {name} has no elements on this rank")
        index = int(fault.params.get("element", rng.randrange(data.numel())))  # type: ignore[call-overload]
        if index >= data.numel():
            raise UsageError(f"bitflip element={index} is out of range for {name}"
                             f" ({data.numel()} elements)")
        if "value" in fault.params:
            flip = bits.set_value(data, index, bits.VALUES[str(fault.params["value"])])
            bit_class = str(fault.params["value"])
        else:
            bit = bits.choose_bit(data.dtype, fault.params.get("bit", "exp_high"), rng)  # type: ignore[arg-type]
            flip = bits.flip_bit(data, index, bit)
            bit_class = bits.class_of(data.dtype, bit)
        return {"name": name, "dtype": str(data.dtype).replace("torch.", ""),
                "shape": list(data.shape), "device": str(data.device), "bit_class": bit_class,
                **flip.to_dict()}

    return corrupt


def _pick(fault: ResolvedFault, candidates: list[tuple[str, Any]], what: str,
          rng: random.Random) -> tuple[str, Any]:
    pattern = fault.params.get("name")
    if pattern is not None:
        candidates = [(n, t) for n, t in candidates if fnmatch.fnmatchcase(n, str(pattern))]
    if not candidates:
        raise RuntimeError(f"bitflip: no {what} matches name={pattern!r} on this rank")
    return candidates[rng.randrange(len(candidates))]


def _floating(t: Any) -> bool:
    from torchchaos.faults.bits import LAYOUT

    return getattr(t, "dtype", None) in LAYOUT and t.numel() > 0


def _record(ctx: FireContext, fault: ResolvedFault, step: int, when: str,
            done: dict[str, Any]) -> None:
    ctx.record("bitflip", id=fault.id, tensor=fault.params.get("tensor", "param"), step=step,
               when=when, **done)


def _hit_param(fault: ResolvedFault, ctx: FireContext, view: TrainingView,
               corrupt: Corrupter) -> None:
    rng = random.Random(fault.seed + 1)
    name, param = _pick(fault, [(n, p) for n, p in view.named_parameters() if _floating(p)],
                        "parameter", rng)
    _record(ctx, fault, view.step(), "after", corrupt(param, name))


def _hit_optim(fault: ResolvedFault, ctx: FireContext, view: TrainingView,
               corrupt: Corrupter) -> None:
    names = {id(p): n for n, p in view.named_parameters()}
    candidates = [(f"{names.get(id(p), '?')}.{key}", value)
                  for opt in view.optimizers() for p, state in opt.state.items()
                  for key, value in sorted(state.items()) if _floating(value) and value.dim()]
    if not candidates:
        raise RuntimeError("bitflip tensor=optim: the optimizer has no state tensors yet"
                           " (flip after the first step)")
    name, tensor = _pick(fault, candidates, "optimizer state", random.Random(fault.seed + 1))
    _record(ctx, fault, view.step(), "after", corrupt(tensor, name))


def _changed_copy(t: Any, name: str, step: int, fault: ResolvedFault, ctx: FireContext,
                  corrupt: Corrupter) -> Any:
    """A corrupted copy of a tensor that autograd is passing along (a hook's return).

    Inside a hook, a failure of the harness must not look like the target
    crashing: it is recorded and the tensor passes unchanged."""
    import torch

    try:
        changed = t.clone(memory_format=torch.contiguous_format)  # outputs can be strided
        _record(ctx, fault, step, "during", corrupt(changed, name))
        return changed
    except Exception as exc:  # noqa: BLE001 - reported in the history instead
        ctx.record("bitflip_error", id=fault.id, name=name, error=f"{type(exc).__name__}: {exc}")
        return None


def _arm_grad(fault: ResolvedFault, ctx: FireContext, view: TrainingView,
              corrupt: Corrupter) -> None:
    """A hook on the parameter sees the gradient before it is accumulated into .grad,
    which is where DDP's reducer picks it up for the all-reduce."""
    candidates = [(n, p) for n, p in view.named_parameters()
                  if _floating(p) and p.requires_grad]
    name, param = _pick(fault, candidates, "parameter", random.Random(fault.seed + 1))
    step = view.step() + 1
    handle = None

    def hook(grad: Any) -> Any:
        handle.remove()
        return _changed_copy(grad, f"{name}.grad", step, fault, ctx, corrupt)

    handle = param.register_hook(hook)


def _arm_activation(fault: ResolvedFault, ctx: FireContext, view: TrainingView,
                    corrupt: Corrupter) -> None:
    """The output of the J-th leaf-module call of the step (J seeded): a module that
    exists but never runs its own forward (attention's out_proj) is never the target."""
    from torch.nn.modules import module as nn_module

    pattern = fault.params.get("name")
    leaves = {id(m): n for n, m in view.named_modules() if not any(True for _ in m.children())
              and (pattern is None or fnmatch.fnmatchcase(n, str(pattern)))}
    if not leaves:
        raise RuntimeError(f"bitflip tensor=activation: no module matches name={pattern!r}")
    wanted = random.Random(fault.seed + 1).randrange(len(leaves))
    calls = 0
    handle = None

    def hook(module: Any, args: Any, output: Any) -> Any:
        nonlocal calls
        if id(module) not in leaves or not _floating(output):
            return None
        calls += 1
        if calls <= wanted:
            return None
        handle.remove()
        return _changed_copy(output, leaves[id(module)], view.step() + 1, fault, ctx, corrupt)

    handle = nn_module.register_module_forward_hook(hook)


def _arm_loss(fault: ResolvedFault, ctx: FireContext, view: TrainingView,
              corrupt: Corrupter) -> None:
    import torch

    def change(loss: Any) -> Any:
        done = corrupt(loss.data, "loss")
        _record(ctx, fault, view.step() + 1, "during", done)
        before, after = done["before"], float(loss.data.reshape(-1)[0])
        # Backward as if the loss had been computed this wrong: every gradient scales.
        scale = after / before if before else float("inf")
        return torch.full_like(loss, scale)

    view.before_next_backward(change)


def _flip_checkpoint_file(fault: ResolvedFault, ctx: FireContext, rng: random.Random) -> None:
    """Flip one bit of the newest checkpoint file, make it durable, and crash the node."""
    from torchchaos.faults.filebits import flip_file_bits, newest_big_file, seeded_bit_offsets
    from torchchaos.faults.kill import Kill

    folder = Path(ctx.run_dir) / str(fault.params.get("dir", "ckpt"))
    pattern = str(fault.params.get("file", "*"))
    harness = Path(ctx.run_dir) / CHAOS_DIR  # dir=. holds it: never the harness's files
    files = [p for p in folder.rglob("*") if p.is_file() and p.stat().st_size
             and fnmatch.fnmatchcase(str(p.relative_to(folder)), pattern)
             and harness not in p.parents]
    if not files:
        ctx.record("bitflip", id=fault.id, tensor="checkpoint", error=f"no file in {folder}")
        return
    path = newest_big_file(files)
    [offset] = seeded_bit_offsets(path.stat().st_size, rng, 1)
    bit = fault.params.get("bit")
    if isinstance(bit, int):  # an exact bit within the seeded byte
        offset = offset // 8 * 8 + bit % 8
    flip_file_bits(path, [offset])
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    ctx.record("bitflip", id=fault.id, tensor="checkpoint", file=str(path.relative_to(ctx.run_dir)),
               offset=offset // 8, bit=offset % 8, bit_class="byte", step=None, when="after")
    Kill().kill_node("SIGKILL", 0.0, 0)


def bitflips(shape: JobShape, tensors: Sequence[str] = ("param", "grad", "optim"),
             bits: Sequence[str] = ("sign", "exp_high", "mant_high")) -> SearchStrategy[str]:
    """Bit flips of one of `tensors`, in one of the bit classes `bits`, for a search."""
    from hypothesis import strategies as st

    return st.builds(lambda r, s, t, b: f"bitflip:rank={r},step={s},tensor={t},bit={b}",
                     shape.a_rank(), shape.a_step(), st.sampled_from(list(tensors)),
                     st.sampled_from(list(bits)))
