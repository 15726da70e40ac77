"""Running the independent targets under the harness, the way `torchchaos battery`
and `torchchaos crashpoints` do (torchchaos.explore.battery.plan / run_entries,
chaos.explore.crashpoints.plan / entries), one chaos run per entry."""

from __future__ import annotations

import dataclasses
import fnmatch
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from torchchaos import env
from torchchaos.errors import ChaosError
from torchchaos.explore import battery
from torchchaos.explore.crash import sweep as crashsweep
from torchchaos.explore.rows import Entry
from torchchaos.explore.runs import run_entries
from torchchaos.harness.reference import get_reference
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario

TARGETS_DIR = Path(__file__).resolve().parent / "targets"


def progress(message: str) -> None:
    print(f"[matrix] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Target:
    name: str
    args: tuple[str, ...]  # its arguments, --variant aside
    file: str = ""  # the script tests/matrix/targets/<file>.py (default: <name>.py)

    @property
    def script(self) -> Path:
        return TARGETS_DIR / f"{self.file or self.name}.py"

    def scenario(self, variant: str, **overrides: object) -> Scenario:
        """The job (no fault yet). Every run of a target asks its reference to keep a copy
        of the checkpoints after save 1, as crash points need: battery rows, crash points
        and bug cases of one (target, variant) then share one cached reference."""
        scenario = Scenario(script=str(self.script), args=[*self.args, "--variant", variant],
                            env={env.SNAPSHOT_AFTER_SAVE: "1"}, **overrides)  # type: ignore[arg-type]
        scenario.validate()
        return scenario


@dataclass(frozen=True)
class OnEvent:
    """A fault placed on the first file event of save `save` of rank `rank` in the
    reference run whose op and path match (fnmatch patterns): where the planted bug
    bites, named by what the target does rather than by an event number."""

    mode: str  # "kill" or "lose_unsynced"
    rank: int
    op: str
    path: str
    save: int = 2

    def __str__(self) -> str:
        return f"{self.mode} rank {self.rank} after {self.op} {self.path} in save {self.save}"

    def resolve(self, base: Scenario, cache: Path) -> str:
        history = reference_history(base, cache)
        for event in sorted(history.of("file"), key=lambda e: e["index"]):
            if (event["rank"] == self.rank and event.get("save") == self.save
                    and event.get("launch", 0) == 0 and fnmatch.fnmatch(event["op"], self.op)
                    and fnmatch.fnmatch(event["path"], self.path)):
                where = f"rank={self.rank},phase=checkpoint_save,save={self.save}"
                if self.mode == "kill":
                    return f"kill:{where},event={event['index']}"
                return f"storage:mode={self.mode},{where},event={event['index']}"
        raise LookupError(f"the reference run shows no file event {self.op} {self.path} in"
                          f" save {self.save} of rank {self.rank}")


@dataclass(frozen=True)
class BatteryRow:
    """The fault of the battery row (`torchchaos.explore.battery.plan`) named with `contains`."""

    contains: str

    def __str__(self) -> str:
        return f"the battery's {self.contains!r} row"

    def resolve(self, base: Scenario, cache: Path) -> str:
        for entry in battery.plan(base, cache, progress):
            if self.contains in entry.name:
                return str(entry.fault)
        raise LookupError(f"the battery planned no row named like {self.contains!r}")


def reference_history(base: Scenario, cache: Path) -> History:
    return get_reference(base, cache, progress).history()


def sweep_states(base: Scenario, out_dir: Path, cache: Path,
                 modes: list[str], save: int = 2) -> tuple[list[Entry], str]:
    """Every crash state of save `save` (`torchchaos crashpoints`, chaos.explore.crashsweep),
    each ending 3 steps after its recovery: the judged states, or none and why."""
    try:
        found = crashsweep.sweep(base, out_dir, cache, progress, save, modes, None, 3)
    except ChaosError as exc:
        return [], f"{type(exc).__name__}: {exc}"
    progress(crashsweep.summary(found, save))
    return found.entries, ""


def run_one(entry: Entry, base: Scenario, out_dir: Path, cache: Path) -> tuple[dict | None, str]:
    """One chaos run of `entry` in out_dir/01: its report as a dict, or None and why."""
    said: list[str] = []

    def listen(message: str) -> None:
        said.append(message)
        progress(message)

    try:
        run_entries([entry], base, out_dir, cache, listen, title=entry.name)
    except ChaosError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - the harness itself broke: an error cell
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return None, (f"the harness raised {type(exc).__name__}: {exc} (at"
                      f" {Path(where.filename).name}:{where.lineno} in {where.name})")
    if entry.report is None:
        why = [m for m in said if m.startswith("could not judge")]
        return None, why[-1] if why else "the harness could not judge the run"
    return dataclasses.asdict(entry.report), ""
