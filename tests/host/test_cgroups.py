"""Memory cgroups of the oom fault: a real limit, a real kernel OOM kill of one process,
the kernel's report read back, and nothing left after removal."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from torchchaos.host import cgroups, leftovers, lifeline

ROOT = cgroups.memory_root()
NEEDS_CGROUPS = pytest.mark.skipif(ROOT is None, reason="no writable memory cgroup"
                                   " hierarchy (not root, or no memory controller)")

# 1 GiB in 4 MiB pieces: far over the limit, harmless if the limit did not hold
FILL = "import sys; sys.stdin.readline(); kept = [bytearray(1 << 22) for _ in range(256)]"


@NEEDS_CGROUPS
def test_a_process_over_its_cgroup_limit_is_killed_by_the_kernel_and_reported():
    assert ROOT is not None
    run_id = uuid.uuid4().hex[:12]
    lifeline.own(run_id)  # a harness starting beside it (pytest -n) leaves it alone
    group = cgroups.create_run_group(ROOT, run_id)
    try:
        proc = subprocess.Popen([sys.executable, "-c", FILL], stdin=subprocess.PIPE, text=True)
        cgroups.confine(group, f"rank-1-{proc.pid}", 32 << 20, proc.pid)
        assert any(x.kind == "cgroup" and x.run == run_id for x in leftovers.inventory())
        proc.communicate("go\n", timeout=60)
        assert proc.returncode == -9, "the kernel's OOM killer sends SIGKILL"
        report = cgroups.oom_reports(cgroups.kernel_log(), group)
        if report:  # dmesg may be closed to this user; the kill above is the fact
            assert any(f"Killed process {proc.pid}" in line for line in report), report
            assert "invoked oom-killer" in report[0]
    finally:
        cgroups.remove(group)
    assert not group.exists()
    assert not any(x.kind == "cgroup" and x.run == run_id for x in leftovers.inventory())


def test_only_reports_naming_the_runs_group_are_kept():
    lines = [
        "[1.0] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0",
        "[1.1] oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/torchchaos-abc/rank-1-7,pid=7",
        "[1.2] Memory cgroup out of memory: Killed process 7 (python) total-vm:1kB",
        "[2.0] java invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0",
        "[2.1] oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/other/job,pid=9",
        "[2.2] Memory cgroup out of memory: Killed process 9 (java) total-vm:1kB",
    ]
    assert cgroups.oom_reports(lines, Path("/sys/fs/cgroup/memory/torchchaos-abc")) == lines[:3]
