"""The two ends users call: import a failed job's artefacts, and judge a replay against it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torchchaos.errors import UsageError
from torchchaos.incident.attribute import Incident, attribute
from torchchaos.incident.command import NamedCommand, named_command
from torchchaos.incident.gather import Gathered, gather
from torchchaos.incident.incident_file import bounded_as_the_limit, build
from torchchaos.incident.mapping import Placement, placement_from_reference
from torchchaos.incident.signature import Signature
from torchchaos.scenario.files import ScenarioFile
from torchchaos.scenario.model import Scenario


@dataclass
class Imported:
    incident: Incident
    gathered: Gathered
    file: ScenarioFile
    same_script: bool
    said: list[str] = dataclasses.field(default_factory=list)  # which script, and why


# the scenario a replay runs, for the command the artefacts name (None: they name none),
# and the lines that say which script it is and why
ScenarioFor = Callable[[NamedCommand | None], tuple[Scenario, list[str]]]


def import_artefacts(paths: list[Path], scenario: Scenario | ScenarioFor,
                     cache_dir: Path | None, progress: Callable[[str], None]) -> Imported:
    """Read `paths`, attribute, and map the incident onto a scenario's script and ranks:
    `scenario` itself, or the one it gives for the command the artefacts name.
    The script's fault-free reference run (made if the cache dir does not hold it) places
    the faults as the battery places its rows; on the script the incident came from (the
    name its logs give), a step the logs show is kept as it was, with no reference run."""
    given = scenario if isinstance(scenario, Scenario) else None
    gathered = gather(paths, script=Path(given.script) if given else None)
    progress(f"read {len(gathered.read)} artefact(s): {len(gathered.observations)}"
             " observation(s)")
    incident = attribute(gathered.observations, gathered.sources)
    # said before the reference run, which may fail on the replay script (an input the
    # artefacts do not hold): the finding stands without it
    progress(f"found: {Signature.of(incident).describe()}")
    said: list[str] = []
    if given is None:
        given, said = scenario(named_command(gathered.observations))  # type: ignore[operator]
    same_script = incident.script is not None and Path(given.script).name == incident.script
    place = Placement(last_rank=given.world_size - 1)
    if cache_dir is not None and _needs_reference(incident, same_script):
        from torchchaos.harness.reference import get_reference

        history = get_reference(given, cache_dir, progress).history()
        place = placement_from_reference(history, given)
    replayed, bound = bounded_as_the_limit(incident, given)  # the replay's, not the reference's
    return Imported(incident, gathered, build(incident, gathered, replayed, place, same_script),
                    same_script, said + ([bound] if bound else []))


def _needs_reference(incident: Incident, same_script: bool) -> bool:
    """Whether only the replay script's reference run can place the faults: anything but a
    failure between saves at a step the logs show, on the script they came from."""
    f = incident.finding
    return not (same_script and f.step_window[0] is not None and f.phase == "between_saves"
                and f.kind not in ("node", "torn_write", "power_loss"))


def judge_replay(incident: dict, out_dir: Path, name: str, verdict: str,
                 failing: list[str]) -> tuple[str, Path]:
    """The reproduction line a replay prints, and the postmortem page it wrote."""
    from torchchaos.incident import page

    run_dir = out_dir / "chaos"
    try:
        seen = gather([run_dir])
        replayed = attribute(seen.observations, seen.sources)
        got, told = Signature.of(replayed), replayed.to_dict()
    except UsageError:
        got, told = Signature("unknown", "unknown", "unknown"), {}
    if got.role == "unknown":
        got = dataclasses.replace(got, role=_role_from_record(out_dir / "report.json"))
    want = Signature.from_dict(incident.get("signature", {}))
    differences = want.differences(got, steps_kept=bool(incident.get("steps_kept")))
    if want.kind == "unknown":  # nothing was told, so nothing can be reproduced
        differences = ["kind: the incident's artefacts name no fault"]
    path = page.write(out_dir, name, incident, got, told, differences, verdict, failing)
    line = "incident reproduced: " + got.describe() if not differences else \
        "incident not reproduced: differs in " + "; ".join(differences)
    return line, path


def _role_from_record(report: Path) -> str:
    """Who the replay's fault hit, from the harness's own record of the replay, where its
    artefacts do not say (a script that prints nothing names no rank): only the role is
    taken from there, never what happened, which must show in the artefacts."""
    try:
        faults = json.loads(report.read_text()).get("faults", [])
    except (OSError, ValueError):
        return "unknown"
    fired = [f for f in faults if f.get("fired")]
    if not fired:
        return "unknown"
    first = fired[0]
    if first.get("target_type") == "node":
        return "node"
    return "writer" if first.get("index") == 0 else "other"
