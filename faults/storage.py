"""storage: what disks and filesystems do to a checkpoint protocol.

Modes (`mode=`):
- `lose_unsynced`: power loss. Every process of the run dies, then all data
  and directory entries under the checkpoint directory that were not made
  durable by fsync are dropped. (A plain kill keeps the page cache and so
  hides a missing fsync; this does not.)
- `torn`: the next write (`op=` another operation) reaches the disk only in
  part (`keep=`, the fraction kept, default 0.5), and the job crashes.
- `enospc`, `eio`: the next `count=` (default 1) operations `op=` (default
  `write`; also `fsync`, `rename`, `create`, `open`, `any`, ...) fail with
  that errno. Nothing is killed: the target meets the error on its own.
- `slow`: every operation takes `delay=` seconds more, for `duration=` seconds.
- `bitrot`: `bits=` (default 1) bits flip at seeded places in a committed
  checkpoint file (`file=` glob, relative to the directory; default the
  newest of the big files, i.e. the latest checkpoint's data rather than its
  small manifest; a file not fsynced where the job commits none), then the
  job crashes, so that resume reads it back.

Where (`dir=`, default `ckpt`): the checkpoint directory, relative to the run
directory; the harness mounts the fault filesystem there for the chaos run.
`dir=.` is the run directory itself (the target's working directory, for a
script that saves there): the harness's own `_chaos/` in it passes through
outside the fault model. Storage faults on nested folders (`.` and `ckpt`)
cannot be combined: one mount would sit on the other.
The fault fires at its trigger in the chosen rank: at once for
`lose_unsynced` and `bitrot`, while the other modes arm the filesystem for
the next matching operations. A crash takes down every process of the run
(all simulated nodes share the machine's disk).

`via=agent` is the light mechanism, without a mount: `mode=torn` only; the
file of the triggering file event is cut to `keep` of its size inside the
rank, and the rank's node is killed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from torchchaos.errors import UsageError
from torchchaos.faults.contract import (
    ClusterChaos,
    ClusterJob,
    ClusterMapping,
    FaultKind,
    FireContext,
    JobContext,
    JobResource,
    NotExported,
    ResolvedFault,
)
from torchchaos.faults.faultfs.armed import OPS
from torchchaos.faults.params import choice, fraction, positive_int, run_relative_dir, seconds
from torchchaos.rundir.layout import CHAOS_DIR, RunLayout

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

MODES = ("lose_unsynced", "torn", "enospc", "eio", "slow", "bitrot")
DEFAULT_DIR = "ckpt"  # where a storage fault acts when it names no dir=


def dir_pairs(folder: str) -> tuple[tuple[str, str], ...]:
    """`dir=FOLDER` for a spec, nothing for the default: the specs of jobs writing
    there read as they always did."""
    return () if folder == DEFAULT_DIR else (("dir", folder),)
SOCKETS_ENV = "TORCHCHAOS_FAULTFS"  # JSON: checkpoint dir -> daemon socket path


@dataclass
class FaultFSMounts:
    """The fault filesystems of one job, one per checkpoint directory."""

    mounts: list = field(default_factory=list)  # torchchaos.faults.faultfs.mount.Mount
    environ: dict[str, str] = field(default_factory=dict)
    rendezvous_endpoint: str | None = None

    def settle(self) -> None:
        for mount in self.mounts:
            mount.settle()

    def close(self) -> None:
        for mount in self.mounts:
            mount.close()

# Chaos Mesh's names: the errno an IOChaos fault returns, and the FUSE method of an op.
ERRNOS = {"enospc": 28, "eio": 5}
IO_METHODS = {"open": "open", "create": "create", "write": "write", "truncate": "setattr",
              "fsync": "fsync", "fsyncdir": "fsyncdir", "rename": "rename", "unlink": "unlink",
              "rmdir": "rmdir", "mkdir": "mkdir", "link": "link", "read": "read"}


class Storage(FaultKind):
    name = "storage"
    marks = ("fault_applied", "fs_crash", "fs_bitrot")
    choices = {"mode": MODES}
    summary = ("checkpoint storage faults: power loss dropping unsynced data, torn write,"
               " ENOSPC/EIO, slow I/O, bit rot (FUSE)")
    params = {"mode": choice(MODES), "op": choice((*OPS, "any")), "count": positive_int,
              "keep": fraction, "delay": seconds, "duration": seconds, "file": str,
              "bits": positive_int, "dir": run_relative_dir, "via": choice(("fuse", "agent"))}

    def validate(self, params: dict[str, object]) -> None:
        if "mode" not in params:
            raise UsageError(f"storage needs mode= (one of {', '.join(MODES)})")
        if params.get("via") == "agent" and params["mode"] != "torn":
            raise UsageError("storage via=agent supports mode=torn only (the others need"
                             " the fault filesystem)")

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """The fault filesystem's (mode=torn,via=agent needs none, but every other does)."""
        from torchchaos.faults.faultfs.mount import unavailable_reason

        return unavailable_reason() or None

    def check_job(self, params: dict[str, object], nodes: int, network: str) -> None:
        if params.get("via", "fuse") != "fuse":
            return
        reason = self.unavailable_reason()
        if reason:  # known now, not after a reference run
            raise UsageError(f"storage faults need the fault filesystem: {reason}"
                             " (or mode=torn,via=agent)")

    def check_together(self, faults: list[dict[str, object]]) -> None:
        """Raise UsageError if the mounts of these faults (their params) would nest."""
        dirs = sorted({Path(str(p.get("dir", DEFAULT_DIR))) for p in faults
                       if p.get("via", "fuse") == "fuse"}, key=lambda d: len(d.parts))
        for number, outer in enumerate(dirs):
            for inner in dirs[number + 1:]:
                if outer == Path(".") or outer in inner.parents:
                    raise UsageError(f"storage faults on dir={outer} and dir={inner} cannot be"
                                     " combined: one folder is inside the other")

    def setup_job(self, faults: list[ResolvedFault], ctx: JobContext) -> JobResource:
        dirs = dict.fromkeys(str(f.params.get("dir", DEFAULT_DIR)) for f in faults
                             if f.params.get("via", "fuse") == "fuse")
        return _mount_all(list(dirs), ctx, record=False)

    def setup_recording(self, folder: str, ctx: JobContext) -> JobResource:
        """The fault filesystem over `folder` in recording mode, faulting nothing: every
        write's bytes and every path the job looks at go into the run's history (crash
        states are rebuilt from that record)."""
        return _mount_all([folder], ctx, record=True)

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        from hypothesis import strategies as st

        # a power loss on the writer's node right after a file event of one of its saves
        power_loss = st.builds(lambda p: f"storage:mode=lose_unsynced,rank={shape.writer},"
                                         f"phase=checkpoint_save,save={p[0]},event={p[1]}",
                               shape.a_save_point())
        return {"power_loss": power_loss if shape.save_events else None}

    def chaos_mesh(self, fault: ResolvedFault, job: ClusterJob) -> ClusterMapping:
        mode = str(fault.params["mode"])
        if mode == "lose_unsynced":
            raise NotExported("a power loss drops what was not fsynced and kills every process;"
                              " IOChaos cannot roll a volume back to what was durable")
        if mode == "torn":
            raise NotExported("a write cut short, then a crash; IOChaos can fail or corrupt a"
                              " write, not keep part of it")
        if mode == "bitrot":
            return job.read_mistake(fault, int(fault.params.get("bits", 1)))  # type: ignore[call-overload]
        spec = job.io_base(fault)
        op = str(fault.params.get("op", "write"))
        if mode == "slow":
            # The fault filesystem slows every operation for `duration` seconds.
            delay = float(fault.params.get("delay", 0.05))  # type: ignore[arg-type]
            spec.update(action="latency", delay=job.go_duration(delay))
            duration = float(fault.params.get("duration", 10.0))  # type: ignore[arg-type]
            return [ClusterChaos("IOChaos", spec, duration)], ""
        spec.update(action="fault", errno=ERRNOS[mode], percent=100)
        if op != "any":
            spec["methods"] = [IO_METHODS[op]]
        count = fault.params.get("count", 1)
        return [ClusterChaos("IOChaos", spec)], (f"torchchaos fails the next {count} {op}"
                                                 " operation(s); IOChaos fails every one"
                                                 " while it is in force")

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        params = fault.params
        mode = str(params["mode"])
        if params.get("via") == "agent":
            _tear_in_process(ctx, float(params.get("keep", 0.5)))  # type: ignore[arg-type]
            return
        from torchchaos.faults.faultfs.client import request

        socket_path = json.loads(os.environ[SOCKETS_ENV])[str(params.get("dir", DEFAULT_DIR))]
        if mode == "lose_unsynced":
            command = {"cmd": "crash", "lose_unsynced": True}
        elif mode == "bitrot":
            command = {"cmd": "bitrot", "file": params.get("file"), "bits": params.get("bits", 1),
                       "seed": fault.seed, "crash": True}
        else:
            command = {"cmd": "arm", "mode": mode, **{k: v for k, v in params.items()
                                                       if k in ("op", "count", "keep", "delay",
                                                                "duration")}}
        reply = request(socket_path, {**command, "fault_id": fault.id})
        ctx.record("fault_applied", id=fault.id, reply=reply)  # not reached after a crash


