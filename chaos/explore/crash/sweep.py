"""Crash states of one save, judged from one recording: `torchchaos crashpoints`.

1. **Record once.** One run of the job, from step 0 to the step after save
   `--save`, with the fault filesystem in recording mode over the checkpoint
   folder: every operation of every rank, in order, with its bytes, and the
   collectives each rank entered (torchchaos.rank.syncwatch). The recording is kept
   in the cache beside the reference (two recordings of one save differ, and
   shards, `--shard I/N`, must judge one) and linked into OUT/record.
2. **Plan** the crash states of that save from the record
   (`torchchaos.explore.crash.states`): kills after each operation, torn writes, power
   losses with every combination of pending changes lost; with `--cap`, a sample
   across the modes. Then **build** them one at a time as the record is replayed:
   a state's files are extents of the recording's blob file, never its bytes.
3. **Recover once per view.** A state's recovery is a fresh start of the job
   on its folder image (what a restart finds), `--steps-after-resume` steps,
   the image laid out under the recovery's recording mount with no copy of its
   bytes (the daemon reads them from the recording's blob file),
   with the recording filesystem noting what the recovery looked at. A later
   state whose image shows the same things at those paths (same names, same
   bytes) recovers the same way: its recovery is not run again.
4. **Judge each state** with the same checks as a chaos run, over a history
   made of the record up to the crash, the crash itself, and the recovery's
   history after it (as a restart that found this folder). A state that does not
   pass gets a replay file with the nearest chaos-run fault (its rank's last file
   event before the crash), and its report lists the save's operations up to it;
   the recovery's folder keeps what rebuilds the image it started from
   (`image.json`: `python -m torchchaos.explore.crash.states image.json DIR`): its
   checkpoint folder holds only sizes, and goes once it ended.

A recovery whose resume read the checkpoint and died before its first step is
stopped at that death (`torchchaos.harness.repeats`): the judge calls it a failed
resume whatever a restart does. One that died before it read anything is restarted
once (`--max-restarts 1`, no relaunch): a restart that trains makes it a false
start (`Evidence.false_starts`); waiting for every requeue would only cost time.
"""

from __future__ import annotations

import bisect
import dataclasses
import fcntl
import json
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from torchchaos import env
from torchchaos.engine import prepare_out_dir, publish
from torchchaos.errors import CannotJudge, UsageError
from torchchaos.explore.crash.record import PlacedCrash, Places, Record, load_record, ranks_of
from torchchaos.explore.crash.states import (
    CrashState,
    Enumeration,
    StateSpec,
    Unsupported,
    View,
    build_states,
    coverage,
    describe,
    lay,
    plan_states,
    recovery_view,
    sample_specs,
    view_key,
)
from torchchaos.explore.crash.warm import HeldJob
from torchchaos.explore.rows import Entry
from torchchaos.explore.shards import Shard, link_or_copy
from torchchaos.harness.evidence_from import checkpoint_findings, evidence_from
from torchchaos.harness.hangwatch import default_timeout
from torchchaos.harness.reference import Reference, get_reference
from torchchaos.harness.runner import Job, JobOutcome
from torchchaos.host import seen_at
from torchchaos.progress import Progress
from torchchaos.report.verdict import judge
from torchchaos.rundir import checkpoint_files
from torchchaos.rundir.folders import write_atomic
from torchchaos.rundir.history import Event, History
from torchchaos.rundir.written import files_differ, holds_bytes, written_files
from torchchaos.scenario import schedule
from torchchaos.scenario.model import Scenario

RESTART_GAP = 0.5  # seconds between a crash and its recovery in a judged history
DONE = "done"  # in a cached recording, written last: its files, with sizes and digests
IMAGE_FILE = "image.json"  # in a recovery's folder: what rebuilds the image it started from
# A recovery that loads a folder this big keeps both cores busy after its start-up (the
# fault filesystem's daemon serves its reads): the next recovery warms up after it
# ended, not beside it (bench/warm_recoveries.py: at 1 GB per rank beside it cost 7%,
# after it saved 13%; at 1 MB beside it saved 9%, after it nothing).
BUSY_LOAD_BYTES = 64 << 20
# recoveries kept held while small ones run: a warm one is over before a cold one starts
WARM_AHEAD = 2
SHOWN_OPERATIONS = 40  # a report lists at most the last this many operations before a crash


