"""One module per artefact format; each holds a `Reader` (see `torchchaos.incident.readers`)."""
