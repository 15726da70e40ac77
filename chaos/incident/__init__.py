"""Incidents: from what a failed job left to a scenario that replays it.

The flow runs the harness's backwards first (shared/DESIGN.md, "Incidents"):

    artefacts -> observations -> incident -> scenario file + signature -> replay -> reproduced?

- `observations`: what one artefact says, each with the file and line (or key)
  it came from; nothing guessed.
- `formats/`: one reader per artefact format (torchrun's log, torchelastic's
  error file, collective errors, flight-recorder dumps, stacks, the kernel's
  OOM lines, the training log, Kubernetes, Slurm, the checkpoint folder, this
  project's own report); `readers` finds them by name and sniffs which reads a file.
- `gather`: walks the paths a user names and runs the readers.
- `attribute`: observations to an incident (a timeline per rank, the fault, its
  phase), by rules a reader can follow; what it cannot tell it says.
- `signature`: what made it an incident, and how a replay's differs.
- `mapping`: the incident's fault as specs for the script and ranks at hand.
- `incident_file`: the incident as a `*.chaos.yaml` file `torchchaos replay` runs.
"""
