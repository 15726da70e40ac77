"""A real Slurm cluster on this machine, for the tests and for trying the recipes.

`config` writes its files, `daemons` starts one daemon and waits for it,
`accounting` adds the database and slurmdbd (for sacct), `cluster` is the whole:
start, nodes idle, node failures, stop with nothing left; `jobs` is the client side
(submit, wait for a state, read `scontrol show job`).
"""
