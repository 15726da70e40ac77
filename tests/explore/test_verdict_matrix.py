"""The verdict matrix: the harness judged on training code written apart from it.

Eight torchrun targets under tests/matrix/targets/, each in another team's
style, each with a correct variant and planted bugs:

- shard_pointer: per-rank shard files, rank 0 moves a `latest` pointer, barriers;
- epoch_snapshot: DDP LM, rank 0 torch.saves one snapshot per epoch (temp + replace);
- flat_files: safetensors weights, torch.save optimizer, numpy.save data order,
  a JSON state written last, keep-last-N rotation;
- folder_publish: `tmp-step-N/` folders fsynced and renamed to `step-N/`;
- rank_folders: each rank's own folder `out/rankR/`, temp + fsync + rename, the two
  newest kept, the ranks agreeing on the newest step they all have;
- async_tracker: one long-lived writer thread per rank (the training thread writes
  nothing but rank 0's tracker), `global_step_N/` folders, a tracker file published
  once every rank's writer finished (verl's and Megatron's layout);
- dcp_latest: DCP's async_save into `step_N/`, published by a `latest` symlink swapped
  by a rename once the save is durable;
- barrier_save: a recipe class whose synchronous save meets at barriers, per-rank
  shard files in `epoch_0_step_N/` and a `LATEST` symlink (recipe-style trainers);
- shard_pointer once more with its folder named run_state/ (one bug case).

Correct variants go through battery rows (torchchaos.explore.battery.plan), every crash state
of save 2 judged from one recording (torchchaos.explore.crash.sweep, as `torchchaos crashpoints`
runs it) and crash points of save 2 run one chaos run each (torchchaos.explore.crash.points.plan,
`--per-point`): any check False is a false alarm. Each bug goes through the one
fault that exposes it: the check declared below must fail, naming the cause where
words are given; and through the crash states of save 2, where some state must fail
that check the same way. The tally (tests/matrix/tally.py) prints the matrix at the
end of the session and writes verdict-matrix.json into pytest's temporary folder.
CI runs, on each correct variant, every crash state of save 2 and three battery rows
(each row on one or two targets), and each bug's per-point case; -m slow runs
every row, per-point crash points (a sample and every one), the bugs' crash-state
sweeps and 5 rounds of each case.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from matrix.runs import (
    BatteryRow,
    OnEvent,
    Target,
    progress,
    reference_history,
    run_one,
    sweep_states,
)
from matrix.tally import Incident, MatrixPlugin, Outcome, Tally

from torchchaos.explore import battery
from torchchaos.explore.crash import points as crashpoints
from torchchaos.explore.crash import shapes
from torchchaos.explore.crash import sweep as crashsweep
from torchchaos.explore.rows import Entry
from torchchaos.faults.faultfs.mount import unavailable_reason
from torchchaos.harness.reference import get_reference
from torchchaos.rundir.history import History
from torchchaos.scenario.spec import Spec

TARGETS = {t.name: t for t in [
    Target("shard_pointer", ("--ckpt-dir", "ckpt")),
    Target("epoch_snapshot", ("--out", "checkpoints", "--epochs", "3")),
    Target("flat_files", ("--save-dir", "state", "--keep", "1")),
    Target("folder_publish", ("--output-dir", "outputs/run1")),
    Target("rank_folders", ("--out", "out")),
    Target("async_tracker", ("--save-dir", "ckpts")),
    Target("dcp_latest", ("--ckpt", "checkpoints")),
    Target("barrier_save", ("--checkpoint-dir", "checkpoints")),
]}
# The same sharded trainer with its folder named otherwise: the harness must find the
# checkpoints wherever the job keeps them (only its bug case runs).
ELSEWHERE = Target("shard_pointer_elsewhere", ("--ckpt-dir", "run_state"), file="shard_pointer")
ALL_TARGETS = {**TARGETS, ELSEWHERE.name: ELSEWHERE}
# One that stores its folder's absolute path in every checkpoint and saves there after a
# resume: its crash states must be recovered where the recording ran.
# A save every 2 steps, so that a recovery's 3 steps save again, where the checkpoint says.
OWN_PATH = Target("rank_folders_own_path", ("--out", "out", "--own-path", "--save-every", "2",
                                            "--steps", "9"), file="rank_folders")

# The battery's rows, by what their names (torchchaos.explore.battery.plan) contain.
ROWS = {
    "kill rank 0": "kill rank 0 at step",
    "kill rank 1": "kill rank 1 at step",
    "kill node 0": "kill node 0 at step",
    "kill mid-write": "mid-write in its 2nd save",
    "kill after rename": "right after a rename in its 2nd save",
    "torn last write": "last write in its 2nd save",
    "power loss": "power loss on rank",
    "preempt": "preempt rank 0",
    "stop mid-write": "stop rank 0 mid-write",
}
# Targets whose correct variant keeps torch's default collective timeout (30 minutes on
# gloo): a rank stopped in its save holds its peers that long, which the stop row rightly
# fails; they are judged on every other row.
DEFAULT_TIMEOUTS = {"shard_pointer", "epoch_snapshot", "flat_files", "folder_publish",
                    "rank_folders"}
# CI: on every target two rows outside saves and one inside save 2, so that each row
# outside saves runs on two targets and each row inside a save on one (a real kill at
# a file event, the agent's torn write, a real power loss); every crash state of save 2
# of every target is judged besides (the crash-state test). -m slow: every row on
# every target.
CI_ROWS = {
    "shard_pointer": ("kill rank 0", "kill node 0", "power loss"),
    "epoch_snapshot": ("kill rank 1", "preempt", "kill mid-write"),
    "flat_files": ("kill rank 0", "preempt", "torn last write"),
    "folder_publish": ("kill rank 1", "kill node 0", "kill after rename"),
    "rank_folders": ("power loss",),
    "async_tracker": ("kill rank 1", "torn last write", "power loss", "stop mid-write"),
    "dcp_latest": ("kill rank 0", "power loss", "stop mid-write"),
    "barrier_save": ("kill rank 1", "power loss", "stop mid-write"),
}
SAMPLED_POINTS = 1  # -m slow: per target, a seeded sample of save 2's per-point crash points
REPEATS = 5  # -m slow: every row, every crash-point sweep and every bug case this many times


@dataclass(frozen=True)
class Bug:
    fault: str | OnEvent | BatteryRow  # what exposes it
    check: str  # the check that must fail
    what: str  # what the bug does under that fault
    words: tuple[str, ...] = ()  # the check's detail must name the cause
    crashes_on_resume: bool = False  # a resume that raises: one restart is enough
    variant: str = ""  # the target's --variant, where the case's name is not it
    max_lost_steps: int | None = None  # the job's lost-work bound, where not its interval

    @property
    def needs_faultfs(self) -> bool:
        """A power loss: only where the fault filesystem can be mounted."""
        fault = self.fault
        if isinstance(fault, OnEvent):
            return fault.mode == "lose_unsynced"
        if isinstance(fault, BatteryRow):
            return fault.contains in (ROWS["power loss"], "which renames nothing")
        return fault.startswith("storage:") and "via=agent" not in fault

    @property
    def overrides(self) -> dict[str, int]:
        """The scenario's fields this case sets: its lost-work bound, and its retries."""
        bound = {} if self.max_lost_steps is None else {"max_lost_steps": self.max_lost_steps}
        if not self.crashes_on_resume:
            return bound
        if self.needs_faultfs:  # a power loss takes the whole job: it needs a relaunch
            return {**bound, "max_restarts": 0, "max_relaunches": 1}
        return {**bound, "max_restarts": 1, "max_relaunches": 0}


