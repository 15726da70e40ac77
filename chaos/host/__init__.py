"""Things of this machine the harness drives: processes, network namespaces, mounts, stacks."""
