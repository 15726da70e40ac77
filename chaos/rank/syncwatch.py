"""Where the ranks wait for each other: the collectives a rank enters (in-rank).

Two readers: a recording run (`env.RECORD_SYNC`) records each one, since the crash
states of a save (torchchaos.explore.crash.sweep) let the other ranks run on after one
rank died, as far as their next collective, which the dead rank never enters; and
every run asks whether the script itself (not torch inside one of its calls, as
torch.distributed.checkpoint's save gathers its plan) entered one after a save,
the barrier that says the save is over (torchchaos.rank.agent). Each public collective
of `torch.distributed` is wrapped at module level, in `torch.distributed` and in
`distributed_c10d` where it lives (code that calls `dist.barrier()` and the like,
torch.distributed.checkpoint included), and a
`sync` event is recorded as a rank enters one; a collective inside another
(`all_gather_object` calls `all_gather`) counts once. `group` says "world" or
"sub": a collective of a subgroup does not wait for every rank, and the
planner then lets no rank run on. Collectives in C++ (DDP's gradient
all-reduce in backward) are not seen: they happen in training steps, after
the save's operations, and the record ends a step after the save.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

COLLECTIVES = ("barrier", "monitored_barrier", "all_reduce", "broadcast", "all_gather",
               "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "gather",
               "scatter", "reduce", "all_to_all", "all_to_all_single", "broadcast_object_list",
               "all_gather_object", "gather_object", "scatter_object_list")

# Called as a rank enters a collective: its name, "world" or "sub", and whether torch
# called it (from a module of its own, inside one of its APIs) rather than the script.
Entered = Callable[[str, str, bool], None]


def install(entered: Entered) -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    inside = threading.local()
    for name in COLLECTIVES:
        real = getattr(dist, name, None)
        if real is None:
            continue
        wrapped = _wrapped(real, name, entered, inside, dist)
        setattr(dist, name, wrapped)
        if getattr(distributed_c10d, name, None) is real:  # callers that import from there
            setattr(distributed_c10d, name, wrapped)


def _wrapped(real: Callable[..., Any], name: str, entered: Entered, inside: threading.local,
             dist: Any) -> Callable[..., Any]:
    @functools.wraps(real)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if getattr(inside, "depth", 0):
            return real(*args, **kwargs)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        entered(name, _group(args, kwargs, dist), caller.startswith("torch."))
        inside.depth = 1
        try:
            return real(*args, **kwargs)
        finally:
            inside.depth = 0

    return collective


def _group(args: tuple, kwargs: dict, dist: Any) -> str:
    for value in (*args, *kwargs.values()):
        if isinstance(value, dist.ProcessGroup) and value is not dist.group.WORLD:
            if dist.get_world_size(value) != dist.get_world_size():
                return "sub"
    return "world"
