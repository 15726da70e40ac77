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
    from torchchaos.incident.importing import import_artefacts

    out = _check_out(ns.out)
    try:
        args = shlex.split(ns.args) if ns.args is not None else None
    except ValueError as exc:
        raise UsageError(f"--args: {exc}") from None
    if ns.script is not None and not ns.script.is_file():
        raise UsageError(f"--script {ns.script}: no such file")
    cache = (ns.cache_dir or default_cache_dir()).resolve()
    check_cache_dir(cache)
    progress = progress_printer(ns.quiet)
    imported = import_artefacts(list(ns.paths), _scenario_for(ns.script, args, ns.nproc or 2),
                                cache, progress)
    imported.file.save(out)
    _print(imported, out)
    return 0


def _scenario_for(script: Path | None, args: list[str] | None, nproc: int):
    """The replay's scenario for the command the artefacts name: `--script` where given,
    else the named script where it is on this machine, else the bundled target; with the
    lines that say which and why."""
    from torchchaos.explore import battery
    from torchchaos.incident.command import NamedCommand, replay_arguments
    from torchchaos.scenario.model import Scenario

    def scenario_for(named: NamedCommand | None) -> tuple[Scenario, list[str]]:
        if script is not None:
            said = [f"replaying on {script} (--script)"]
            if named is not None and Path(named.script).name != script.name:
                said.append(f"the artefacts name another script: {named.script}"
                            f" ({named.source})")
            return Scenario.build(str(script.resolve()), args=args or [], nproc=nproc), said
        if named is not None and Path(named.script).is_file():
            given = args if args is not None else named.args
            kept, changed = replay_arguments(given or [])
            said = [f"replaying on {named.script} (named by {named.source})"]
            said.append("its arguments: " + (" ".join(kept) if kept else "none") +
                        (" (--args)" if args is not None else
                         " (the artefacts give none: --args sets them)" if given is None
                         else f" (as {named.source.split(', ')[0]} gives them)"))
            said += [f"argument {c}" for c in changed]
            return Scenario.build(str(Path(named.script).resolve()), args=kept,
                                  nproc=nproc), said
        why = "the artefacts name no script" if named is None else \
            f"the artefacts name {named.script} ({named.source}), which is not on this machine"
        said = [f"replaying on the bundled target: {why}; --script names the one to replay"]
        return Scenario.build(str(battery.BUNDLED_TARGET),
                              args=args if args is not None else list(battery.BUNDLED_ARGS),
                              nproc=nproc), said

    return scenario_for


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
    for line in imported.said:
        print(line)
    where = "its own steps (the same script)" if imported.file.incident.get("steps_kept") \
        else "the replay script's fault-free reference run"
    print(f"faults placed from {where}; replaying on {imported.file.scenario.script}")
    print(f"wrote {out}")
    print(f"replay it: torchchaos replay {out}")
