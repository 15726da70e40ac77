"""miscompute: a defective unit computes matrix products wrong, again and again.

The silent data corruption the field reports (Meta's "Silent data corruptions at scale",
Google's "Cores that don't count", the 2026 field studies) is rarely one flipped bit of
one stored value, once. It is a unit that computes wrong: the same device, call after
call, often only for some data, often a whole warp's block of results, often several
bits. This kind corrupts the *output* of matrix products on one rank (forward and
backward: a `TorchDispatchMode` sees every aten call), from its trigger on:

- `op=`: `any` (default: every product below), `mm` (2-D products: linear layers and
  their gradients), `bmm` (batched: attention's products on the math path), `sdpa`
  (the fused attention kernels);
- `pattern=`: `element` (one element of the output, default), `warp` (a block of 32
  consecutive elements starting at a multiple of 32, every one with the same bit
  flipped: a defective lane group), `burst` (`bits=K` adjacent bits of one element,
  default 4); `bit=` the bit or class as for bitflip (default `mant_high`), or
  `value=nan|inf|-inf` (the rare case the field sees in about 1 % of outcomes);
- how often: `every=N` (every Nth matching call, default 1) or `rate=P` (each call
  with probability P percent). Which call a rate hits, which element and which bit
  are drawn from the call's operands, not from the order of calls: the same inputs
  give the same wrong result, so a step rerun on the same device reproduces it
  exactly (`every=` counts calls, so a rerun's hits move);
- `times=N`: at most N wrong calls (`times=1`: one wrong result, once: the transient
  case), default no limit;
- `when_bit=K`: only calls whose first operand's first element has bit K set (a
  data-dependent defect: some inputs trip it, others never do);
- `persist=device` (default) or `none`: a defective device stays defective. The
  fault is written down under the run's `_chaos/lasting/` with the device it struck (the
  machine: its container, or its simulated node, or the host; and the local rank's
  slot, the GPU's UUID on CUDA), and every later process of the job that starts on
  that device carries it again, whatever its rank number is now. A relaunch on another
  machine (a container node replaced) does not. `none`: the process that fired it only.
- `device=cuda`: only outputs on a CUDA device, refused where there is none.

Each corrupted call is a `bitflip` event (`model: miscompute`), so a run is judged by
the same evidence as a bit flip (`torchchaos.judge.sdc`): the first 50 of each process
in full, then a count.
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchchaos.errors import Unavailable, UsageError
from torchchaos.faults.contract import FaultKind, FireContext, ResolvedFault
from torchchaos.faults.params import BIT_CLASSES, choice, percentage, positive_int
from torchchaos.rundir.layout import RunLayout

if TYPE_CHECKING:
    import torch

OPS = ("any", "mm", "bmm", "sdpa")
PATTERNS = ("element", "warp", "burst")
WARP = 32
RECORDED = 50  # corrupted calls recorded in full per process; the rest are counted

# aten overload packets by family; names, so that the harness never imports torch
FAMILIES = {
    "mm": ("mm", "addmm", "mv", "addmv"),
    "bmm": ("bmm", "baddbmm"),
    "sdpa": ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu"),
}


def _bit(value: str) -> int | str:
    from torchchaos.faults.bitflip import _bit as bitflip_bit

    return bitflip_bit(value)


class Miscompute(FaultKind):
    name = "miscompute"
    summary = ("a defective unit computes matrix products wrong on one rank, call after call"
               " (an element, a warp, a burst of bits; persistent on the device)")
    not_on_a_cluster = ("corrupts matrix products inside the training process; Chaos Mesh has no "
                        "fault in a process's arithmetic")
    targets = ("rank",)
    effect_event = "bitflip"
    marks = ("bitflip",)
    choices = {"op": OPS, "pattern": PATTERNS, "bit": BIT_CLASSES}
    params = {"op": choice(OPS), "pattern": choice(PATTERNS), "bit": _bit,
              "value": choice(("nan", "inf", "-inf")), "bits": positive_int,
              "every": positive_int, "rate": percentage, "times": positive_int,
              "when_bit": positive_int,
              "persist": choice(("device", "none")), "device": choice(("any", "cuda"))}

    def validate(self, params: dict[str, object]) -> None:
        if "every" in params and "rate" in params:
            raise UsageError("miscompute takes every= or rate=, not both")
        if "bit" in params and "value" in params:
            raise UsageError("miscompute takes bit= or value=, not both")
        if "bits" in params and params.get("pattern") != "burst":
            raise UsageError("miscompute bits= goes with pattern=burst")
        if "value" in params and params.get("pattern") == "burst":
            raise UsageError("miscompute pattern=burst flips bits: value= does not apply")

    def check_job(self, params: dict[str, object], nodes: int, network: str) -> None:
        if params.get("device") == "cuda" and not glob.glob("/dev/nvidia[0-9]*"):
            raise Unavailable("fault kind miscompute device=cuda needs a CUDA device (no"
                              " /dev/nvidia* on this machine)")

    def fire_after_step(self, fault: ResolvedFault) -> int | None:
        step = fault.trigger.step
        return None if step is None else step - 1  # defective from inside step N on

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        device = device_id(ctx.local_rank)
        if fault.params.get("persist", "device") == "device":
            write_defect(Path(ctx.run_dir), fault, device)
        arm(fault, ctx, device)

    def carry(self, fault: ResolvedFault, note: dict[str, Any], ctx: FireContext) -> None:
        """A process starting on the defective device computes wrong too, whatever its
        rank number is now."""
        device = device_id(ctx.local_rank)
        if note.get("device") == device:
            ctx.record("defect_carried", id=fault.id, device=device)
            arm(fault, ctx, device)


# -- the device a defect stays with ------------------------------------------------

_CONTAINER = re.compile(r"/torchchaos-docker-[0-9a-f]+/([0-9a-f]{64})")


def machine_id(cgroups: str | None = None) -> str:
    """This process's machine: its container (a replaced container node is a new
    machine), else its simulated node (the harness names it in NCCL_HOSTID), else the
    host. `cgroups`: /proc/self/cgroup's text (read when not given)."""
    if cgroups is None:
        try:
            cgroups = Path("/proc/self/cgroup").read_text()
        except OSError:
            cgroups = ""
    found = _CONTAINER.search(cgroups)
    if found:
        return f"container-{found.group(1)[:12]}"
    return os.environ.get("NCCL_HOSTID") or socket.gethostname()


