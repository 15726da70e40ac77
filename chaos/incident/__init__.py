"""Incidents: from what a failed job left to a scenario that replays it.

The harness's flow run backwards first (ARCHITECTURE.md, "The flow"), then forwards:

    artefacts -> observations -> incident -> scenario file + signature -> replay -> reproduced?

- `importing`: the two ends a user calls: import a job's artefacts, judge a replay.
- `gather`: walks the paths a user names and runs the readers on each file.
- `formats/`: the readers, one module per tool or format; `readers` finds them by
  name and sniffs which reads a file.
- `observations`: what one artefact says, each with the file and line (or key) it
  came from; nothing guessed.
- `attribute`: observations to an incident (a timeline per rank, the fault, its rank
  and phase), through `normalise` (ranks, restarts, resume steps made whole),
  `launches` (the logs cut into launches), `rules/` (the failure rules, one order) and
  `placement` (the phase, the step window, the role); `finding` is what it finds,
  `evidence` what every rule reads alike; what it cannot tell it says.
- `command`, `script_source`, `frameworks`: the script the artefacts name, its own
  lines where a traceback quotes them, and the frames a framework's loop is made of.
- `signature`: what made it an incident, and how a replay's differs.
- `mapping`: the incident's fault as specs for the script and ranks at hand.
- `incident_file`: the incident as a `*.chaos.yaml` file `torchchaos replay` runs;
  `page` its postmortem page.
"""
