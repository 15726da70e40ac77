"""Ready-made chaos suites to run against your own training script.

    pytest --pyargs torchchaos.suites --chaos-script train.py \
        --chaos-args "--ckpt-dir {run_dir}/ckpt"

or configure the job once under `[tool.torchchaos]` in pyproject.toml and
run `pytest --pyargs torchchaos.suites` (`-m chaos_kills`, `chaos_storage`, `chaos_sdc`,
`chaos_hangs`, `chaos_partitions` pick one suite). Each case is a name; the
steps and file events it lands on come from your job's fault-free run
(`torchchaos.explore.suite`).
"""