def device_id(local_rank: int) -> str:
    """The machine and the slot this rank's work runs on: the GPU's UUID where the rank
    has one, else its local rank (the host's share it computes on)."""
    slot = f"slot{local_rank}"
    try:
        import torch

        if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
            slot = f"gpu-{torch.cuda.get_device_properties(local_rank).uuid}"
    except Exception:  # noqa: BLE001 - no usable CUDA: the slot names it
        pass
    return f"{machine_id()}/{slot}"


def write_defect(run_dir: Path, fault: ResolvedFault, device: str) -> None:
    """Write the defect down as a lasting effect (`RunLayout.lasting_dir`)."""
    folder = RunLayout(run_dir).lasting_dir
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{fault.id}.tmp"
    tmp.write_text(json.dumps({"device": device, "fault": fault.to_dict()}))
    os.replace(tmp, folder / f"{fault.id}.json")


def defects_on(run_dir: Path, device: str) -> list[ResolvedFault]:
    """The defects written down for `device`."""
    folder = RunLayout(run_dir).lasting_dir
    notes = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] \
        if folder.is_dir() else []
    return [ResolvedFault.from_dict(n["fault"]) for n in notes
            if n["fault"]["kind"] == "miscompute" and n["device"] == device]


# -- the corruption ----------------------------------------------------------------

def arm(fault: ResolvedFault, ctx: FireContext, device: str) -> Any:
    """From now on, this process's matching products come out wrong. Returns the mode
    (entered for the rest of the process: a defect is not scoped; a test exits it)."""
    mode = _mode_class()(fault, ctx, device)
    mode.__enter__()
    return mode


def _wanted(op: str) -> frozenset[str]:
    names = [n for family in FAMILIES.values() for n in family] if op == "any" \
        else FAMILIES[op]
    return frozenset(f"aten.{n}" for n in names)


def _mode_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Defect(TorchDispatchMode):
        """Runs every aten call; corrupts the output of the matching ones."""

        def __init__(self, fault: ResolvedFault, ctx: FireContext, device: str) -> None:
            super().__init__()
            self.fault, self.ctx, self.device = fault, ctx, device
            self.wanted = _wanted(str(fault.params.get("op", "any")))
            self.calls = self.corrupted = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            op = str(func.overloadpacket)
            if op in self.wanted:
                first = out[0] if isinstance(out, tuple) else out
                if self._counts(args, first):
                    self._maybe_corrupt(op, args, first)
            return out

        def _counts(self, args: Any, out: Any) -> bool:
            """A call the defect can hit (counted for every=); cheap checks only."""
            import torch

            if self.corrupted >= int(self.fault.params.get("times", 0) or 1 << 62):  # type: ignore[call-overload]
                return False
            if not isinstance(out, torch.Tensor) or not out.is_floating_point() \
                    or out.numel() == 0:
                return False
            if self.fault.params.get("device") == "cuda" and out.device.type != "cuda":
                return False
            if "when_bit" in self.fault.params and not _operand_bit(
                    args, int(self.fault.params["when_bit"])):  # type: ignore[call-overload]
                return False
            self.calls += 1
            return True

        def _maybe_corrupt(self, op: str, args: Any, out: Any) -> None:
            """every=: by the count, no operand read; rate=: drawn from the operands,
            hashed only here (a sample copied to the host: not for every call)."""
            rate = self.fault.params.get("rate")
            if rate is None and self.calls % int(self.fault.params.get("every", 1)):  # type: ignore[call-overload]
                return
            rng = _operand_rng(f"{self.fault.seed}-{self.device}-{op}", args)
            if rate is not None and rng.random() * 100 >= float(rate):  # type: ignore[arg-type]
                return
            self._corrupt(op, out, rng)

        def _corrupt(self, op: str, out: Any, rng: random.Random) -> None:
            with torch_no_dispatch():
                done = corrupt(out, self.fault.params, rng)
            self.corrupted += 1
            if self.corrupted <= RECORDED or self.corrupted % 1000 == 0:
                self.ctx.record("bitflip", id=self.fault.id, model="miscompute",
                                tensor="product", name=op, step=self.ctx.step() + 1,  # type: ignore[operator]
                                when="during", call=self.calls, corrupted=self.corrupted,
                                device_id=self.device,
                                persist=self.fault.params.get("persist", "device"), **done)

    return Defect