@dataclass
class StateRecovery:
    """One recovery run and what it looked at."""

    run_dir: Path
    outcome: JobOutcome
    history: History
    view: View
    key: str  # view_key of the image it started from
    states: int = 0  # states it stands for
    # what its checkpoint folder held at its end, by names and sizes (the folder is
    # removed then; its files were holes sized as the recording's)
    findings: list[checkpoint_files.Finding] = field(default_factory=list)


@dataclass
class Sweep:
    entries: list[Entry]  # one per planned state, in order (another shard's: the plan only)
    numbers: list[int]  # the states (1-based) judged here: all of them, or a shard's
    total: int  # crash states that exist
    candidates: int  # planned at the chosen cuts (before --cap)
    distinct_images: int = 0  # among the states built (every planned one, in every shard)
    covers: str = ""  # what the sample covers, mode by mode (states.coverage)
    recoveries: list[StateRecovery] = field(default_factory=list)
    recovery_of: dict[int, StateRecovery] = field(default_factory=dict)  # state -> its recovery
    seconds: float = 0.0

    def groups(self) -> dict[int, str]:
        """State number -> the name of the recovery that served it (its folder's)."""
        return {n: recovery.run_dir.parent.name for n, recovery in self.recovery_of.items()}


def sweep(base: Scenario, out_dir: Path, cache_dir: Path, progress: Progress, save: int,
          modes: list[str], cap: int | None, steps_after: int,
          shard: Shard | None = None) -> Sweep:
    started = time.monotonic()
    reference = get_reference(base, cache_dir, progress)
    folder = _folder(reference.history(), save)
    prepare_out_dir(out_dir)
    scenario = dataclasses.replace(base, stop_after=steps_after, max_restarts=1,
                                   max_relaunches=0, faults=[],
                                   env={**base.env, env.RECOVERY: "1"})
    # The first recoveries warm up while the recording is made or read and the states
    # are planned: an unsharded sweep's first state is state 1 (a shard learns its own
    # from the plan). Its start-up is then no part of the first recovery's seconds.
    early = [_hold(scenario, reference, out_dir / "recoveries" / f"{n:03d}", folder, progress)
             for n in range(1, WARM_AHEAD + 1)] if (
        shard is None and _warm_early(reference, cache_dir, folder, save)) else []
    try:
        record, seen_at_path, specs, crashes, result = _plan(
            base, reference, cache_dir, out_dir, folder, save, modes, cap, shard, progress)
    except BaseException:
        for job in early:
            _drop(job)
        raise
    if seen_at_path is not None:  # held where they are: they must start where it ran
        for job in early:
            _drop(job)
        early = []
    try:
        _judge_states(base, reference, record, specs, crashes, scenario, folder, out_dir,
                      result, progress, early, seen_at_path)
    except KeyboardInterrupt as exc:  # the recovery's processes are reaped by now
        result.seconds = time.monotonic() - started
        done = sorted(n for n in result.numbers if result.entries[n - 1].report is not None
                      or result.entries[n - 1].error)
        raise Interrupted(result, done) from exc
    result.seconds = time.monotonic() - started
    return result


def _warm_early(reference: Reference, cache_dir: Path, folder: str, save: int) -> bool:
    """Start the first recovery before the recording? Where the recording is still to be
    made and the checkpoints are big, a recovery warming up beside it costs the
    recording more than it saves (at 1 GB per rank the sweep took 1.17x as long, pairs
    of cold runs on 2 cores); where it is cached, or the checkpoints small (1 MB per
    rank: 0.93x), its start-up is hidden."""
    if (_cache_entry(cache_dir, reference, save) / DONE).exists():
        return True
    saved = sum(p.stat().st_size for p in (reference.run_dir / folder).rglob("*")
                if p.is_file() and not p.is_symlink())
    return saved < BUSY_LOAD_BYTES