BUGS = {
    ("shard_pointer", "no_dir_fsync"): Bug(
        "storage:mode=lose_unsynced,rank=0,step=6", "durable_checkpoints",
        "power loss at step 6, after save 1 (step 4) finished: no folder was fsynced, so"
        " step_00004/, its shards' names and `latest` are lost and the job starts over",
        words=("fsync",)),
    ("shard_pointer", "pointer_first"): Bug(
        OnEvent("kill", 0, "rename", "*latest"), "atomic_recovery",
        "rank 0 dies right after `latest` names step_00008, before any shard of it"
        " exists: every resume opens a missing file", crashes_on_resume=True),
    ("shard_pointer_elsewhere", "no_dir_fsync"): Bug(
        BatteryRow(ROWS["power loss"]), "durable_checkpoints",
        "the same bug with the checkpoints in run_state/: the battery's power loss after"
        " the first rename of save 2 drops save 1 (step 4), finished but never made durable",
        words=("fsync",)),
    ("epoch_snapshot", "in_place"): Bug(
        OnEvent("kill", 0, "*", "*snapshot.pt"), "atomic_recovery",
        "rank 0 dies at the first file event of torch.save over the only snapshot:"
        " resume reads a truncated file", crashes_on_resume=True),
    ("epoch_snapshot", "in_place-power_loss"): Bug(
        BatteryRow("which renames nothing"), "durable_checkpoints",
        "nanoGPT's save (torch.save over the one file, no fsync): the battery's power loss"
        " after the 2nd save ended (the writer renames nothing) drops the finished"
        " snapshot", words=("fsync",), crashes_on_resume=True, variant="in_place"),
    ("epoch_snapshot", "no_fsync"): Bug(
        BatteryRow(ROWS["power loss"]), "durable_checkpoints",
        "temporary file and os.replace, never an fsync: the battery's power loss after the"
        " 2nd save's rename takes the finished snapshot of step 4 (bytes and rename) with"
        " it", words=("fsync",), crashes_on_resume=True),
    ("epoch_snapshot", "no_rng"): Bug(
        "kill:rank=1,step=7", "deterministic_resume",
        "resume from the epoch-0 snapshot (step 4) leaves torch's RNG where seeding left"
        " it: the token masks and dropout of step 5 on differ", words=("rng",)),
    ("epoch_snapshot", "repeat_epoch"): Bug(
        "kill:rank=1,step=7", "deterministic_resume",
        "resume from step 4 trains epoch 0's sample order again: step 5's batch differs,"
        " and the job runs 4 steps past the reference's last", words=("data",)),
    ("epoch_snapshot", "skip_epoch"): Bug(
        "kill:rank=1,step=7", "deterministic_resume",
        "resume from step 4 jumps to epoch 2's sample order: step 5's batch differs, and"
        " the job ends 4 steps short", words=("data",)),
    ("flat_files", "in_place"): Bug(
        OnEvent("kill", 0, "*", "*model.safetensors"), "atomic_recovery",
        "rank 0 dies at the first file event on model.safetensors, written in place:"
        " resume reads a cut file, or step 8's weights beside step 4's optimizer and state",
        crashes_on_resume=True),
    ("flat_files", "rotate_first"): Bug(
        OnEvent("kill", 0, "*", "*model-000008*"), "atomic_recovery",
        "with --keep 1, save 2 removes step 4's files before writing step 8's; rank 0"
        " dies there and trainer_state.json names files that are gone",
        crashes_on_resume=True),
    ("flat_files", "no_file_fsync"): Bug(
        "storage:mode=lose_unsynced,rank=0,step=6,dir=state", "durable_checkpoints",
        "power loss at step 6, after save 1 (step 4) finished: its files were renamed into"
        " place and the folder fsynced, never a file; the names survive without their"
        " bytes and the resume dies on them", words=("fsync each file",),
        crashes_on_resume=True),
    ("folder_publish", "unpublished_pick"): Bug(
        OnEvent("kill", 0, "write", "*tmp-step-8/*"), "atomic_recovery",
        "rank 0 dies mid-write in tmp-step-8/; resume picks that unfinished folder over"
        " step-4/ and loads a cut or missing file", crashes_on_resume=True),
    ("folder_publish", "restart_from_zero"): Bug(
        "kill:rank=1,step=7", "bounded_lost_work",
        "after the kill at step 7 the job trains from step 0 again (7 steps redone with a"
        " checkpoint of step 4 on disk) and saves step-4/ over the one there",
        words=("step 0",)),
    ("folder_publish", "restart_from_zero-within_bound"): Bug(
        "kill:rank=1,step=5", "bounded_lost_work",
        "the same job with a lost-work bound of 8: the kill at step 5 costs 5 steps, within"
        " the bound, but the restart passed over the committed checkpoint of step 4",
        words=("did not resume", "step 4 was committed"), variant="restart_from_zero",
        max_lost_steps=8),
    ("async_tracker", "no_tracker"): Bug(
        "kill:rank=1,step=10", "bounded_lost_work",
        "the background writers write global_step_4/ and global_step_8/ and nothing ever"
        " publishes them in the tracker: the restart after the kill at step 10 trains from"
        " step 0 (verl#7952's async save)", words=("did not resume", "step 0")),
    ("async_tracker", "no_timeout"): Bug(
        BatteryRow(ROWS["stop mid-write"]), "hang_detected",
        "rank 0 is stopped (not killed) inside its 2nd save; with torch's default collective"
        " timeout rank 1 waits for it at the next barrier and nothing ends the wait (NeMo"
        " AutoModel#3254)", words=("no watchdog or collective timeout fired",)),
    ("async_tracker", "loader_ahead"): Bug(
        "kill:rank=1,step=10", "deterministic_resume",
        "the loader's state is saved as its prefetch position: the resume from step 8"
        " trains step 9 on step 10's batch (torchtitan#4686)",
        words=("data position not restored", "batch of step")),
    ("async_tracker", "rng_one_draw"): Bug(
        "kill:rank=1,step=10", "deterministic_resume",
        "the resume restores torch's RNG, then builds a probe head whose init draws from"
        " it: dropout from step 9 on is off (Megatron-Bridge#5257)",
        words=("rng not restored (torch)",)),
    ("async_tracker", "weights_only"): Bug(
        "kill:rank=1,step=10", "deterministic_resume",
        "the \"universal\" resume loads the weights alone: AdamW's moments and the StepLR"
        " schedule start afresh (DeepSpeed#6691)",
        words=("optimizer and lr schedule not restored",)),
    ("barrier_save", "no_timeout"): Bug(
        BatteryRow(ROWS["stop mid-write"]), "hang_detected",
        "rank 0 is stopped inside the save; rank 1 waits at the save's barrier under"
        " torch's default 30-minute timeout (NeMo AutoModel#3254)",
        words=("no watchdog or collective timeout fired",)),
    ("dcp_latest", "early_latest"): Bug(
        OnEvent("kill", 0, "write", "*step_8/__0_0.distcp", save=3), "atomic_recovery",
        "rank 0 moved `latest` to step_8 when its async save started; it dies at the"
        " save's first write, and every resume opens a DCP folder without .metadata"
        " (KempnerForge#102)", words=("latest named", "without .metadata"),
        crashes_on_resume=True),
    ("rank_folders", "no_parent_fsync"): Bug(
        "storage:mode=lose_unsynced,rank=0,step=8,dir=out", "durable_checkpoints",
        "power loss at step 8, after save 1 (step 5) finished: each file and its rank's"
        " folder were fsynced, never out/ after the rank folders were made in it, so the"
        " folders and every checkpoint in them are gone",
        words=("entries rank0/, rank1/ in out/", "fsync out/")),
    ("rank_folders", "prune_by_name"): Bug(
        OnEvent("kill", 0, "remove", "*rank0/step_10.pt", save=3), "bounded_lost_work",
        "save 3 prunes before writing and by name order: 'step_10.pt' sorts before"
        " 'step_5.pt' and is deleted; rank 0 dies there and the ranks agree on step 5",
        words=("deleted", "step_10.pt")),
}


