"""The incident as a scenario file: `torchchaos replay` runs it, pytest collects it.

The file is today's format (`torchchaos.scenario.files`) with one more section,
`incident:`, holding what the import read: the signature a replay must show to
reproduce it, the finding with its rules and the lines they stand on, each
rank's timeline, what could not be told, and which artefacts were read. Its
`expect:` is a pass: the file fails as a test until the bug is fixed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchchaos.incident.attribute import Incident
from torchchaos.incident.gather import Gathered
from torchchaos.incident.mapping import Placement, faults_for
from torchchaos.incident.signature import Signature
from torchchaos.scenario.files import Expectation, ScenarioFile
from torchchaos.scenario.model import Scenario

# A hang the scheduler's time limit ended, replayed: the job's own collective timeout (an
# hour, as on many clusters) is what the limit cut short, so the replay bounds the hang
# as the limit did, not by waiting that timeout out
LIMIT_ENDED_HANG_BOUND = 60.0


def bounded_as_the_limit(incident: Incident, scenario: Scenario) -> tuple[Scenario, str]:
    """`scenario` with the hang bound a time limit's hang replays under, and the line that
    says so; as it was, and "", for any other incident or a bound already set."""
    f = incident.finding
    if f.kind != "hang" or "time limit" not in f.how or scenario.hang_timeout is not None:
        return scenario, ""
    return dataclasses.replace(scenario, hang_timeout=LIMIT_ENDED_HANG_BOUND), (
        f"the scheduler's time limit ended the hang: the replay calls it one after"
        f" {LIMIT_ENDED_HANG_BOUND:.0f} s without progress (hang_timeout), not after the"
        " job's own collective timeout")


def build(incident: Incident, gathered: Gathered, scenario: Scenario, place: Placement,
          same_script: bool) -> ScenarioFile:
    faults = faults_for(incident, place, same_script)
    scenario = dataclasses.replace(scenario, faults=[s.parse() for s, _ in faults])
    signature = Signature.of(incident)
    return ScenarioFile(scenario, name=f"incident: {signature.describe()}",
                        summary=timeline_text(incident),
                        source="imported by torchchaos incident import from "
                               + ", ".join(sorted(gathered.read)[:8])
                               + (" ..." if len(gathered.read) > 8 else ""),
                        notes=[note for _, note in faults], expect=Expectation("pass"),
                        incident=section(incident, gathered, signature,
                                         steps_kept=same_script and not place.from_reference))


def section(incident: Incident, gathered: Gathered, signature: Signature,
            steps_kept: bool = False) -> dict[str, Any]:
    doc = incident.to_dict()
    doc["signature"] = signature.to_dict()
    # the replay runs the script the incident came from, at its steps: rank and step count
    doc["steps_kept"] = steps_kept
    doc["artefacts"] = {name: readers for name, readers in sorted(gathered.read.items())}
    if gathered.passed_over:
        doc["passed_over"] = gathered.passed_over[:50]
    if incident.script:
        doc["script"] = incident.script
    return doc


def timeline_text(incident: Incident) -> str:
    """The incident in a few lines, per rank, as the artefacts tell it."""
    f = incident.finding
    lo, hi = f.step_window
    window = "no step known" if lo is None else f"after step {lo}" + (
        f", before step {hi}" if hi is not None else "")
    who = f"rank {f.rank}" if f.rank is not None else f"node {f.node}" if f.node is not None \
        else "an unknown rank" if f.kind != "node" else "a node"
    head = f"{who} went down" if f.kind == "node" else f"{f.kind} of {who} ({f.role})"
    phase = "phase not known" if f.phase == "unknown" else f.phase.replace("_", " ") + (
        "" if f.phase_seen else " (placed by rule)")
    lines = [f"{head}, {phase}, {window}; restart: {incident.recovery}."]
    for rank, story in sorted(incident.ranks.items()):
        bits = [f"last step {story.last_step}" if story.last_step is not None else "",
                f"ended {story.end}" if story.end else "",
                f"error {story.error!r}" if story.error else "",
                f"at {story.frame}" if story.frame else ""]
        told = "; ".join(b for b in bits if b)
        lines.append(f"rank {rank}: {told or 'no step, end or frame of its own in the artefacts'}.")
    for unknown in incident.unknowns:
        lines.append(f"not known: {unknown}.")
    return "\n".join(lines) + "\n"
