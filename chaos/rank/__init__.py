"""Code that runs in the job's processes, not the harness's: the agent inside every rank
(loaded by sitecustomize) and what it uses, and the job's launchers (`warmrun`,
`launcher_server`); may import torch."""
