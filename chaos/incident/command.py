"""The script the artefacts say the job ran, with its arguments where they give them.

A replay should run the script the incident came from. The artefacts name it in
several places, told here from the most to the least complete:

1. py-spy's process line: the whole command line of a rank (`Process 6797:
   /usr/bin/python3 -u /job/train.py /job/out --steps 400`);
2. the batch script, given, or named by `scontrol show job` (`Command=/job/train.sbatch`)
   where it is on this machine: its line that starts the script (torchrun, srun, python);
3. torchrun's summary (`/job/train.py FAILED`) and a traceback's `<module>` frame:
   the script's path, no arguments.

The command is read, never run: a path in it is the job's machine's, and
`replay_arguments` turns each folder or path that is not a file here into one inside
the replay's run directory, so a replay writes only there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from torchchaos.incident.formats.batch_script import from_command_line, last_command
from torchchaos.incident.observations import Observation


@dataclass(frozen=True)
class NamedCommand:
    script: str               # as the artefacts give it: a path on the job's machine
    args: list[str] | None    # None: the artefacts do not give them
    source: str               # where it was read, for the line that says so


def named_command(obs: list[Observation]) -> NamedCommand | None:
    """The job's script and arguments, from the most complete artefact that names it."""
    for o in obs:
        if o.what == "stack" and o.extra.get("command"):
            found = from_command_line(o.extra["command"])
            if found is not None:
                return NamedCommand(*found, f"{o.source}, py-spy's process line")
    for o in obs:
        if o.what == "launch_command":
            return NamedCommand(o.extra["script"], o.extra["args"],
                                f"{o.source}, the batch script's command")
    for o in obs:
        batch = o.extra.get("batch_script")
        if batch and Path(batch).is_file():
            found = _from_batch_script(Path(batch))
            if found is not None:
                return NamedCommand(*found, f"{batch}, the batch script {o.source} gives")
    for o in obs:
        script = o.extra.get("script")
        if script and "/" in script:
            return NamedCommand(script, None, f"{o.source}, torchrun's summary")
    for o in obs:
        for path, _line, _quoted in o.extra.get("code") or ():
            if o.frames and o.frames[0].startswith("<module>") and path.endswith(".py"):
                return NamedCommand(path, None, f"{o.source}, the traceback's <module> frame")
    return None


def _from_batch_script(path: Path) -> tuple[str, list[str]] | None:
    """(script, arguments) of a batch script on this machine, read, never run."""
    try:
        found = last_command(path.read_text())
    except (OSError, UnicodeDecodeError):
        return None
    return found[1:] if found else None


def replay_arguments(args: list[str]) -> tuple[list[str], list[str]]:
    """(the arguments a replay runs with, what was changed and why): an argument that is
    a path (absolute, or with the job's shell variables) and not a file on this machine
    is made a folder of the same name inside the run directory."""
    kept, said = [], []
    for arg in args:
        if arg.startswith(("/", "~", "$")) or "$" in arg:
            if Path(arg).is_file():
                kept.append(arg)  # an input on this machine too (a config): read, not written
                continue
            local = re.sub(r"\$\{?\w+\}?", "", arg).rstrip("/").rsplit("/", 1)[-1].strip("-_.")
            local = local or "out"
            kept.append(local)
            said.append(f"{arg} -> {local} (a path of the job's machine: the replay writes"
                        " only inside its run directory)")
        else:
            kept.append(arg)
    return kept, said