def _mount_all(dirs: list[str], ctx: JobContext, record: bool) -> FaultFSMounts:
    from torchchaos.faults.faultfs.mount import Mount  # the harness side only

    resource = FaultFSMounts()
    layout = RunLayout(ctx.run_dir)
    try:
        for number, folder in enumerate(dirs):
            mountpoint = _mountpoint(ctx.run_dir, folder)
            slug = _slug(number, folder)
            state = layout.chaos_dir / "faultfs" / slug
            history = layout.history_dir / f"faultfs-{slug}.jsonl"
            blobs = layout.chaos_dir / "faultfs" / f"{slug}.blobs" if record else None
            # over the whole run dir, the harness's own folder stays out of the model
            private = (CHAOS_DIR,) if mountpoint == ctx.run_dir.resolve() else ()
            mount = Mount(mountpoint, state, history, ctx.run_id, private, blobs)
            resource.mounts.append(mount)
            mount.start()
    except BaseException:
        resource.close()
        raise
    names = {folder: m.socket_path for folder, m in zip(dirs, resource.mounts)}
    resource.environ[SOCKETS_ENV] = json.dumps(names)
    return resource


def _slug(number: int, folder: str) -> str:
    """The name of a mount's state folder and history stream: unique by number,
    readable by folder (`0-ckpt`, `1-rundir` for `.`)."""
    name = "rundir" if folder == "." else re.sub(r"[^A-Za-z0-9_.-]", "_", folder)
    return f"{number}-{name}"


def _mountpoint(run_dir: Path, folder: str) -> Path:
    """The folder to mount over, created if missing; UsageError if it cannot be one
    (a file is there, or a symlink leads out of the run directory or into `_chaos/`)."""
    path = run_dir / folder
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"storage dir={folder}: cannot be used as a folder in the run"
                         f" directory: {exc.strerror or exc}") from None
    real, top = path.resolve(), run_dir.resolve()
    if real != top and (top not in real.parents or (top / CHAOS_DIR) in (real, *real.parents)):
        raise UsageError(f"storage dir={folder}: leads to {real}, outside the run directory"
                         " or into the harness's own folder")
    return real


def _tear_in_process(ctx: FireContext, keep: float) -> None:
    """Cut the file just written to `keep` of its size, then the node dies with it."""
    from torchchaos.faults.kill import Kill

    if ctx.path and os.path.isfile(ctx.path):
        size = os.path.getsize(ctx.path)
        os.truncate(ctx.path, int(size * keep))
        ctx.record("fault_applied", torn=ctx.path, size=size, kept=int(size * keep))
    Kill().kill_node("SIGKILL", 0.0, 0)