class torch_no_dispatch:  # noqa: N801 - reads as the context it is
    """The corruption's own tensor calls, outside the mode (else it would see them)."""

    def __enter__(self) -> None:
        from torch.utils._python_dispatch import _disable_current_modes

        self._guard = _disable_current_modes()
        self._guard.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._guard.__exit__(*exc)


def _operand_rng(salt: str, args: Any) -> random.Random:
    """The draws of one call (whether it is hit, which element, which bit), from its
    operands: a defective unit gives the same wrong result for the same inputs, so a
    step rerun on the same device reproduces it exactly. A sample of each operand's
    bytes (its first 64 elements and its shape) stands for the whole."""
    import hashlib

    import torch

    h = hashlib.blake2b(salt.encode(), digest_size=8)
    with torch_no_dispatch():
        for a in args:
            if isinstance(a, torch.Tensor) and a.numel():
                h.update(repr(tuple(a.shape)).encode())
                sample = a.detach().reshape(-1)[:64].contiguous().cpu()
                h.update(sample.view(torch.uint8).numpy().tobytes())
    return random.Random(h.digest())


def _operand_bit(args: Any, bit: int) -> bool:
    """Whether bit `bit` of the first tensor operand's first element is set."""
    import torch

    from torchchaos.faults import bits

    tensor = next((a for a in args if isinstance(a, torch.Tensor) and a.numel()), None)
    if tensor is None or not tensor.is_floating_point() or bit >= bits.width_of(tensor.dtype):
        return False
    signed = bits._SIGNED[tensor.element_size()]
    raw = int(tensor.detach().reshape(-1)[:1].contiguous().view(signed)[0])
    return bool((raw >> bit) & 1)


def corrupt(out: torch.Tensor, params: dict[str, object], rng: random.Random) -> dict[str, Any]:
    """Corrupt `out` in place by the pattern; returns what was done, for the history."""
    from torchchaos.faults import bits

    flat = out.detach().reshape(-1) if out.is_contiguous() else None
    if flat is None:
        raise ValueError("miscompute needs a contiguous product")  # aten's products are
    pattern = str(params.get("pattern", "element"))
    if pattern == "warp":
        start = rng.randrange(max(1, flat.numel() // WARP)) * WARP
        indices = list(range(start, min(start + WARP, flat.numel())))
    else:
        indices = [rng.randrange(flat.numel())]
    if "value" in params:
        flips = [bits.set_value(flat, i, bits.VALUES[str(params["value"])]) for i in indices]
        bit_class = str(params["value"])
        flipped: list[int] = []
    else:
        bit = bits.choose_bit(flat.dtype, params.get("bit", "mant_high"), rng)  # type: ignore[arg-type]
        count = int(params.get("bits", 4)) if pattern == "burst" else 1  # type: ignore[call-overload]
        flipped = [b for b in range(bit, bit + count) if b < bits.width_of(flat.dtype)]
        flips = []
        for i in indices:
            for b in flipped:
                flips.append(bits.flip_bit(flat, i, b))
        bit_class = bits.class_of(flat.dtype, bit)
    of_first = flips[:max(1, len(flipped))]  # the first element's, in the order made
    return {"pattern": pattern, "dtype": str(flat.dtype).replace("torch.", ""),
            "shape": list(out.shape), "device": str(out.device), "bit_class": bit_class,
            "index": indices[0], "elements": len(indices), "bits": flipped,
            "bit": flipped[0] if flipped else None,
            "before": of_first[0].to_dict()["before"], "after": of_first[-1].to_dict()["after"]}
