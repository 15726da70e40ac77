"""The artefact readers, one module per tool or format, each a `Reader` (found by name in
`torchchaos.incident.readers`); `slurm` holds four (sacct's, scontrol's, slurmctld's, a
job's output), and `text` and `records` are what the log readers share."""
