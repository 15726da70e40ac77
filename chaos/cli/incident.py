"""`torchchaos incident import`: from what a failed job left to an incident file."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from torchchaos.cli.output import progress_printer
from torchchaos.errors import UsageError
from torchchaos.harness.reference import check_cache_dir, default_cache_dir

if TYPE_CHECKING:
    from torchchaos.incident.importing import Imported


def cmd_incident(ns: argparse.Namespace) -> int:
    if ns.incident_command != "import":
        raise UsageError("incident needs a command: torchchaos incident import PATH...")
    return cmd_import(ns)


def cmd_import(ns: argparse.Namespace) -> int:
    from torchchaos.explore import battery
    from torchchaos.incident.importing import import_artefacts
    from torchchaos.scenario.model import Scenario

    out = _check_out(ns.out)
    script = str(ns.script.resolve()) if ns.script else str(battery.BUNDLED_TARGET)
    try:
        args = shlex.split(ns.args) if ns.args is not None else \
            ([] if ns.script else list(battery.BUNDLED_ARGS))
    except ValueError as exc:
        raise UsageError(f"--args: {exc}") from None
    scenario = Scenario.build(script, args=args, nproc=ns.nproc or 2)
    cache = (ns.cache_dir or default_cache_dir()).resolve()
    check_cache_dir(cache)
    progress = progress_printer(ns.quiet)
    imported = import_artefacts(list(ns.paths), scenario, cache, progress)
    imported.file.save(out)
    _print(imported, out)
    return 0


def _check_out(path: Path) -> Path:
    """A new file in a folder that exists: an incident file never replaces anything."""
    if path.exists():
        raise UsageError(f"{path} already exists: name a new file with -o"
                         " (torchchaos never overwrites one)")
    if not path.parent.resolve().is_dir():
        raise UsageError(f"-o {path}: the folder {path.parent} does not exist")
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise UsageError(f"-o {path}: an incident file is YAML (name it *.chaos.yaml) or"
                         " JSON")
    return path


def _print(imported: Imported, out: Path) -> None:
    f = imported.incident.finding
    print(imported.file.summary.rstrip())
    print("why:")
    for rule in f.rules:
        print(f"  - {rule}")
    print("replayed as:")
    for fault, note in zip(imported.file.scenario.faults, imported.file.notes):
        print(f"  - {fault.text}   # {note}")
    if imported.gathered.passed_over:
        shown = ", ".join(imported.gathered.passed_over[:5])
        more = len(imported.gathered.passed_over) - 5
        print(f"passed over (no reader knows them): {shown}" + (f" and {more} more"
                                                                   if more > 0 else ""))
    for note in imported.gathered.notes:
        print(f"note: {note}")
    where = "its own steps (the same script)" if imported.file.incident.get("steps_kept") \
        else "the replay script's fault-free reference run"
    print(f"faults placed from {where}; replaying on {imported.file.scenario.script}")
    print(f"wrote {out}")
    print(f"replay it: torchchaos replay {out}")
