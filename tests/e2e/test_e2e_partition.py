"""End to end: multi-node jobs, one network namespace per node, cut with nftables.

One gloo rank per node keeps the runs short on two cores. The reference
target (collective timeout 3 s) survives a node isolated mid-run (of two, of
three) and a cut of the rendezvous store only: its ranks time
out, torchrun restarts them, the rendezvous completes once the network heals,
and the run resumes bitwise. With torch's default timeouts nothing in the job
reacts to the cut: the harness declares the hang and names the partition.
Nothing (namespace, link, rule, process) outlives a run, interrupted or not.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TARGET, chaos_processes

from torchchaos import env
from torchchaos.host import netns, procs
from torchchaos.rundir.history import History

pytestmark = pytest.mark.skipif(bool(netns.unavailable_reason()),
                                reason=netns.unavailable_reason() or "ok")

STEPS = ["--steps", "16", "--ckpt-every", "4"]
TIMEOUTS = ["--timeout", "3"]  # the target's collective timeout
TWO_NODES = {"nproc": 1, "nodes": 2}


def _cuts(report) -> list[str]:
    harness = History.of_run(Path(report.run_dir))
    return [e["ev"] for e in harness.events if e["ev"].startswith("nemesis_")]


@pytest.mark.parametrize("fault", [
    # the three-node test below isolates a node too: this one only with -m slow
    pytest.param("partition:node=1,step=6,for=4", id="node isolated", marks=pytest.mark.slow),
    pytest.param("partition:shape=store,step=6,for=4", id="store only")])
def test_the_reference_target_survives_a_healed_partition(chaos_run, fault):
    report = chaos_run(TARGET, faults=[fault], args=[*STEPS, *TIMEOUTS], **TWO_NODES,
                       expect="pass")
    assert _cuts(report) == ["nemesis_begin", "nemesis_end"], report.table()
    assert report.checks["deterministic_resume"]["ok"] is True
    assert report.checks["no_split_brain"]["ok"] is True
    assert report.checks["no_orphans"]["ok"] is True


def test_three_nodes_survive_a_node_isolated_mid_run(chaos_run):
    """The fault-free reference is itself a three-node run to completion."""
    report = chaos_run(TARGET, faults=["partition:node=2,step=6,for=4"],
                       args=["--steps", "12", "--ckpt-every", "4", *TIMEOUTS], nproc=1,
                       nodes=3, expect="pass")
    assert report.restarts >= 1, report.table()
    assert report.checks["no_split_brain"]["ok"] is True
    logs = sorted(p.name for p in (Path(report.reference_dir) / "_chaos" / "logs").iterdir())
    assert logs == [f"launch-0-node-{n}.log" for n in range(3)]


def test_both_sides_publishing_a_checkpoint_is_a_split_brain(chaos_run):
    """The split_brain bug: each side of the cut trains on alone and saves step 8."""
    report = chaos_run(TARGET, faults=["partition:node=1,step=6,for=4"],
                       args=[*STEPS, *TIMEOUTS, "--bug", "split_brain"], **TWO_NODES,
                       expect="fail")
    check = report.checks["no_split_brain"]
    assert check["ok"] is False, report.table()
    # Which name the check finds first is timing: alone, both sides train rank 0's batches,
    # so their step-8 files can match byte for byte while the manifests, each rewritten
    # from what the other side had listed by then, differ. A CI run named the manifest.
    assert re.match(r"split brain during partition 1 \| 0: ckpt/(step-000008\.pt|manifest\.json)"
                    r" published with different contents by node 0 \(\w+\), node 1 \(",
                    check["detail"]), check


def test_a_target_without_timeouts_is_flagged_and_the_partition_named(chaos_run):
    start = time.monotonic()
    report = chaos_run(TARGET, faults=["partition:node=1,step=6"],
                       args=[*STEPS, "--default-timeouts"], **TWO_NODES, hang_timeout=5.0,
                       expect="fail")
    check = report.checks["hang_detected"]
    assert check["ok"] is False, report.table()
    assert "while partition 1 | 0 was in force" in check["detail"], check["detail"]
    assert _cuts(report) == ["nemesis_begin", "nemesis_end"]  # healed at teardown
    assert time.monotonic() - start < 90


@pytest.mark.slow  # tests/harness/test_hangwatch.py has the rule; this is the whole path (13 s)
def test_a_partition_that_never_heals_fails_fast_with_torchruns_stacks(chaos_run):
    """The ranks' timeouts fire, but node 1 can never rejoin the rendezvous."""
    report = chaos_run(TARGET, faults=["partition:node=1,step=6"], args=[*STEPS, *TIMEOUTS],
                       **TWO_NODES, hang_timeout=5.0, expect="fail")
    check = report.checks["hang_detected"]
    assert "the ranks' timeouts fired but the job could not start again" in check["detail"]
    assert "node 0 in DynamicRendezvousHandler.next_rendezvous" in check["detail"], check
    assert (Path(report.run_dir) / "_chaos" / "stacks" / "torchrun-node-0.txt").exists()


def test_an_interrupted_partitioned_run_leaves_nothing_behind(tmp_path_factory, tmp_path):
    out = tmp_path / "out"
    cache = tmp_path_factory.getbasetemp() / "torchchaos-cache"  # the plugin's: reference reused
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchchaos.cli", "run", "--nodes", "2", "--nproc", "1", "--out",
         str(out), "--cache-dir", str(cache), "--fault", "partition:node=1,step=4",
         "--", str(TARGET), *STEPS, "--default-timeouts"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    harness = out / "chaos" / "_chaos" / "history" / "harness.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and '"nemesis_begin"' not in _text(harness):
        time.sleep(0.2)
    assert '"nemesis_begin"' in _text(harness), "the partition should be in force"
    runs = {values[env.RUN_ID][:8] for values in procs.env_vars((env.RUN_DIR, env.RUN_ID)).values()
            if values.get(env.RUN_DIR, "").startswith(str(tmp_path)) and env.RUN_ID in values}
    assert runs, "the run's processes carry its id"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    assert chaos_processes(tmp_path) == []
    # the namespaces took their rules with them (this run's: others may run beside it)
    assert [left for run in runs for left in netns.leftovers(run)] == []


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""
