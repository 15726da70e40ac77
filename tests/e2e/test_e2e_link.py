"""End to end: a degraded link on the collective path (torchchaos.faults.link).

Loss and a rate limit are nftables rules in a node's namespace; delay, jitter and
reordering need the kernel's netem qdisc, which this project's CI kernel does not
have ("Specified qdisc kind is unknown"), so a spec asking for them is refused
before any process starts, and says why.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, TARGET

from torchchaos.faults import link
from torchchaos.host import netns

pytestmark = pytest.mark.skipif(bool(netns.unavailable_reason()),
                                reason=netns.unavailable_reason() or "ok")

STEPS = ["--steps", "16", "--ckpt-every", "4", "--timeout", "3"]


def test_a_lossy_slow_link_is_survived_bitwise_and_healed(chaos_run):
    """5 % loss each way and 200 KB/s on node 1's link for 4 s: gloo's TCP retransmits,
    the job slows and completes, resumes nothing, matches the reference bitwise."""
    report = chaos_run(TARGET, faults=["link:node=1,step=6,loss=5,rate=200,for=4"],
                       args=STEPS, nproc=1, nodes=2, expect="pass")
    (fault,) = report.faults
    assert fault["fired"] is True, report.table()
    assert report.checks["deterministic_resume"]["ok"] is True
    assert report.checks["no_orphans"]["ok"] is True


def test_a_link_that_drops_everything_is_a_cut_the_timeouts_catch(chaos_run):
    """100 % loss for longer than the target's collective timeout (3 s): the ranks time
    out, torchrun restarts them once it heals, and the job resumes bitwise."""
    report = chaos_run(TARGET, faults=["link:node=1,step=6,loss=100,for=5"], args=STEPS,
                       nproc=1, nodes=2, expect="pass")
    assert report.restarts >= 1, report.table()
    assert report.checks["deterministic_resume"]["ok"] is True


@pytest.mark.skipif(not link.netem_missing(), reason="this kernel has netem: delay runs")
def test_a_delay_without_netem_is_refused_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--nodes", "2", "--network", "netns",
         "--out", str(tmp_path / "o"), "--fault", "link:node=1,step=6,delay=200,for=5", "--",
         str(TARGET)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert "link delay= needs the kernel's netem qdisc" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()
