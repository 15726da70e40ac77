"""The agent: runs inside every training rank, unseen by the target.

It is loaded by `sitecustomize` (see `chaos/rank/_inject`) and arms only when the
harness's environment says so. Armed, it
- counts optimizer steps with torch's global optimizer hooks and numbers them
  as *global* steps: after a restart it looks the restored state up in the
  reference run's table, so step 31 means the same thing in every process;
- fingerprints each step: at the step's first top-level forward (state the
  step starts from: parameters, optimizer state, learning rates, RNGs, the
  batch) and after the optimizer step (gradients, parameters, optimizer state).
  Each step's loss is part of them. A chaos run takes all of them only where
  a resume or a fault can first show (`FULL_WINDOW` steps after a process
  starts, after a load and after a fault fires); on the steps between
  ("light" steps) it takes the loss, the learning rates and the batch, and
  the parameters on every `PARAMS_EVERY`-th step and the reference's last.
  A divergence of the weights changes the next step's loss, so light steps
  still catch it within a step or two, for a few percent of the cost;
- watches checkpoint I/O under the run directory (`torchchaos.rank.iowatch`) and groups
  the file events into checkpoint saves (`torchchaos.rank.saves`: between two steps, or
  one background writer's events plus their commit);
- fires the faults scheduled for its rank or node at their triggers, and
  shows the faults that corrupt training state a view of it (`TrainingView`);
- notices a rollback inside a running process (a load, then a step that
  starts from an earlier reference step) and renumbers its steps to match;
- keeps the weights after each step (small models, `torchchaos.rank.weights`) and
  passes the target's own detections (`torchchaos.api`) into the history;
- keeps a heartbeat with the rank's last progress (`torchchaos.rundir.heartbeat`) and
  dumps every thread's stack on request (`torchchaos.host.stacks.STACK_SIGNAL`);
- writes all of it to its rank's history stream.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import hashlib
import json
import os
import random
import shutil
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchchaos import api, env
from torchchaos.faults.contract import FireContext
from torchchaos.faults.registry import get_kind
from torchchaos.host import stacks
from torchchaos.rank import syncwatch, weights
from torchchaos.rank.fingerprint import (
    RepeatedDigest,
    digest_object,
    digest_rng,
    digest_tensors,
    tensors_in,
)
from torchchaos.rank.iowatch import IOWatch
from torchchaos.rank.saves import Save, SaveTracker
from torchchaos.rundir.heartbeat import EXITING, TEARDOWN, Heartbeat
from torchchaos.rundir.history import HistoryWriter, read_stream
from torchchaos.rundir.layout import RunLayout
from torchchaos.scenario import schedule
from torchchaos.scenario.schedule import ResolvedFault

STARTED_AT = "_torchchaos_started_at_step"  # set on every thread the target starts
RESTORED = ("params_start", "optim_start", "lr")  # what a restore sets up (and rng.*)
# Steps fingerprinted in full after a process starts, after a load and after a fault
# fires: a resume that restored something wrong shows at its first step, and the
# components say what. Outside these windows a chaos run's steps are light.
FULL_WINDOW = 5
# Light steps digest the parameters (the bulk of their cost: memory bandwidth) on every
# PARAMS_EVERY-th global step; the loss, taken on every step, covers the ones between.
PARAMS_EVERY = 4


def _copy_unless_gone(source: str | Path, target: str | Path) -> None:
    """Copy one file of a snapshot. Another rank's background writer may rename its
    temporary file away while the copy runs (its save is no part of the one that
    ended): what vanished is left out."""
    try:
        shutil.copy2(source, target)
    except FileNotFoundError:
        if os.path.lexists(source):
            raise


def _collective_timeout() -> float | None:
    """Seconds the job gave its process group's collectives to time out, None where it
    kept torch's default (gloo's 30 minutes, NCCL's 10: no timeout set) or where torch
    does not say (its backends' options are private API)."""
    import torch.distributed as dist

    try:
        if not dist.is_initialized():
            return None
        backend = dist.get_backend()
        device = torch.device("cuda" if backend == "nccl" else "cpu")
        seconds = dist.group.WORLD._get_backend(device).options._timeout.total_seconds()
        default = dist.distributed_c10d._get_default_timeout(backend).total_seconds()
    except Exception:  # noqa: BLE001 - another torch, another backend: say nothing
        return None
    return None if seconds == default else seconds


class ReferenceTable:
    """Start-of-step fingerprints of the reference run, to say which step a restore restored."""

    def __init__(self, steps: list[dict[str, Any]]) -> None:
        self.exact: dict[tuple[str, str], int] = {}
        self.by_params: dict[str, int] = {}
        self.final_step = max((event["step"] for event in steps), default=0)
        for event in steps:
            fp, restored = event["fp"], event["step"] - 1
            self.exact.setdefault((fp["params_start"], fp["optim_start"]), restored)
            self.by_params[fp["params_start"]] = restored  # the latest wins

    @classmethod
    def load(cls, run_dir: Path, rank: int) -> ReferenceTable | None:
        path = RunLayout(run_dir).rank_history(rank)
        if not path.exists():
            return None
        return cls([e for e in read_stream(path) if e["ev"] == "step"])

    def lookup(self, params: str, optim: str) -> tuple[int | None, str | None]:
        if (params, optim) in self.exact:
            return self.exact[(params, optim)], "exact"
        if params in self.by_params:
            return self.by_params[params], "params"
        return None, None


class Agent:
    def __init__(self, environ: dict[str, str]) -> None:
        self.pid = os.getpid()
        # Hooks run in forked children too (DataLoader workers), where they must do
        # nothing; a flag set at fork saves a getpid() call on every module call.
        self.forked = False
        os.register_at_fork(after_in_child=self._after_fork)
        self.rank = int(environ.get("RANK", "0"))
        self.local_rank = int(environ.get("LOCAL_RANK", "0"))
        self.node = int(environ.get("GROUP_RANK", "0"))
        self.layout = RunLayout(Path(environ[env.RUN_DIR]))
        self.linked = set(json.loads(environ.get(env.LINKED, "[]")))
        self.t0 = float(environ.get(env.T0, time.monotonic()))
        launch = int(environ.get(env.LAUNCH, "0"))
        attempt = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.history = HistoryWriter(self.layout.rank_history(self.rank), rank=self.rank,
                                     pid=self.pid, launch=launch, attempt=attempt)
        self.heartbeat = Heartbeat(self.layout.beat_file(self.rank), self.rank, launch, attempt)
        reference = environ.get(env.REFERENCE)
        self.reference = ReferenceTable.load(Path(reference), self.rank) if reference else None
        self.reference_dir = Path(reference) if reference else None
        every_fault = schedule.load(self.layout.schedule_file)
        self.faults = [f for f in every_fault if self._mine(f)]
        # The weights after the last step, for a bit flip's blast radius: the reference
        # keeps them after every step (its last is not known in advance); a chaos run
        # with a bit flip compares its own with them at the reference's last step,
        # any other run never.
        # During a partition, the split-brain check compares what each node published.
        self.digest_publishes = any(get_kind(f.kind).side == "harness" for f in every_fault)
        flips = any(f.kind == "bitflip" for f in every_fault)
        self.weights_at: int | None = None  # None: every step
        if self.reference is not None:
            self.weights_at = self.reference.final_step if flips else -1
        # A process started after a failure (a restart, or a relaunch of the job).
        self.recovering = launch != 0 or attempt != 0 or environ.get(env.RECOVERY) == "1"
        # The reference fingerprints every step in full: any of its steps may be the one
        # a restore restored (looked up by the start-of-step digests).
        self.always_full = (self.reference is None or environ.get(env.FULL_FINGERPRINTS) == "1"
                            or any(f.trigger.step is None for f in every_fault))
        self.full_until = FULL_WINDOW  # local steps up to this one are fingerprinted in full
        # Every rank takes the steps after a scheduled fault in full, not only the rank
        # it hits: which replica went wrong first is told by comparing them. A fault
        # whose step is not known in advance (phase, time, p=) makes every step full.
        self.fault_steps = sorted({get_kind(f.kind).fire_after_step(f) for f in every_fault
                                   if f.trigger.step is not None})
        self.full = True  # whether the step under way is
        self.stop_after = int(environ.get(env.STOP_AFTER) or 0)
        self.stop_at_step = int(environ.get(env.STOP_AT_STEP) or 0)
        self.snapshot_after = int(environ.get(env.SNAPSHOT_AFTER_SAVE) or 0)
        self.written: set[str] = set()  # top-level entries of the run dir the saves wrote
        self.stop_marker = self.layout.stopped_dir / f"rank-{self.rank}"
        # in creation order (a WeakSet's order changes between runs, and with it the digests)
        self._optimizers: list[weakref.ref[torch.optim.Optimizer]] = []
        self.base_step: int | None = None  # global step restored before this process's first step
        self.aligned = True
        self.local_steps = 0
        self.in_forward = False  # a top-level module call is under way
        self.step_open = False
        self.fp: dict[str, str] = {}
        self._lr_text, self._lr_digest = "", ""  # the last learning rates seen, and their digest
        self.batch: list[torch.Tensor] = []
        self.params_digest = RepeatedDigest()  # the parameters are the same tensors each step
        self.loss: torch.Tensor | None = None
        self.save_tracker = SaveTracker()
        self.loads = self.load_events = 0
        self.in_load = False
        self.raised = False  # an uncaught exception reached sys.excepthook
        self.last_path: str | None = None  # the file of the latest file event
        self._roots: list[weakref.ref[torch.nn.Module]] = []  # modules run at the top level
        self._backward_changes: list[Callable[[torch.Tensor], Any]] = []
        self._step_actions: list[Callable[[int], bool]] = []
        self.keep_weights: bool | None = None  # decided at the first step (model size)

    def _after_fork(self) -> None:
        self.forked = True

    def _mine(self, fault: ResolvedFault) -> bool:
        # harness kinds too: the rank that sees the trigger asks the harness to act
        if fault.target_type == "node":
            return fault.index == self.node and self.local_rank == 0
        return fault.index == self.rank

    # -- install -------------------------------------------------------------
    def install(self) -> None:
        from torch.optim import optimizer as optim_module

        agent = self
        real_init = optim_module.Optimizer.__init__

        def init(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            real_init(opt, *args, **kwargs)
            agent.track(opt)

        optim_module.Optimizer.__init__ = init
        optim_module.register_optimizer_step_pre_hook(self._pre_step)
        optim_module.register_optimizer_step_post_hook(self._post_step)
        self._watch_top_level_forwards()
        self._wrap_backward()
        self._wrap_thread_start()
        self.io = IOWatch(str(self.layout.run_dir), str(self.layout.chaos_dir), self._file_event)
        self.io.install()
        self._wrap_excepthook()
        self._wrap_teardown()
        self.record_sync = os.environ.get(env.RECORD_SYNC) == "1"
        syncwatch.install(self._collective_entered)
        atexit.register(self._at_exit)
        # atexit runs only after the interpreter joined every non-daemon thread: a thread
        # the script left running would hang the exit with the rank still "in a step".
        # threading's own shutdown hooks run before those joins (CPython 3.9+).
        register_at_shutdown = getattr(threading, "_register_atexit", None)
        if register_at_shutdown is not None:
            register_at_shutdown(self._exiting)
        self.stop_marker.unlink(missing_ok=True)  # left by an attempt that failed after it
        api._record = self._detection
        api._committed = self._committed
        self.history.record("boot", node=self.node, local_rank=self.local_rank)
        self._carry_lasting()
        self._dump_stacks_on_request()
        self.heartbeat.start()
        self._arm_timers()

    def _carry_lasting(self) -> None:
        """Faults whose effect lasts (a device a persistent miscompute made defective)
        are offered to every process that starts: each kind says whether its effect
        lasts here (`FaultKind.carry`). One stat where there is none."""
        if not self.layout.lasting_dir.is_dir():
            return
        ctx = FireContext(self.rank, self.local_rank, self.node, self.history.record, None,
                          str(self.layout.run_dir), TrainingState(self))
        for path in sorted(self.layout.lasting_dir.glob("*.json")):
            note = json.loads(path.read_text())
            fault = ResolvedFault.from_dict(note["fault"])
            get_kind(fault.kind).carry(fault, note, ctx)

    def _dump_stacks_on_request(self) -> None:
        """The fallback for `torchchaos.host.stacks` where py-spy cannot attach: on STACK_SIGNAL,
        faulthandler writes every thread's stack (from C, even while the main thread
        is blocked in a collective)."""
        path = self.layout.faulthandler_file(self.rank, self.pid)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._stack_file = open(path, "a")  # noqa: SIM115 - kept open for the handler
        faulthandler.register(stacks.STACK_SIGNAL, file=self._stack_file, all_threads=True)

    def _detection(self, what: str, details: dict[str, Any]) -> None:
        self.history.record("detection", what=what, step=self.global_step(), details=details)

    def _committed(self, step: int) -> None:
        self.history.record("committed", step=step)

    def _at_exit(self) -> None:
        # A save still open at exit was cut short when the process died of an
        # exception (a peer gone, the disk failing): it is not a finished checkpoint.
        self._end_save(self.save_tracker.finish(), "exception" if self.raised else "exit")
        self.history.record("exit", step=self.global_step())
        self._exiting()
        if not self.forked and TEARDOWN_FOLLOWS:
            _lighten_teardown()

    def _exiting(self) -> None:
        """The script returned: what is left is the interpreter's own teardown (a hang
        there is a hang at exit). Called where the interpreter's shutdown begins, before it
        joins the threads the script left running, and again at atexit."""
        if not self.raised and not self.forked:
            self.heartbeat.progress(EXITING, self.global_step())
            self.heartbeat.write()

    def _watch_top_level_forwards(self) -> None:
        """See every top-level module call at the cost of one Python call per module call.

        Torch's global module hooks would see them too, but any global hook sends every
        module call down `Module._call_impl`'s slow path and adds two hook calls: 0.1 ms
        a step of the bundled TinyLM's 22 module calls, 3 % of its step on a CPU core.
        A call inside another module's forward passes straight through."""
        real_call = torch.nn.Module.__call__
        agent = self

        def call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if agent.in_forward or agent.forked:
                return real_call(module, *args, **kwargs)
            agent._top_level_forward(module, args)
            agent.in_forward = True
            try:
                return real_call(module, *args, **kwargs)
            finally:
                agent.in_forward = False

        torch.nn.Module.__call__ = call  # type: ignore[method-assign]

    def _wrap_backward(self) -> None:
        real_backward = torch.Tensor.backward
        agent = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.numel() == 1:
                agent.loss = tensor.detach()
                if agent._backward_changes and not agent.forked:
                    gradient = agent._backward_changes.pop(0)(tensor)
                    if gradient is not None and not args and "gradient" not in kwargs:
                        kwargs["gradient"] = gradient
            return real_backward(tensor, *args, **kwargs)

        torch.Tensor.backward = backward

    def _wrap_thread_start(self) -> None:
        """Stamp each thread with the step it was started in: a thread started to
        write a checkpoint (async_save) writes that step's state."""
        real_start = threading.Thread.start
        agent = self

        def start(thread: threading.Thread) -> None:
            setattr(thread, STARTED_AT, agent.global_step())
            real_start(thread)

        threading.Thread.start = start  # type: ignore[method-assign]

    def _wrap_excepthook(self) -> None:
        real_hook = sys.excepthook

        def hook(kind: type, value: BaseException, tb: Any) -> None:
            self.raised = True
            self.history.record(
                "exception", type=kind.__name__, message=str(value)[:500],
                step=self.global_step(), before_first_step=self.local_steps == 0,
                after_load=self.loads > 0,
            )
            real_hook(kind, value, tb)

        sys.excepthook = hook

    def _wrap_teardown(self) -> None:
        """Mark the rank as tearing down when the script calls destroy_process_group: a
        hang or a crash from there on, after training ended cleanly, is a hang at exit,
        not one in training (`torchchaos.harness.hangwatch`). The beat is written before the
        call, which may never give the interpreter back to the heartbeat thread."""
        import torch.distributed as dist

        real_destroy = dist.destroy_process_group
        agent = self

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if not agent.forked:
                # an exception propagating (a `finally:`) means training did not end
                clean = sys.exc_info()[0] is None and not agent.raised
                doing = TEARDOWN if clean else "teardown after an error"
                agent.history.record("teardown", step=agent.global_step(), clean=clean)
                if clean and threading.current_thread() is threading.main_thread():
                    # the script's own save returned before it tore down (a save on a
                    # scheduler's signal, then exit): the rank went on, as to a step
                    agent._end_save(agent.save_tracker.step_begins(), "teardown")
                agent.heartbeat.progress(doing, agent.global_step())
                agent.heartbeat.write()
            return real_destroy(*args, **kwargs)

        dist.destroy_process_group = destroy_process_group

    def _arm_timers(self) -> None:
        for fault in self.faults:
            if fault.trigger.time is not None:
                delay = self.t0 + fault.trigger.time - time.monotonic()
                timer = threading.Timer(max(delay, 0.0), self.fire, args=(fault,))
                timer.daemon = True
                timer.start()

    # -- steps ---------------------------------------------------------------
    def global_step(self) -> int | None:
        if self.base_step is None:
            return None if self.local_steps else 0
        return self.base_step + self.local_steps

    def track(self, opt: torch.optim.Optimizer) -> None:
        if all(ref() is not opt for ref in self._optimizers):
            self._optimizers.append(weakref.ref(opt))

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [opt for ref in self._optimizers if (opt := ref()) is not None]

    def params(self) -> list[torch.Tensor]:
        return [p for opt in self.optimizers for g in opt.param_groups for p in g["params"]]

    def _optim_fp(self) -> str:
        return digest_object([opt.state_dict()["state"] for opt in self.optimizers])

    def _lr_fp(self) -> str:
        rates = [[g.get("lr") for g in opt.param_groups] for opt in self.optimizers]
        if not all(type(rate) in (float, int) for group in rates for rate in group):
            return digest_object(rates)  # a tensor learning rate (capturable Adam)
        # Plain numbers change rarely (a schedule's next decay) and their digest is one of
        # their exact text: it is made again only when the text changes.
        text = repr(rates)
        if text != self._lr_text:
            self._lr_text, self._lr_digest = text, digest_object(rates)
        return self._lr_digest

    def _full_window(self) -> None:
        """The step under way and the next FULL_WINDOW ones are fingerprinted in full."""
        self.full_until = max(self.full_until, self.local_steps + 1 + FULL_WINDOW)

    def _params_due(self) -> bool:
        """A light step's parameters: every PARAMS_EVERY-th step, and from the reference's
        last step on (the final weights are always compared)."""
        step = self.global_step() or 0
        final = self.reference.final_step if self.reference is not None else 0
        return step % PARAMS_EVERY == 0 or step >= final

    def _near_a_fault(self) -> bool:
        coming = (self.global_step() or 0) + 1
        return any(after < coming <= after + FULL_WINDOW for after in self.fault_steps)

    def _begin_step(self) -> None:
        loaded = self.in_load
        self._close_io_groups()
        self.step_open = True
        self.heartbeat.progress("forward", self.global_step())
        if loaded:
            self._full_window()
        self.full = (self.always_full or self.local_steps < self.full_until
                     or self._near_a_fault())
        self.fp = {"lr": self._lr_fp()}
        if self.full:
            self.fp.update({
                "params_start": self.params_digest(self.params()),
                "optim_start": self._optim_fp(),
                **{f"rng.{name}": value for name, value in digest_rng().items()},
            })
        if self.local_steps == 0:
            self._restore_point()
        elif loaded:
            self._rollback_point()

    def _rollback_point(self) -> None:
        """A load between two steps of one process: did the target roll back?"""
        if self.reference is None:
            return
        restored, match = self.reference.lookup(self.fp["params_start"], self.fp["optim_start"])
        current = self.global_step()
        if restored is None or restored == current:
            return
        self.history.record("rollback", restored=restored, from_step=current, match=match)
        self.base_step = restored - self.local_steps  # later steps keep the reference's numbers

    def _restore_point(self) -> None:
        """First step of this process: which reference step did it start from?"""
        if self.reference is None:
            restored, match = 0, "fresh"
        else:
            restored, match = self.reference.lookup(self.fp["params_start"], self.fp["optim_start"])
        self.aligned = restored is not None
        self.base_step = restored if restored is not None else 0
        timeout = _collective_timeout()
        self.history.record("restore", restored=restored, match=match, loads=self.loads,
                            fp={k: v for k, v in self.fp.items()
                                if k in RESTORED or k.startswith("rng.")},
                            **({"collective_timeout": timeout} if timeout else {}))
        if restored == 0:
            self._check_step_triggers(0)  # faults that act during step 1

    def _top_level_forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """A module called with no module's forward under way: the step's first one
        begins the step; every one's arguments are part of the step's batch."""
        if all(ref() is not module for ref in self._roots):
            self._roots.append(weakref.ref(module))
        if not self.step_open:
            self._begin_step()
        self.batch.extend(tensors_in(args))

    def _pre_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.forked or _initialising_optimizer_state():
            return
        self.track(opt)
        if not self.step_open:
            self._begin_step()
        # optimizer.step(closure) runs the backward inside the step: the gradients
        # are there only once it returns (before it, they are the last step's)
        if self.full and not _has_closure(args, kwargs):
            self.fp["grads"] = _grads_digest(opt)

    def _post_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.forked or _initialising_optimizer_state():
            return
        if self.full and _has_closure(args, kwargs):
            self.fp["grads"] = _grads_digest(opt)
        self.local_steps += 1
        self.fp["batch"] = digest_tensors(self.batch)
        if self.full or self._params_due():
            self.fp["params"] = self.params_digest(self.params())
        if self.full:
            self.fp["optim"] = self._optim_fp()
        loss = float(self.loss) if self.loss is not None else None
        if loss is not None:
            self.fp["loss"] = loss.hex()  # exact: a weight that differs changes it
        # An unaligned process (its restored state is no reference step) counts from 0.
        step = self.global_step()
        self.history.record_step(step, self.aligned, self.local_steps, loss, self.fp,
                                 light=not self.full)
        self.batch, self.loss, self.fp, self.step_open = [], None, {}, False
        self.heartbeat.progress("step", step)
        step = step or 0
        self._keep_weights(step)
        if self._step_actions:
            self._step_actions = [act for act in self._step_actions if act(step)]
        if self.faults:
            self._check_step_triggers(step)
        if self.stop_after and self.recovering and self.local_steps >= self.stop_after:
            self._stop()
        if self.stop_at_step and step >= self.stop_at_step:
            self._stop()

    def _stop(self) -> None:
        """Enough steps after the recovery were seen: wait here to be reaped.

        Blocking rather than exiting keeps every collective whole: each rank stops
        after the same step, and the runner ends the job once all of them have."""
        self.history.record("stopped", step=self.global_step())
        self.heartbeat.stopped()
        self.stop_marker.touch()
        threading.Event().wait()

    def _keep_weights(self, step: int) -> None:
        if self.weights_at is not None and step != self.weights_at:
            return
        params = self.params()
        if self.keep_weights is None:
            self.keep_weights = weights.small_enough(params)
        if not self.keep_weights:
            return
        if self.reference_dir is None:
            weights.save(self.layout.weights_file(self.rank), step, params)
            return
        # Measured here, while the weights are in memory: the checks read histories only.
        ref = weights.load(RunLayout(self.reference_dir).weights_file(self.rank))
        mine = [t.cpu() for t in weights.local_tensors(params)]
        value = None if ref is None or ref[0] != step else weights.max_deviation(mine, ref[1])
        self.history.record("weights_deviation", step=step, value=value)

    def _check_step_triggers(self, step: int) -> None:
        """Fire what is due after `step` (0: before the first step)."""
        for fault in self.faults:
            trig = fault.trigger
            if trig.step is not None and get_kind(fault.kind).fire_after_step(fault) == step:
                self.fire(fault)
            elif (trig.p is not None and step >= 1
                  and random.Random(f"{fault.seed}-{step}").random() < trig.p):
                self.fire(fault)

    # -- checkpoint I/O ------------------------------------------------------
    def _close_io_groups(self) -> None:
        """A step begins: it ends the save that is over (`torchchaos.rank.saves`) and any load."""
        self._end_save(self.save_tracker.step_begins(), "step")
        self.in_load = False

    def _end_save(self, save: Save | None, ended: str) -> None:
        """Record the end of `save`: `ended` says how ("step": the rank went on to
        train; "teardown": it went on to destroy its process group; "next_save": its
        writer thread began the next one; "exit", "exception")."""
        if save is not None:
            self.history.record("save_end", save=save.number, events=save.events,
                                last_step=save.last_step, last_t=save.last_t, ended=ended)
            if save.number == self.snapshot_after and self.rank == 0 and self.reference is None:
                self._snapshot()  # in the reference run: the chaos runs start from it

    def _collective_entered(self, op: str, group: str, by_torch: bool) -> None:
        if self.forked:
            return
        if self.record_sync:
            self.history.record("sync", op=op, group=group)
        if by_torch or threading.current_thread() is not threading.main_thread():
            return  # a collective inside torch's own call (a DCP save's plan) is in the save
        save = self.save_tracker.left()
        if save is not None:
            # killed before its next step (a requeue after a save on a signal), the
            # save it went on from is still one it finished (torchchaos.judge.checkers)
            self.history.record("save_left", save=save.number, events=save.events, op=op)

    def _snapshot(self) -> None:
        """Copy what the saves wrote (their top-level folders or files) as it is now."""
        target = self.layout.snapshot_dir
        with self.io.muted():  # the copy's reads are the harness's, not the target's
            target.mkdir(parents=True, exist_ok=True)
            for name in sorted(self.written):
                source = self.layout.run_dir / name
                if source.is_dir():
                    shutil.copytree(source, target / name, symlinks=True, dirs_exist_ok=True,
                                    copy_function=_copy_unless_gone)
                elif source.is_file():
                    _copy_unless_gone(source, target / name)
        self.history.record("snapshot", entries=sorted(self.written), step=self.global_step())

    def _file_event(self, op: str, path: str) -> None:
        if self.forked:
            return
        rel = os.path.relpath(path, self.layout.run_dir)
        if op == "read" and rel.split(os.sep)[0] in self.linked:
            return  # an input every run shares (configurator.py, data/), not a checkpoint
        self.last_path = path
        self.heartbeat.progress("load" if op == "read" else "checkpoint I/O", self.global_step())
        if op == "read":
            if self.save_tracker.open is not None:  # reading back what a save wrote
                return
            if not self.in_load:
                self.in_load, self.loads, self.load_events = True, self.loads + 1, 0
            self.load_events += 1
            self.history.record("load", path=rel, load=self.loads, index=self.load_events)
            self._check_phase("checkpoint_load", self.loads, self.load_events)
            return
        self.written.add(rel.split(os.sep)[0])
        if self.local_steps == 0:  # set-up before training (mkdir ckpt/): not a save
            self.history.record("file", op=op, path=rel, save=0, index=0)
            return
        thread = threading.current_thread()
        writer = None if thread is threading.main_thread() else thread
        save, closed = self.save_tracker.event(writer, self.global_step(),
                                               getattr(thread, STARTED_AT, None), op, rel)
        self._end_save(closed, "next_save")
        if save.events == 1:
            self.history.record("save_begin", save=save.number, after_step=save.after_step,
                                background=writer is not None)
        digest = _digest(path) if op == "rename" and self.digest_publishes else None
        save.last_t = self.history.record("file", op=op, path=rel, save=save.number,
                                          index=save.events,
                                          **({"digest": digest} if digest else {}))["t"]
        self._check_phase("checkpoint_save", save.number, save.events)

    def _check_phase(self, phase: str, occurrence: int, index: int) -> None:
        for fault in self.faults:
            trig = fault.trigger
            if trig.phase == phase and trig.save == occurrence and trig.event == index:
                self.fire(fault)

    # -- faults --------------------------------------------------------------
    def _claim(self, fault: ResolvedFault) -> bool:
        """A fault fires once per run, across restarts: the first to create its marker wins."""
        try:
            fd = os.open(self.layout.fired_dir / fault.id, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def fire(self, fault: ResolvedFault) -> None:
        if not self._claim(fault):
            return
        self._full_window()
        self.history.record("fault", id=fault.id, kind=fault.kind, spec=fault.spec,
                            target=f"{fault.target_type}:{fault.index}", step=self.global_step(),
                            params=fault.params)
        ctx = FireContext(self.rank, self.local_rank, self.node, self.history.record,
                          self.last_path, str(self.layout.run_dir), TrainingState(self))
        get_kind(fault.kind).fire(fault, ctx)


def _digest(path: str, limit: int = 1 << 30) -> str | None:
    """sha256 of a published file (None for a folder or one over `limit` bytes)."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > limit:
            return None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


class TrainingState:
    """The agent's view of a rank's training state (`torchchaos.faults.contract.TrainingView`)."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def step(self) -> int:
        return self._agent.global_step() or 0

    def _names(self) -> dict[int, str]:
        roots = [m for ref in self._agent._roots if (m := ref()) is not None]
        return {id(p): name for root in roots for name, p in root.named_parameters()}

    def named_parameters(self) -> list[tuple[str, Any]]:
        names = self._names()
        return [(names.get(id(p), f"param{i}"), p) for i, p in enumerate(self._agent.params())]

    def optimizers(self) -> list[Any]:
        return self._agent.optimizers

    def named_modules(self) -> list[tuple[str, Any]]:
        roots = [m for ref in self._agent._roots if (m := ref()) is not None]
        return [(name, m) for root in roots for name, m in root.named_modules()]

    def before_next_backward(self, change: Callable[[Any], Any]) -> None:
        self._agent._backward_changes.append(change)

    def after_every_step(self, action: Callable[[int], bool]) -> None:
        self._agent._step_actions.append(action)


def _has_closure(args: Any, kwargs: Any) -> bool:
    """Was optimizer.step given a closure? The hooks' `args` start with the optimizer."""
    return (len(args) > 1 and args[1] is not None) or kwargs.get("closure") is not None


def _grads_digest(opt: torch.optim.Optimizer) -> str:
    return digest_tensors([p.grad for g in opt.param_groups for p in g["params"]
                           if p.grad is not None])


_DCP_STATE_DICT = "torch.distributed.checkpoint.state_dict"  # where _init_optim_state lives


def _initialising_optimizer_state() -> bool:
    """Is this optimizer step DCP's set-up rather than training?

    torch.distributed.checkpoint's get_state_dict fills an optimizer that has
    no state yet (as on every resume) by stepping it once with zero gradients
    and learning rate 0. That step is no training step: counting it would put
    every later step one off the reference.
    """
    if _DCP_STATE_DICT not in sys.modules:  # a dict lookup, where a walk costs microseconds
        return False
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return False
        if frame.f_code.co_name == "_init_optim_state":
            return True
        frame = frame.f_back
    return False


# What a rank held at a gate imports while it waits: torch's DistributedDataParallel
# imports torch._dynamo when it is made (1.4 s a rank in torch 2.13), and a held rank
# has the time. Modules only: importing runs none of the script.
WARM_IMPORTS = ("torch.distributed", "torch._dynamo")
GATE_POLL_SECONDS = 0.005
# Does the interpreter's teardown follow the atexit handlers? Not in a rank forked by
# torchchaos.rank.warmrun, which leaves by os._exit (as every forked worker does).
TEARDOWN_FOLLOWS = True


def boot() -> None:
    """Arm the agent in this process (called from sitecustomize)."""
    os.environ[env.AGENT_PID] = str(os.getpid())
    gate = os.environ.get(env.GATE)
    if gate:
        _wait_at_gate(Path(gate))
    Agent(dict(os.environ)).install()


def _wait_at_gate(gate: Path) -> None:
    """Warm up, then wait for the harness to say go (it writes the folder the job starts
    from meanwhile); end with the torchrun agent that started this rank."""
    import importlib

    for name in WARM_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a warm-up only: the script imports what it needs
            pass
    parent = os.getppid()
    while not gate.exists():
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(GATE_POLL_SECONDS)


def _lighten_teardown() -> None:
    """Collect once what is garbage now (its finalisers run as they would), then freeze
    what is still alive. The interpreter's teardown collects the whole heap several times
    over, and a rank's heap holds all of torch and dynamo: 0.65 s of CPU a rank after
    every run and every failure on 2 cores, 0.26 s with this. Runs last of the atexit
    handlers a script registers (the agent's was registered before the script ran); what
    it changes is that a reference cycle freed only by the module teardown after it is
    not collected, which CPython does not promise either."""
    gc.collect()
    gc.freeze()
