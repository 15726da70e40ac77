"""Environment variables through which the runner talks to the agent in each rank."""

import importlib.util
import os
from pathlib import Path

RUN_DIR = "TORCHCHAOS_RUN_DIR"  # the run directory; its presence arms the agent in workers
RUN_ID = "TORCHCHAOS_RUN_ID"  # marks every process of a run, so none escapes reaping
# marks a harness helper (a fault filesystem daemon) with the run it serves: reaped with
# the run's leftovers, but not by the run's own reaping (the harness stops it in order)
HELPER = "TORCHCHAOS_HELPER_OF"
# the lock file of the harness that started this process (torchchaos.host.owners): the
# process is a leftover once that lock is dead, wherever the harness kept it
LOCK = "TORCHCHAOS_LOCK"
REFERENCE = "TORCHCHAOS_REFERENCE"  # run dir of the reference run (absent in the reference)
LAUNCH = "TORCHCHAOS_LAUNCH"  # how many times the runner relaunched the whole job
# JSON list: the names --link shows in the run directory (inputs every run shares; a
# rank's reads of them are no checkpoint load)
LINKED = "TORCHCHAOS_LINKED"
T0 = "TORCHCHAOS_T0"  # time.monotonic() when the job first started, for time= triggers
# "1": every step of a chaos run is fingerprinted in full, not only around restores
# and faults (Scenario.full_fingerprints)
FULL_FINGERPRINTS = "TORCHCHAOS_FULL_FINGERPRINTS"
STOP_AFTER = "TORCHCHAOS_STOP_AFTER"  # a recovered rank stops this many steps after its restore
STOP_AT_STEP = "TORCHCHAOS_STOP_AT_STEP"  # every rank stops once it finished this step
RECOVERY = "TORCHCHAOS_RECOVERY"  # "1": the first launch is already a recovery (crash states)
# a file: a rank waits, warmed up, until it exists before the script's first line runs
# (a crash state's next recovery starts while the current one runs: harness.gate)
GATE = "TORCHCHAOS_GATE"
RECORD_SYNC = "TORCHCHAOS_RECORD_SYNC"  # "1": record the collectives ranks enter (syncwatch)
AGENT_PID = "TORCHCHAOS_AGENT_PID"  # set by an armed agent; children that inherit it stay inert
# rank 0 copies what its saves wrote into _chaos/snapshot/ once this save ended (crash
# points then start from the checkpoints before the save under test)
SNAPSHOT_AFTER_SAVE = "TORCHCHAOS_SNAPSHOT_AFTER_SAVE"
OOM_CGROUP = "TORCHCHAOS_OOM_CGROUP"  # the run's memory cgroup folder (the oom fault)
# "1" in the harness's own environment: every job's ranks start as torchrun starts
# them, exec'd (cold), not forked from a launcher with torch imported (warm)
COLD_START = "TORCHCHAOS_COLD_START"
# "0" in the harness's own environment: every warm job's torchrun an interpreter of its
# own, not forked from the harness's launcher server (torchchaos.harness.spare)
SPARE_LAUNCHER = "TORCHCHAOS_SPARE_LAUNCHER"
# a socket where another process lends its launcher server (torchchaos.harness.spare.share)
LAUNCHER_SOCKET = "TORCHCHAOS_LAUNCHER_SOCKET"
# marks every process of a Slurm cluster on this machine (torchchaos.host.slurm) with its
# id, and a node's slurmd, its slurmstepds and their tasks with "<id>:<node>"
CLUSTER = "TORCHCHAOS_CLUSTER"
CLUSTER_NODE = "TORCHCHAOS_CLUSTER_NODE"
# marks a Docker engine a harness started (torchchaos.host.docker): dockerd, its
# containerd and their shims (a container's own processes are found by their cgroup)
ENGINE = "TORCHCHAOS_ENGINE"


def cold_start() -> bool:
    """Whether the user asked for exec'd ranks (TORCHCHAOS_COLD_START=1)."""
    return os.environ.get(COLD_START, "") not in ("", "0")


def package_dir(name: str = "torchchaos") -> Path:
    """The folder a package of ours lives in, found without importing it: the
    repository's chaos/, faults/, ... in an editable install, site-packages/torchchaos/...
    in a wheel's."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def import_path() -> list[str]:
    """What a child interpreter needs on PYTHONPATH to `import torchchaos`: the folder
    holding `torchchaos/` for a wheel put there by hand, nothing for a package an
    interpreter of this environment already finds (an editable install maps the
    namespace through its own finder; putting the repository on the path would let its
    `targets/` shadow a user's)."""
    here = package_dir()
    return [str(here.parent)] if here.name == "torchchaos" else []