# -- fixtures ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def tally(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tally:
    """The session's matrix; printed and written to JSON at the end of the session."""
    found = request.config.pluginmanager.get_plugin(MatrixPlugin.name)
    if found is None:
        found = MatrixPlugin(Tally(), tmp_path_factory.getbasetemp() / "verdict-matrix.json")
        request.config.pluginmanager.register(found, MatrixPlugin.name)
    return found.tally


@pytest.fixture(scope="session")
def cache(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference cache the plugin uses (--chaos-cache-dir, else the session's, as
    tests/conftest.py's shared_cache): one reference per (target, variant)."""
    given = pytestconfig.getoption("--chaos-cache-dir")
    return Path(given).resolve() if given else tmp_path_factory.getbasetemp() / "torchchaos-cache"


def _complain(incidents: list[Incident]) -> str:
    return "\n".join(f"{i.kind} on {i.check}: {i.detail} (run dir {i.run_dir})"
                     for i in incidents)


def _params(table: Iterator[tuple[str, tuple, bool]]) -> list:
    return [pytest.param(*values, id=key, marks=[pytest.mark.slow] if slow else [])
            for key, values, slow in table]


# -- correct variants: no false alarm ----------------------------------------------------

def _row_cases() -> Iterator[tuple[str, tuple, bool]]:
    for target in TARGETS:
        for row in ROWS:
            if row == "stop mid-write" and target in DEFAULT_TIMEOUTS:
                continue
            for repeat in range(REPEATS):
                slow = repeat > 0 or row not in CI_ROWS[target]
                key = f"{target}-{row.replace(' ', '_')}" + (f"-r{repeat}" if repeat else "")
                yield key, (target, row, repeat), slow


@pytest.mark.parametrize(("target", "row", "repeat"), _params(_row_cases()))
def test_correct_variant_passes_battery_row(target: str, row: str, repeat: int, tally: Tally,
                                            cache: Path,
                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    if row == "power loss" and unavailable_reason():
        pytest.skip(unavailable_reason())
    base = TARGETS[target].scenario("correct")
    planned = [e for e in battery.plan(base, cache, progress) if ROWS[row] in e.name]
    out = tmp_path_factory.mktemp(f"matrix-{target}-correct")
    if planned:
        entry = planned[0]
        report, error = run_one(entry, base, out, cache)
        outcome = Outcome(target, "correct", entry.name, str(entry.fault), None, report=report,
                          out_dir=str(out), error=error, repeat=repeat)
    else:
        outcome = Outcome(target, "correct", row, "-", None, out_dir=str(out), repeat=repeat,
                          error=f"the battery planned no {row!r} row (its reference saw no"
                                " such file event in save 2)")
    incidents = tally.add(outcome)
    assert not incidents, _complain(incidents)


def _crash_point_cases() -> Iterator[tuple[str, tuple, bool]]:
    for target in TARGETS:  # CI judges every crash state instead (one recording each)
        yield f"{target}-sample", (target, SAMPLED_POINTS, 0), True
        for repeat in range(REPEATS):
            key = f"{target}-all" + (f"-r{repeat}" if repeat else "")
            yield key, (target, None, repeat), True


@pytest.mark.parametrize(("target", "cap", "repeat"), _params(_crash_point_cases()))
def test_correct_variant_survives_crash_points(target: str, cap: int | None, repeat: int,
                                               tally: Tally,
                                               cache: Path,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """Save 2 of the correct variant, crashed at every rank's file events (a seeded
    sample in CI), killed and, with the fault filesystem, by a power loss; each point
    ends 3 steps after its recovery, as `torchchaos crashpoints` runs it."""
    modes = ["kill"] if unavailable_reason() else ["kill", "lose_unsynced"]
    base = TARGETS[target].scenario("correct")
    found = crashpoints.plan(base, cache, progress, 2, modes, cap)
    base.stop_after = 3
    out = tmp_path_factory.mktemp(f"matrix-{target}-points")
    incidents: list[Incident] = []
    for number, entry in enumerate(crashpoints.entries(found, 2), 1):
        report, error = run_one(entry, base, out / f"point-{number:02d}", cache)
        incidents += tally.add(Outcome(target, "correct", entry.name, str(entry.fault), None,
                                       report=report, out_dir=str(out), error=error,
                                       repeat=repeat))
    assert not incidents, _complain(incidents)


def _crash_state_cases() -> Iterator[tuple[str, tuple, bool]]:
    for target in TARGETS:
        for repeat in range(REPEATS):
            yield f"{target}" + (f"-r{repeat}" if repeat else ""), (target, repeat), repeat > 0


def _state_modes() -> list[str]:
    return ["kill"] if unavailable_reason() else ["kill", "torn", "lose_unsynced"]


@pytest.mark.parametrize(("target", "repeat"), _params(_crash_state_cases()))
def test_correct_variant_survives_every_crash_state(target: str, repeat: int, tally: Tally,
                                                    cache: Path,
                                                    tmp_path_factory: pytest.TempPathFactory
                                                    ) -> None:
    """Save 2 of the correct variant: every kill, torn write and power loss its recording
    allows, each state judged after its recovery; all of them pass."""
    base = TARGETS[target].scenario("correct")
    out = tmp_path_factory.mktemp(f"matrix-{target}-states") / "states"
    entries, error = sweep_states(base, out, cache, _state_modes())
    incidents: list[Incident] = []
    if error:
        incidents += tally.add(Outcome(target, "correct", "crash states of save 2", "-", None,
                                       out_dir=str(out), error=error, repeat=repeat))
    for entry in entries:
        report = dataclasses.asdict(entry.report) if entry.report else None
        incidents += tally.add(Outcome(target, "correct", entry.name, str(entry.fault), None,
                                       report=report, out_dir=str(out), error=entry.error,
                                       repeat=repeat))
    assert entries and not incidents, _complain(incidents) or error


# -- buggy variants: caught by their check ------------------------------------------------

def _bug_cases() -> Iterator[tuple[str, tuple, bool]]:
    for target, variant in BUGS:
        for repeat in range(REPEATS):
            key = f"{target}-{variant}" + (f"-r{repeat}" if repeat else "")
            yield key, (target, variant, repeat), repeat > 0


@pytest.mark.parametrize(("target", "variant", "repeat"), _params(_bug_cases()))
def test_planted_bug_is_caught(target: str, variant: str, repeat: int, tally: Tally,
                               cache: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    bug = BUGS[(target, variant)]
    if bug.needs_faultfs and unavailable_reason():
        pytest.skip(unavailable_reason())
    base = ALL_TARGETS[target].scenario(bug.variant or variant, **bug.overrides)
    out = tmp_path_factory.mktemp(f"matrix-{target}-{variant}")
    spec, error, report = str(bug.fault), "", None
    if not isinstance(bug.fault, str):
        try:
            spec = bug.fault.resolve(base, cache)
        except LookupError as exc:
            error = str(exc)
    if not error:
        report, error = run_one(Entry(f"{variant}: {bug.fault}", Spec.read(spec)), base, out,
                                cache)
    incidents = tally.add(Outcome(target, variant, bug.what, spec, bug.check, bug.words,
                                  report=report, out_dir=str(out), error=error,
                                  repeat=repeat))
    assert not incidents, _complain(incidents)


def _bug_state_cases() -> Iterator[tuple[str, tuple, bool]]:
    for target, variant in BUGS:
        yield f"{target}-{variant}", (target, variant), True


@pytest.mark.parametrize(("target", "variant"), _params(_bug_state_cases()))
def test_planted_bug_is_caught_in_the_crash_states(target: str, variant: str, tally: Tally,
                                                   cache: Path,
                                                   tmp_path_factory: pytest.TempPathFactory
                                                   ) -> None:
    """The bug's check fails, naming its cause, in at least one crash state of save 2:
    what the per-point fault above catches, the recorded states catch too (a state
    that breaks another check counts in the tally as that check's finding)."""
    bug = BUGS[(target, variant)]
    modes = _state_modes()
    if bug.needs_faultfs and "lose_unsynced" not in modes:
        pytest.skip(unavailable_reason())
    base = ALL_TARGETS[target].scenario(bug.variant or variant)
    out = tmp_path_factory.mktemp(f"matrix-{target}-{variant}-states") / "states"
    entries, error = sweep_states(base, out, cache, modes)
    reports = [(e, dataclasses.asdict(e.report)) for e in entries if e.report]

    def names_it(report: dict) -> bool:
        check = report["checks"].get(bug.check, {})
        return check.get("ok") is False and all(w in check.get("detail", "").lower()
                                                 for w in bug.words)

    caught = next(((e, r) for e, r in reports if names_it(r)), None)
    entry, report = caught or (reports[0] if reports else (None, None))
    incidents = tally.add(Outcome(target, variant, f"crash states: {bug.what}",
                                  str(entry.fault) if entry else "-", bug.check, bug.words,
                                  report=report, out_dir=str(out), error=error,
                                  repeat=0))
    assert caught and not incidents, _complain(incidents) or error or "no state caught it"


def test_the_first_save_that_deletes_is_crashed_in_by_default(tally: Tally, cache: Path,
                                                              tmp_path_factory:
                                                              pytest.TempPathFactory) -> None:
    """Issue 41, item 4: rank_folders keeps its two newest files, so it deletes nothing
    before save 3. `torchchaos crashpoints` without --save chooses save 2 (the first that
    creates) and save 3 (the first that deletes) from the reference; save 3's kill
    states pass on the correct variant and catch prune_by_name (which save 2's miss)."""
    target, bug = TARGETS["rank_folders"], BUGS[("rank_folders", "prune_by_name")]
    incidents: list[Incident] = []
    for variant in ("correct", "prune_by_name"):
        base = target.scenario(variant)
        chosen, _ = shapes.choose(reference_history(base, cache))
        progress(f"rank_folders/{variant}: " + "; ".join(f"save {c.save}: {c.why}"
                                                         for c in chosen))
        assert [(c.save, c.why.split(" (")[0]) for c in chosen] == [
            (2, "the first that creates"), (3, "the first that deletes")]
        out = tmp_path_factory.mktemp(f"matrix-rank_folders-{variant}-save3") / "states"
        entries, error = sweep_states(base, out, cache, ["kill"], save=3)
        expects = None if variant == "correct" else bug.check
        words = () if variant == "correct" else bug.words
        judged = [e for e in entries if e.report]
        if variant != "correct":  # the state that names it stands for the bug
            judged = [e for e in judged if not e.report.checks[bug.check]["ok"]][:1] or judged[:1]
        for entry in judged or [Entry("save 3", Spec("-"))]:
            report = dataclasses.asdict(entry.report) if entry.report else None
            incidents += tally.add(Outcome("rank_folders", variant, f"save 3: {entry.name}",
                                           str(entry.fault), expects, words, report=report,
                                           out_dir=str(out), error=error or entry.error,
                                           repeat=0))
    assert not incidents, _complain(incidents)


def test_a_checkpoint_that_names_its_own_folder_is_judged_where_it_was_written(
        tally: Tally, cache: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Issue 41, item 1: with --own-path every checkpoint holds out/'s absolute path and a
    resume saves there, as nanoGPT's config and Lightning's dirpath do. Its crash states
    were refused (a copy would resume into the recording's folder); each recovery now
    sees its own folder at the recording's path, and every state of save 2 passes."""
    base = OWN_PATH.scenario("correct")
    out = tmp_path_factory.mktemp("matrix-rank_folders-own_path") / "states"
    entries, error = sweep_states(base, out, cache, _state_modes())
    incidents: list[Incident] = []
    for entry in entries or [Entry("crash states of save 2", Spec("-"))]:
        report = dataclasses.asdict(entry.report) if entry.report else None
        incidents += tally.add(Outcome(OWN_PATH.name, "correct", entry.name, str(entry.fault), None,
                                       report=report, out_dir=str(out),
                                       error=error or entry.error, repeat=0))
    assert entries and not incidents, _complain(incidents) or error
    # the recoveries saved where their checkpoints said, and the recording is as it was
    recording = get_reference(base, cache, progress).run_dir.parent
    assert crashsweep._whole(Path(f"{recording}-save2"), progress)
    assert any("step_6.pt" in e.get("path", "") for entry in entries if entry.report
               for e in History.of_run(Path(entry.report.run_dir)).of("file"))


STOPPED_POINTS = 2  # a seeded sample of save 2's per-point stops, per variant


@pytest.mark.parametrize("variant", ["correct", "no_timeout"])
def test_a_rank_stopped_at_points_of_its_save_is_ended_by_the_jobs_timeout(
        variant: str, tally: Tally, cache: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Issue 59: a kill is reaped by torchrun whatever the job's timeouts, so only a
    stopped rank shows one missing. `torchchaos crashpoints --per-point --mode stop`:
    each point stops rank 0 or 1 right after a file event of save 2; the correct
    variant's collective timeout ends every wait, no_timeout's never does."""
    target = TARGETS["async_tracker"]
    base = target.scenario(variant)
    found = crashpoints.plan(base, cache, progress, 2, ["stop"], STOPPED_POINTS)
    base.stop_after = 3
    out = tmp_path_factory.mktemp(f"matrix-async_tracker-{variant}-stops")
    bug = BUGS.get(("async_tracker", variant))
    incidents: list[Incident] = []
    for number, entry in enumerate(crashpoints.entries(found, 2), 1):
        report, error = run_one(entry, base, out / f"point-{number:02d}", cache)
        incidents += tally.add(Outcome(
            target.name, variant, entry.name, str(entry.fault), bug.check if bug else None,
            bug.words if bug else (), report=report, out_dir=str(out), error=error,
            repeat=0))
    assert len(found.points) == STOPPED_POINTS and not incidents, _complain(incidents)


# -- the tally itself (no run) ------------------------------------------------------------

def _report(verdict: str, reason: str = "", **checks: bool | None) -> dict:
    return {"verdict": verdict, "reason": reason, "run_dir": "d",
            "checks": {name: {"ok": ok, "detail": f"{name} said so"} for name, ok in
                       checks.items()}}


def test_the_tally_sorts_each_outcome_into_its_cell(tmp_path: Path) -> None:
    tally = Tally()
    tally.add(Outcome("t", "correct", "row", "f", None,
                      report=_report("fail", completes=True, atomic_recovery=False)))
    tally.add(Outcome("t", "correct", "row", "f", None, error="CannotJudge: no"))
    tally.add(Outcome("t", "bug", "b", "f", "deterministic_resume", ("rng",),
                      report=_report("pass", deterministic_resume=True)))
    tally.add(Outcome("t", "bug", "b", "f", "deterministic_resume", ("rng",),
                      report=_report("fail", deterministic_resume=False)))
    tally.add(Outcome("t", "bug", "b", "f", "durable_checkpoints",
                      report=_report("error", "never fired", durable_checkpoints=None)))
    kinds = [(i.kind, i.check) for i in tally.incidents()]
    assert kinds == [("false alarm", "atomic_recovery"), ("error", "(whole run)"),
                     ("miss", "deterministic_resume"), ("wrong cause", "deterministic_resume"),
                     ("error", "durable_checkpoints")]
    matrix = tally.matrix()
    assert matrix["atomic_recovery"]["false alarms"] == 1
    assert matrix["completes"]["judged on correct"] == 1
    assert matrix["deterministic_resume"]["expected to fail"] == 2
    blob = json.loads(tally.write(tmp_path / "m.json").read_text())
    assert len(blob["incidents"]) == 5 and len(blob["runs"]) == 5
    assert "FALSE ALARM  atomic_recovery" in tally.table()
