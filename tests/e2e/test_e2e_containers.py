"""End to end: nodes as containers (`--network docker`), each with a disk of its own.

The same faults as on namespace nodes, judged by the same checks: a node killed (its
container replaced before the relaunch, its `/local` gone with it) and a partition that
cuts a container's link. Then what only a node's own disk shows: a job that records a
checkpoint as the newest while it still lies only on the writer's node-local disk
(`tests/scripts/local_staging_ddp.py --commit-early`) cannot resume once that node dies;
the same job that uploads before it records passes. On namespace nodes the first passes
too: their "local" disk outlives the node, and the restart finishes the upload. One
gloo rank per node; the module's
runs share one worker (each starts an engine of its own, 0.3 s, and its containers).
"""

from __future__ import annotations

import pytest
from conftest import REPO, TARGET

from torchchaos.host import engine_folders as folders
from torchchaos.host import netns
from torchchaos.host.docker import engine

UNAVAILABLE = engine.unavailable_reason() or netns.unavailable_reason()
pytestmark = [pytest.mark.xdist_group("docker-engine"),
              pytest.mark.skipif(bool(UNAVAILABLE), reason=UNAVAILABLE or "ok")]

NODES = {"nproc": 1, "nodes": 2, "network": "docker"}
STEPS = ["--steps", "12", "--ckpt-every", "4"]
STAGING = str(REPO / "tests" / "scripts" / "local_staging_ddp.py")


def _nothing_left(report) -> None:
    """No process, mount or network of the run (the check), and no engine: the run's was
    the only one (this module's tests share a worker with the engine's own)."""
    assert report.checks["no_orphans"]["ok"] is True, report.table()
    assert folders.leftovers() == [], report.table()


def test_a_killed_container_node_is_a_new_machine_and_the_job_resumes(chaos_run):
    report = chaos_run(TARGET, faults=["kill:node=1,step=6"], args=STEPS, expect="pass",
                       **NODES)
    assert report.restarts >= 1, report.table()
    _nothing_left(report)


def test_a_partition_cuts_a_container_nodes_link(chaos_run):
    report = chaos_run(TARGET, faults=["partition:node=1,step=6,for=4"],
                       args=[*STEPS, "--timeout", "3"], expect="pass", **NODES)
    assert report.restarts >= 1, report.table()
    assert report.checks["no_split_brain"]["ok"] is True, report.table()
    _nothing_left(report)


def test_a_script_written_apart_rides_out_a_partition_of_container_nodes(chaos_run):
    """No collective timeout in it (gloo's 30 min): its connections outlast a 4 s cut."""
    report = chaos_run(STAGING, faults=["partition:node=1,step=6,for=4"], args=STEPS,
                       expect="pass", **NODES)
    assert report.checks["no_split_brain"]["ok"] is True, report.table()
    _nothing_left(report)


def test_a_checkpoint_committed_while_only_on_node_local_disk_is_lost_with_the_node(
        chaos_run):
    """Saved at step 4 to the writer's /local, named newest in the shared folder at once,
    uploaded only at the next save: node 0 dies at step 6, and every relaunch finds the
    newest checkpoint missing."""
    report = chaos_run(STAGING, faults=["kill:node=0,step=6"],
                       args=[*STEPS, "--commit-early"], expect="fail", **NODES)
    assert not report.checks["completes"]["ok"], report.table()
    _nothing_left(report)


def test_on_namespace_nodes_the_local_disk_outlives_the_node_and_hides_the_bug(chaos_run):
    """Why container nodes: the same job and fault on namespace nodes passes, its restart
    finding the staged file the dead node left on the machine's disk."""
    report = chaos_run(STAGING, faults=["kill:node=0,step=6"],
                       args=[*STEPS, "--commit-early", "--local-dir", "{run_dir}/local"],
                       expect="pass", nproc=1, nodes=2, network="netns")
    assert report.restarts >= 1, report.table()


def test_a_checkpoint_uploaded_before_it_is_committed_survives_the_node(chaos_run):
    report = chaos_run(STAGING, faults=["kill:node=0,step=6"], args=STEPS, expect="pass",
                       **NODES)
    assert report.restarts >= 1, report.table()
    _nothing_left(report)


def test_a_paused_container_node_stalls_the_job_which_goes_on(chaos_run):
    """`docker pause` of node 1's container for 3 s, shorter than the target's collective
    timeout: node 0 cannot finish step 7 before node 1 is unpaused, then the job goes on
    without a restart and matches the reference bitwise."""
    from test_e2e_freeze import how_frozen, stall

    report = chaos_run(TARGET, faults=["freeze:node=1,step=6,for=3"], args=STEPS,
                       expect="pass", **NODES)
    assert how_frozen(report.run_dir) == ["docker pause"], report.table()
    assert report.restarts == 0, report.table()
    assert stall(report.run_dir, 1, 0, 6) >= 3.0, report.table()
    assert report.checks["deterministic_resume"]["ok"] is True, report.table()
    _nothing_left(report)


# A defective device (torchchaos.faults.miscompute) stays with its machine: node 1's
# rank computes every 50th product wrong from step 5 on, and node 1 dies after step 8.
DEFECT = ["miscompute:rank=1,step=4,every=50", "kill:node=1,step=8"]


def _carried(report) -> list:
    from pathlib import Path

    from torchchaos.rundir.history import History

    return History.of_run(Path(report.run_dir)).of("defect_carried")


def test_a_replaced_container_node_is_a_new_device_without_the_defect(chaos_run):
    """The relaunch runs on a new container: a new machine, so the defect stays with the
    one that died, and the restart from the clean step-4 checkpoint ends bitwise equal."""
    report = chaos_run(TARGET, faults=DEFECT, args=STEPS, expect="pass", **NODES)
    assert report.restarts >= 1, report.table()
    assert _carried(report) == [], report.table()
    assert report.checks["sdc_detected"]["ok"] is True, report.table()
    _nothing_left(report)


def test_on_namespace_nodes_the_same_node_is_the_same_defective_device(chaos_run):
    report = chaos_run(TARGET, faults=DEFECT, args=STEPS, expect="fail", nproc=1, nodes=2,
                       network="netns")
    assert [e["rank"] for e in _carried(report)] == [1], report.table()
    assert report.checks["sdc_detected"]["ok"] is False, report.table()