def _plan(base: Scenario, reference: Reference, cache_dir: Path, out_dir: Path, folder: str,
          save: int, modes: list[str], cap: int | None, shard: Shard | None,
          progress: Progress
          ) -> tuple[Record, Path | None, list[StateSpec], list[PlacedCrash], Sweep]:
    """The recording (made or reused), where recoveries see their folder, the states
    planned from it and where each crash falls; the sweep's result, nothing judged yet."""
    record, seen_at_path = _recording(base, reference, cache_dir, out_dir, folder, save,
                                      progress)
    found, specs = planned_states(record, modes, base.seed, cap)
    covers = coverage(specs, found.specs)
    numbers = shard.numbers(len(specs)) if shard else list(range(1, len(specs) + 1))
    progress(f"save {save}: {found.total} crash state(s) exist, {len(found.specs)} at the"
             f" chosen cuts, {len(specs)} planned ({covers}); judging"
             f" {len(numbers)}" + (f" (shard {shard}: states {', '.join(map(str, numbers))})"
                                   if shard else ""))
    places = Places(record, save, folder)
    crashes = [places.crash(spec) for spec in specs]
    plan = [Entry(spec.detail, crash.spec) for spec, crash in zip(specs, crashes)]
    result = Sweep(plan, numbers, found.total, len(found.specs), covers=covers)
    return record, seen_at_path, specs, crashes, result


class Interrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C or SIGTERM, with what it had judged (`judged`: 1-based
    state numbers) for the partial table and pages."""

    def __init__(self, result: Sweep, judged: list[int]) -> None:
        super().__init__(f"interrupted after {len(judged)} of {len(result.numbers)} state(s)")
        self.result = result
        self.judged = judged


def _judge_states(base: Scenario, reference: Reference, record: Record,
                  specs: list[StateSpec], crashes: list[PlacedCrash], scenario: Scenario,
                  folder: str, out_dir: Path, result: Sweep, progress: Progress,
                  early: list[HeldJob] | None = None, seen_at_path: Path | None = None
                  ) -> None:
    """Build each planned state, recover (or reuse a recovery that read the same
    bytes) and judge it; into `result` as it goes. `early`: the recoveries held for the
    first states, if started already; `seen_at_path`: where recoveries see their folder."""
    numbers = result.numbers
    judged, digests = set(numbers), set()
    held: list[HeldJob] = list(early or [])

    def hold_ahead(after: int, ahead: int) -> None:
        """Keep `ahead` recoveries held for states judged after state `after`, each named
        by a state it could serve (unique across shards, which judge apart)."""
        following = numbers[bisect.bisect_right(numbers, after):]
        names = (out_dir / "recoveries" / f"{n:03d}" for n in following)
        free = (path for path in names if not path.exists())
        while len(held) < min(ahead, len(following)):
            path = next(free, None)
            if path is None:
                return
            held.append(_hold(scenario, reference, path, folder, progress, seen_at_path))

    hold_ahead(0, 1)
    try:
        for number, state in enumerate(states_of(record, specs), 1):
            digests.add(state.digest)  # every shard builds every state: they agree on the count
            if number not in judged:
                continue
            recovery = _matching(result.recoveries, state)
            if recovery is None:
                assert held, "a state to recover with no recovery held for it"
                running = _begin_recovery(held.pop(0), state, record, progress)
                small = _image_bytes(state) < BUSY_LOAD_BYTES
                if small:
                    # a small recovery is over in a fraction of a second once warm: the
                    # next two warm up while it runs and its states are judged
                    running.wait_started()
                    hold_ahead(number, WARM_AHEAD)
                recovery = _end_recovery(running, folder, state)
                if not small:  # after a big load: while the states it covers are judged
                    hold_ahead(number, 1)
                result.recoveries.append(recovery)
            recovery.states += 1
            result.recovery_of[number] = recovery
            entry = _judge(base, reference, record, recovery, state, crashes[number - 1],
                           folder, out_dir / f"{number:03d}")
            result.entries[number - 1] = entry
            verdict = entry.report.verdict.upper() if entry.report else "ERROR"
            progress(f"[{number}/{len(specs)}] {verdict:<5} {entry.name}"
                     f" ({len(result.recoveries)} recoveries run)")
    finally:
        for job in held:  # no state needed them: gone before their script ran
            _drop(job)
    result.distinct_images = len(digests)


def _drop(held: HeldJob) -> None:
    """A held recovery no state needs: cancelled before its script ran, its folder gone."""
    held.cancel()
    shutil.rmtree(held.job.layout.run_dir.parent, ignore_errors=True)


def planned_states(record: Record, modes: list[str], seed: int,
                   cap: int | None) -> tuple[Enumeration, list[StateSpec]]:
    """Every crash state of the recorded save, and the sample of them to judge."""
    try:
        found = plan_states(record.ops, record.first, modes, seed, ranks=ranks_of(record))
    except Unsupported as exc:
        raise CannotJudge(f"the recorded save cannot be replayed: {exc}; use --per-point"
                          ) from None
    return found, sample_specs(found.specs, cap, seed)


def states_of(record: Record, specs: list[StateSpec]) -> Iterator[CrashState]:
    """The planned states, built one at a time (drop each once it is judged)."""
    return build_states(record.ops, record.blobs, record.first, specs)


def _folder(history: History, save: int) -> str:
    if not any(e.get("save") == save for e in history.of("file")):
        saves = max((e.get("save", 0) for e in history.of("file")), default=0)
        raise UsageError(f"the reference run made {saves} checkpoint save(s) with file events;"
                         f" --save {save} does not exist")
    folder = history.checkpoint_dir(save)
    if folder is None:
        raise UsageError(f"save {save} writes in several top-level folders of the run"
                         " directory (or outside it): the recording needs one folder;"
                         " use --per-point")
    return folder


def _recording(base: Scenario, reference: Reference, cache_dir: Path, out_dir: Path,
               folder: str, save: int, progress: Progress) -> tuple[Record, Path | None]:
    """The save's cached recording, linked into OUT/record; and the path each recovery
    must see its run directory at (the recording's), where a checkpoint names it."""
    cached = _cached_recording(base, reference, cache_dir, folder, save, progress)
    shutil.copytree(cached, out_dir / "record", symlinks=True, copy_function=link_or_copy)
    record = load_record(out_dir / "record", save)
    if record.blobs.path is None or not holds_bytes(record.blobs.path, str(cached.resolve())):
        return record, None
    if why := seen_at.unavailable_reason():
        raise CannotJudge(f"the recorded save writes the recording run's own folder {cached}"
                          " into a checkpoint, so each recovery must see its folder there"
                          f" (a mount namespace of its own), and here {why}: run as root,"
                          " or use --per-point")
    progress(f"the recorded save writes its own folder {cached} into a checkpoint: each"
             " recovery runs with its folder mounted there, as if it resumed where the job"
             " ran")
    return record, cached.resolve()


def record_only(base: Scenario, cache_dir: Path, progress: Progress, save: int) -> Path:
    """`crashpoints --record-only`: the reference and the recording, made in the cache for
    shards that share no storage to be handed; the recording's folder."""
    reference = get_reference(base, cache_dir, progress)
    folder = _folder(reference.history(), save)
    return _cached_recording(base, reference, cache_dir, folder, save, progress)


def _cache_entry(cache_dir: Path, reference: Reference, save: int) -> Path:
    """Where the cache keeps the recording of save `save`, beside its reference."""
    return cache_dir / f"{reference.run_dir.parent.name}-save{save}"


def _cached_recording(base: Scenario, reference: Reference, cache_dir: Path, folder: str,
                      save: int, progress: Progress) -> Path:
    """The recording run of save `save`, made once per job and save and kept in the cache
    beside the reference: two recordings of one save differ (a temporary file's random
    name, the ranks' interleaving), and the shards of one sweep, or a sweep run again,
    must judge the same states."""
    entry = _cache_entry(cache_dir, reference, save)
    with open(entry.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two shards on one cache record it once
        if _whole(entry, progress):
            progress(f"recording: reusing the cached recording of save {save} ({entry})")
        else:
            if entry.exists():  # interrupted or damaged: a folder this harness made
                shutil.rmtree(entry)
            _record(base, reference, entry / "run", folder, save, progress)
            # last and atomically, naming every file with its size and digest
            write_atomic(entry / DONE, json.dumps(
                {"files": written_files(entry, [entry / "run"], sync=True)}))
    return entry / "run"


def _whole(entry: Path, progress: Progress) -> bool:
    """Is the cached recording there and unchanged since it was made? A damaged one is
    said, naming the file, and made again: crash states are never built from it."""
    marker = entry / DONE
    if not marker.exists():
        return False  # never made, or a recording cut short
    try:
        files = json.loads(marker.read_text())["files"]
        why = files_differ(entry, [entry / "run"], files, marker) if isinstance(
            files, dict) else f"{marker} names no files"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = f"{marker} does not read as a recording's marker ({exc!r})"
    if why:
        progress(f"recording: the cached recording {entry} is damaged: {why}; recording"
                 " again")
    return not why


def _record(base: Scenario, reference: Reference, run_dir: Path, folder: str, save: int,
            progress: Progress) -> Record:
    """Run the job once to the step after save `save`, recording the folder."""
    begins = [e for e in reference.history().of("save_begin") if e.get("save") == save]
    after = max(e["after_step"] for e in begins)
    scenario = dataclasses.replace(base, faults=[], stop_after=1, max_restarts=0,
                                   max_relaunches=0,
                                   env={**base.env, env.STOP_AT_STEP: str(after + 1),
                                        env.RECORD_SYNC: "1"})
    progress(f"recording save {save} (steps 1 to {after + 1}) with the fault filesystem"
             f" over {folder}/")
    run_dir.mkdir(parents=True)
    outcome = Job(scenario, run_dir, [], reference.run_dir, progress,
                  default_timeout(reference.history()), record=folder, warm=True).run()
    if not outcome.stopped:
        raise CannotJudge(f"the recording run did not reach step {after + 1}:"
                          f" {outcome.log_tail() or 'no error printed'}")
    return load_record(run_dir, save)


def _matching(recoveries: list[StateRecovery], state: CrashState) -> StateRecovery | None:
    for recovery in recoveries:
        if view_key(state.image, recovery.view) == recovery.key:
            return recovery
    return None


def _image_bytes(state: CrashState) -> int:
    return sum(entry[1].size for entry in state.image.values() if entry[0] == "file")


def _hold(scenario: Scenario, reference: Reference, run_dir: Path, folder: str,
          progress: Progress, seen_at_path: Path | None = None) -> HeldJob:
    """A recovery's job started now, held before its script runs until a state is
    chosen for it (`torchchaos.explore.crash.warm`); seeing its folder at `seen_at_path`
    where given."""
    chaos_dir = run_dir / "chaos"
    chaos_dir.mkdir(parents=True)
    return HeldJob(lambda gate: Job(scenario, chaos_dir, [], reference.run_dir, progress,
                                    default_timeout(reference.history()), record=folder,
                                    gate=gate, warm=True, seen_at=seen_at_path))


def _begin_recovery(held: HeldJob, state: CrashState, record: Record,
                    progress: Progress) -> HeldJob:
    """Let the held job recover from the state's folder image (laid out under its
    recording mount: `states.lay`)."""
    progress(f"recovery from the folder of: {state.detail}")
    chaos_dir = held.job.layout.run_dir
    (chaos_dir.parent / IMAGE_FILE).write_text(json.dumps(describe(state, record.blobs.path)))
    held.open(lambda mount: lay(state.image, mount, record.blobs.path, state.order))
    return held


def _end_recovery(running: HeldJob, folder: str, state: CrashState) -> StateRecovery:
    """The recovery once it ended, and what it looked at."""
    outcome = running.outcome()
    chaos_dir = running.job.layout.run_dir
    history = History.of_run(chaos_dir)
    view = recovery_view(history.of("fs", "fs_read"))
    checkpoints = chaos_dir / folder
    findings = checkpoint_findings(history, chaos_dir, [folder], contents=False)
    if folder != "." and checkpoints.is_dir() and not checkpoints.is_symlink():
        # sizes and holes (the bytes were the recording's and the recovery's blob
        # files'); IMAGE_FILE rebuilds what it started from
        shutil.rmtree(checkpoints)
    return StateRecovery(chaos_dir, outcome, history, view, view_key(state.image, view),
                         findings=findings)


# -- judging -----------------------------------------------------------------
def _judge(base: Scenario, reference: Reference, record: Record, recovery: StateRecovery,
           state: CrashState, crash: PlacedCrash, folder: str, out_dir: Path) -> Entry:
    t_cut, rank, process, spec = crash.t_cut, crash.rank, crash.process, crash.spec.parse()
    fault = schedule.resolve([spec], base.seed, base.nproc, base.nodes)[0]
    events = [e for e in record.history.events
              if (e["t"] <= t_cut and e["ev"] != "stopped") or _echo(e, crash, folder)]
    # the crash follows every operation up to the cut, the ranks' words for them too
    t_crash = max([t_cut] + [e["t"] + 1e-6 for e in events if e["t"] > t_cut])
    events.append({"ev": "fault", "t": t_crash, "rank": rank, "pid": process["pid"],
                   "launch": process["launch"], "attempt": process["attempt"],
                   "id": fault.id, "kind": fault.kind, "spec": spec.text, "target": f"rank:{rank}",
                   "step": max((e["step"] for e in events if e["ev"] == "step"
                                and e.get("rank") == rank), default=0), "params": {}})
    if state.mode != "kill":
        events.append(_fs_crash(state, fault.id, t_crash))
    events += _after_crash(recovery.history, state, process, t_cut)
    events.sort(key=lambda e: e["t"])
    outcome = recovery.outcome
    hang_timeout = base.hang_timeout or default_timeout(reference.history())
    evidence = evidence_from(History(events), outcome, reference, base, recovery.run_dir,
                             hang_timeout, recovery.findings)
    report = judge(evidence, [fault], base.checks, run_dir=str(recovery.run_dir),
                   reference_dir=str(reference.run_dir), wall_seconds=outcome.wall_seconds,
                   crash_state=state.detail, recording=str(record.run_dir),
                   operations=_operations(record, state))
    out_dir.mkdir()
    # its replay file: the nearest chaos run, which `torchchaos replay` runs
    publish(report, out_dir, evidence, dataclasses.replace(base, faults=[spec]), [fault],
            lambda _msg: None, only_failures=True)
    return Entry(f"{state.detail}", crash.spec, report)


def _echo(event: Event, crash: PlacedCrash, folder: str) -> bool:
    """The agent's word for an operation in the recorded folder at or before the cut: a
    rank says what it did once the call returned, after the filesystem saw it, so the
    word for the operation the crash follows comes after the cut (and before that
    rank's next operation; other ranks' operations may come between). Without it, a
    crash right after a delete reads as if the file had vanished on its own."""
    return (event["ev"] == "file" and crash.t_cut < event["t"] < crash.t_next
            and event.get("pid") == crash.writer
            and str(event.get("path", "")).startswith(folder.rstrip("/") + "/"))


def _fs_crash(state: CrashState, fault_id: str, t_cut: float) -> Event:
    """What the filesystem dropped, as a chaos run's `fs_crash` says it."""
    return {"ev": "fs_crash", "t": t_cut + 1e-4, "source": "faultfs",
            "lose_unsynced": state.mode == "lose_unsynced", "killed": [], "fault": fault_id,
            **(state.dropped or {"removed": [], "reverted_files": [], "restored": []})}


def _after_crash(history: History, state: CrashState, crashed: Event,
                 t_cut: float) -> list[Event]:
    """The recovery's events as the restart after this crash: a kill or a torn write
    restarts the workers (the next attempt), a power loss relaunches the job."""
    t0 = min(e["t"] for e in history.events)
    shift = t_cut + RESTART_GAP - t0
    launch, attempt = crashed["launch"], crashed["attempt"]
    moved = []
    for e in history.events:
        e = {**e, "t": e["t"] + shift}
        if "launch" in e:
            if state.mode == "lose_unsynced":
                e["launch"] += launch + 1
            elif e["launch"] == 0:
                e["launch"] = launch
                if "attempt" in e:
                    e["attempt"] += attempt + 1
            else:
                e["launch"] += launch
        moved.append(e)
    return moved


def _operations(record: Record, state: CrashState) -> list[str]:
    """The save's operations that led to the state, for the report: the last
    SHOWN_OPERATIONS of them (a save of 1 GB is thousands of writes)."""
    start = max(record.first, state.cut - SHOWN_OPERATIONS)
    shown = [f"... {start - record.first} earlier operation(s) of the save"] if (
        start > record.first) else []
    for op in record.ops[start:state.cut]:
        to = f" -> {op['to']}" if op["op"] == "rename" else ""
        size = f" {op['size']} bytes at {op['offset']}" if op["op"] == "write" else ""
        shown.append(f"{op['op']} {op.get('path') or '.'}{to}{size}")
    return shown


def summary(result: Sweep, save: int) -> str:
    judged = [result.entries[n - 1] for n in result.numbers]
    each = sum(r.outcome.wall_seconds for r in result.recoveries) / max(
        len(result.recoveries), 1)
    counts = _counts(save, judged, result.total, result.candidates, len(result.entries),
                     result.distinct_images, result.covers, len(result.recoveries))
    return f"{counts}; {result.seconds:.0f} s in all, {each:.1f} s per recovery"


def _counts(save: int, judged: list[Entry], total: int, candidates: int, built: int,
            distinct: int, covers: str, recoveries: int) -> str:
    """How many states exist, were planned at the chosen cuts, built (with what a
    sample covers), judged and distinct, and what they cost in recoveries."""
    failed = sum(1 for e in judged if e.report and e.report.verdict == "fail")
    sampled = f": {covers}" if built < candidates else ""
    return (f"save {save}: {len(judged)} of {total} crash states judged ({candidates} at"
            f" the chosen cuts, {built} built{sampled}; {distinct} distinct folder images),"
            f" {recoveries} recoveries run, {failed} broke the protocol")


def shard_extra(base: Scenario, result: Sweep, save: int, modes: list[str],
                cap: int | None) -> dict[str, object]:
    """What every shard of one sweep agrees on, beyond the plan: how the states were
    drawn, and how many there are."""
    return {"save": save, "modes": modes, "cap": cap, "seed": base.seed,
            "total": result.total, "candidates": result.candidates,
            "distinct": result.distinct_images, "covers": result.covers}


def shard_details(result: Sweep) -> dict[str, object]:
    """A shard's own: each recovery it ran, with what it looked at, and which recovery
    served which of its states; the merge groups the states as one sweep would have."""
    return {"recoveries": {r.run_dir.parent.name: {"view": r.view, "key": r.key}
                           for r in result.recoveries},
            "groups": {str(n): name for n, name in result.groups().items()}}


def merged_groups(record_dir: Path, extra: dict, details: list[dict]) -> dict[int, str]:
    """The recovery each state of the merged shards has as its group: the shards' states
    drawn again from the one recording, then `canonical_groups`."""
    record = load_record(record_dir, extra["save"])
    _, specs = planned_states(record, extra["modes"], extra["seed"], extra["cap"])
    views = {name: ([(op, path) for op, path in r["view"]], r["key"])
             for d in details for name, r in d["recoveries"].items()}
    used = {int(n): name for d in details for n, name in d["groups"].items()}
    return canonical_groups(states_of(record, specs), used, views)


def canonical_groups(states: Iterable[CrashState], used: dict[int, str],
                     views: dict[str, tuple[View, str]]) -> dict[int, str]:
    """State number -> the recovery one unsharded sweep would have served it with: the
    first one, in state order, whose view the state's image shows the same way; where
    none does, the one its shard ran (a recovery started from any state it matches
    behaves the same: that is what a view means). `used`: the recovery each state had in
    its shard; `views`: each recovery's view and key."""
    chosen: list[str] = []
    groups = {}
    for number, state in enumerate(states, 1):
        if number not in used:
            continue
        name = next((c for c in chosen if view_key(state.image, views[c][0]) == views[c][1]),
                    None)
        if name is None:
            name = used[number]
            chosen.append(name)
        groups[number] = name
    return groups


def merged_summary(entries: list[Entry], extra: dict, groups: dict[int, str],
                   shards: int, ran: int) -> str:
    counts = _counts(extra["save"], entries, extra["total"], extra["candidates"],
                     len(entries), extra["distinct"], extra["covers"],
                     len(set(groups.values())))
    return f"{counts} (merged from {shards} shards, which ran {ran} recoveries)"


def report_rows(entries: list[Entry], numbers: list[int], groups: dict[int, str]) -> list[Entry]:
    """The table's rows: one per group of states that share a recovery (`groups`: state
    number -> recovery) and the same outcome of every check (the first state names it,
    with how many more), so that a save with hundreds of states reads in a screen. Every
    state has its own report."""
    rows: dict[tuple, list[Entry]] = {}
    for number in numbers:
        entry = entries[number - 1]
        report = entry.report
        outcome = tuple(sorted((n, c["ok"]) for n, c in report.checks.items())) if report else ()
        key = (groups[number] if report else entry.error, outcome)
        rows.setdefault(key, []).append(entry)
    shown = []
    for members in rows.values():
        first = members[0]
        more = f" (+{len(members) - 1} like it)" if len(members) > 1 else ""
        shown.append(dataclasses.replace(first, name=first.name + more))
    return shown
