"""raise: an exception raised in the training thread at a chosen point.

A kill ends a process where it stands; an exception runs the script's own
`finally:` blocks, `with` exits and `except` clauses on its way out, and a
bug class lives there that no kill finds: a `finally:` that renames a
half-written temp file into place, a `try/except` that logs a failed save and
trains on. Where it is raised:

- `step=N`: out of the N-th optimizer step (from its post-step hook: the step
  itself happened);
- `phase=checkpoint_save,save=K,event=E`: out of the E-th file operation of the
  K-th save, after it took effect (a write: half its bytes are in the file), in
  the thread that makes the save (a background writer's thread for an async
  save); `phase=checkpoint_load` likewise, out of a resume's read;
- `time=T`: the training thread is interrupted from a timer thread
  (`PyThreadState_SetAsyncExc`), between two of its Python bytecodes; such an
  exception carries no message (only its type).

`type=` is a built-in exception's name (default `RuntimeError`) or a dotted
path to an exception class (`torch.OutOfMemoryError`,
`torch.distributed.DistBackendError`), imported in the rank; `message=` its text.
"""

from __future__ import annotations

import builtins
import ctypes
import importlib
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchchaos.errors import UsageError
from torchchaos.faults.contract import FaultKind, FireContext, ResolvedFault

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

DEFAULT_TYPE = "RuntimeError"
SCRIPT_POLL_SECONDS = 0.005
# what a search draws: the errors training code meets most
DRAWN_TYPES = ("RuntimeError", "OSError", "MemoryError", "ValueError")


def exception_type(value: str) -> str:
    """A built-in exception's name or a dotted path (checked when the rank imports it)."""
    if "." in value:
        if not all(part.isidentifier() for part in value.split(".")):
            raise ValueError(f"{value!r} is not a dotted path to an exception class")
        return value
    found = getattr(builtins, value, None)
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        raise ValueError(f"{value!r} is no built-in exception (give a dotted path for"
                         " others, e.g. torch.OutOfMemoryError)")
    return value


def resolve(name: str) -> type[BaseException]:
    """The exception class `name` names (built-in, or imported by its dotted path)."""
    if "." not in name:
        return getattr(builtins, name)
    module_name, _, attr = name.rpartition(".")
    found = getattr(importlib.import_module(module_name), attr, None)
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        raise TypeError(f"raise:type={name} is not an exception class")
    return found


class Raise(FaultKind):
    name = "raise"
    summary = ("an exception raised in the training thread: out of a step, out of a write"
               " of a checkpoint save or a read of its load, or at a time")
    not_on_a_cluster = ("an exception inside the training process; Chaos Mesh acts on pods from "
                        "outside")
    targets = ("rank",)
    params = {"type": exception_type, "message": str}
    marks = ("raised",)

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        from hypothesis import strategies as st

        types = st.sampled_from(list(DRAWN_TYPES))
        return {
            "raise": st.builds(lambda r, s, t: f"raise:rank={r},step={s},type={t}",
                               shape.a_rank(), shape.a_step(), types),
            "save_raise": st.builds(
                lambda p, t: f"raise:rank={shape.writer},phase=checkpoint_save,save={p[0]},"
                             f"event={p[1]},type={t}",
                shape.a_save_point(), types) if shape.save_events else None,
        }

    def said(self, event: dict[str, Any]) -> str:
        return f"{event.get('type')} raised out of {event.get('where')}"

    def validate(self, params: dict[str, object]) -> None:
        if "message" in params and not str(params["message"]).strip():
            raise UsageError("raise message= is empty; leave it out for the default text")

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        name = str(fault.params.get("type", DEFAULT_TYPE))
        kind = resolve(name)
        message = str(fault.params.get("message") or f"torchchaos fault {fault.spec}")
        step = ctx.step()
        where = "a checkpoint file operation" if ctx.path and fault.trigger.phase else "a step"
        if fault.trigger.time is not None and threading.current_thread() is not \
                threading.main_thread():
            _raise_in_main_thread(kind, lambda: ctx.record(
                "raised", id=fault.id, type=name, step=ctx.step(),
                where="asynchronously, in the training thread"))
            return
        ctx.record("raised", id=fault.id, type=name, step=step, where=where,
                   thread=threading.current_thread().name)
        raise kind(message)


def _runs_the_script(thread: int) -> bool:
    """Whether the thread is inside the script's code. A time that passed while the rank
    started (a busy machine) fires as soon as the agent is armed, which is before the
    script's first line: an exception raised there would escape torchchaos's own start-up
    (sitecustomize, or the warm launcher's fork wrapper, which ends a rank quietly with
    code 0 on a KeyboardInterrupt) instead of the script, as no real interrupt does."""
    main = sys.modules.get("__main__")
    script, spec = getattr(main, "__file__", None), getattr(main, "__spec__", None)
    if script is None or (spec is not None and spec.name.startswith("torchchaos.")):
        return False  # not started yet, or the warm launcher's module before runpy's turn
    frame = sys._current_frames().get(thread)
    while frame is not None:
        if frame.f_code.co_filename == script and frame.f_code.co_name == "<module>":
            return True
        frame = frame.f_back
    return False


def _raise_in_main_thread(kind: type[BaseException], say: Callable[[], None]) -> None:
    """Have the main thread raise `kind` at its next bytecode once it runs the script
    (CPython's async exception: a type, no message); `say` records it just before."""
    main = threading.main_thread().ident
    assert main is not None
    while not _runs_the_script(main):
        time.sleep(SCRIPT_POLL_SECONDS)
    say()
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(kind))
    if done != 1:
        raise RuntimeError(f"could not interrupt the training thread (set in {done} threads)")
