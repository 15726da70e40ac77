"""A scenario: which job to run, which faults to inject, which checks to apply.

Python (pytest), the CLI and (later) YAML files all build this one object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from torchchaos.errors import UsageError
from torchchaos.faults.registry import get_kind
from torchchaos.host import netns
from torchchaos.judge import checks_by_name as check_registry
from torchchaos.rundir.layout import CHAOS_DIR
from torchchaos.scenario.spec import FaultSpec, parse_fault_spec

NETWORKS = ("auto", "netns", "docker", "host")
PROCESSES_PER_CORE = 4  # beyond this many ranks per core a run only measures the scheduler
# What one rank takes at the least, for the bound --force cannot pass: a rank of the
# bundled target (targets/ddp_lm.py, CPU torch 2.13 with the agent) was measured at 316 MiB
# resident, 216 MiB of it its own (USS), and 6-7 threads. Floors below that, so that only
# a job that cannot fit however small its ranks is refused.
RANK_BYTES_FLOOR = 150 << 20
RANK_TASKS_FLOOR = 4  # threads count against pid_max and RLIMIT_NPROC too


@dataclass
class Scenario:
    script: str
    args: list[str] = field(default_factory=list)  # the script's own arguments
    nproc: int = 2  # ranks per node (torchrun --nproc-per-node)
    nodes: int = 1  # simulated nodes on this machine, each its own torchrun
    # "netns": each node in its own network namespace (root); "docker": each node a
    # container, its own disk too (torchchaos.host.docker.nodes); "host": the nodes share
    # the machine's loopback; "auto": netns for 2+ nodes where it can be made
    network: str = "auto"
    min_nodes: int | None = None  # elastic: torchrun --nnodes MIN:nodes (None: fixed size)
    faults: list[FaultSpec] = field(default_factory=list)
    checks: list[str] | None = None  # None: every check that applies
    max_lost_steps: int | None = None  # None: the checkpoint interval seen in the reference
    max_lost_seconds: float | None = None  # bounded_lost_work in seconds (None: unbounded)
    max_detect_steps: int | None = None  # sdc_detected: None means the checkpoint interval
    # hang_detected: the job is hung after this many seconds without progress on any rank
    # (None: 10 s, or 3x the longest the reference went without progress)
    hang_timeout: float | None = None
    seed: int = 0  # picks `one` targets and p= triggers, the same each run
    timeout: float = 300.0  # seconds, for each run (reference and chaos)
    max_restarts: int = 3  # torchrun's elastic restarts within one launch
    max_relaunches: int = 2  # times the whole job is requeued after it died
    reference_runs: int = 1  # 2 also proves the target deterministic without faults
    # End the chaos run this many steps after a recovery instead of at the last step
    # (crash points: what matters is the restore and the first steps after it).
    stop_after: int | None = None
    # Fingerprint every step of the chaos run in full, not only around restores and faults
    # (a divergence that first shows on a light step is then attributed to a component).
    full_fingerprints: bool = False
    # A folder copied into the chaos run's directory before it starts (crash points start
    # from the checkpoints there were before the save under test); never the reference's.
    start_from: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to the ranks' environment
    # Files and folders every run directory shows under their own names (symlinks): what a
    # script opens by a fixed relative name, nanoGPT's configurator.py and data/
    links: list[str] = field(default_factory=list)
    # Failure rate for the report's Young/Daly checkpoint interval (large jobs: about one
    # interruption every 3 hours); it changes no verdict
    mtbf_hours: float = 3.0

    def __post_init__(self) -> None:
        # absolute from where torchchaos started: each run's working directory is its own
        self.links = [str(Path(link).expanduser().absolute()) for link in self.links]

    @classmethod
    def build(cls, script: str, faults: list[str] | None = None, **kwargs: object) -> Scenario:
        """Build from fault spec strings; validates everything."""
        specs = [parse_fault_spec(text) for text in faults or []]
        scenario = cls(script=script, faults=specs, **kwargs)  # type: ignore[arg-type]
        scenario.validate()
        return scenario

    def validate(self) -> None:
        path = Path(self.script)
        if not path.is_file():
            raise UsageError(f"training script not found: {self.script}")
        if self.nproc < 1 or self.nodes < 1:
            raise UsageError("--nproc and --nodes must be >= 1")
        if self.network not in NETWORKS:
            raise UsageError(f"unknown --network {self.network!r} (known: {', '.join(NETWORKS)})")
        if self.network in netns.NODE_NETWORKS and netns.unavailable_reason():
            raise UsageError(f"--network {self.network}: {netns.unavailable_reason()}")
        if self.network == "docker":
            from torchchaos.host.docker.engine import need

            need()
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise UsageError(f"--min-nodes must be between 1 and --nodes ({self.nodes})")
        self._check_faults()
        if self.timeout <= 0:
            raise UsageError("--timeout must be > 0 seconds")
        if self.hang_timeout is not None and self.hang_timeout <= 0:
            raise UsageError("--hang-timeout must be > 0 seconds")
        if self.max_lost_steps is not None and self.max_lost_steps < 0:
            raise UsageError("--max-lost-steps must be >= 0")
        if self.max_lost_seconds is not None and not self.max_lost_seconds >= 0:
            raise UsageError("--max-lost-seconds must be >= 0")
        if self.max_detect_steps is not None and self.max_detect_steps < 0:
            raise UsageError("--max-detect-steps must be >= 0")
        if self.stop_after is not None and self.stop_after < 1:
            raise UsageError("--steps-after-resume must be >= 1")
        if not self.mtbf_hours > 0:
            raise UsageError("--mtbf must be > 0 hours")
        if self.reference_runs not in (1, 2):
            raise UsageError("--reference-runs must be 1 or 2")
        check_registry.validate(self.checks or [])
        self._check_links()

    def _check_links(self) -> None:
        names: set[str] = set()
        for link in self.links:
            name = Path(link).name
            if not Path(link).exists():
                raise UsageError(f"--link {link}: no such file or folder")
            if name in names or name in ("", ".", "..", CHAOS_DIR):
                raise UsageError(f"--link {link}: the run directory already has a {name!r}"
                                 " (each link shows under its own name)")
            names.add(name)

    def _check_faults(self) -> None:
        """Each fault against the job's shape, then each kind's faults together."""
        by_kind: dict[str, list[dict[str, object]]] = {}
        for spec in self.faults:
            get_kind(spec.kind).check_job(spec.params, self.nodes, self.network_kind)
            self._check_target(spec)
            by_kind.setdefault(spec.kind, []).append(spec.params)
        for name, params in by_kind.items():
            get_kind(name).check_together(params)

    def _check_target(self, spec: FaultSpec) -> None:
        """A rank or node index the job has (symbolic targets are drawn from those)."""
        if not spec.target.isdigit():
            return
        size = self.world_size if spec.target_type == "rank" else self.nodes
        if int(spec.target) >= size:
            raise UsageError(f"fault {spec.text!r}: {spec.target_type} {spec.target} does not"
                             f" exist (the job has {size} {spec.target_type}s)")

    def check_machine(self, force: bool = False) -> None:
        """Refuse (unless forced) a job with far more ranks than this machine has cores:
        every simulated node runs here, and such a run judges only the scheduler. The
        CLI's job options call it (they have --force); not part of validate(), so that a
        scenario file recorded on a bigger machine still replays."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self._check_capacity()
        if force or self.world_size <= PROCESSES_PER_CORE * cores:
            return
        raise UsageError(f"--nproc {self.nproc} x --nodes {self.nodes} = {self.world_size}"
                         f" ranks on {cores} core(s), more than {PROCESSES_PER_CORE} per core:"
                         " pass --force to run anyway")

    def _check_capacity(self) -> None:
        """Refuse, --force or not, more ranks than this machine can hold at all: every
        rank forks here, and a job past its memory or process limit takes the machine
        down with it instead of running slowly."""
        most, why = machine_capacity()
        if self.world_size + self.nodes > most:  # + one torchrun agent per node
            raise UsageError(f"--nproc {self.nproc} x --nodes {self.nodes} ="
                             f" {self.world_size} ranks: this machine holds at most"
                             f" {max(most - self.nodes, 0)} ({why}), even with --force;"
                             " lower --nproc or --nodes")

    @property
    def world_size(self) -> int:
        return self.nproc * self.nodes

    @property
    def network_kind(self) -> str:
        """"netns", "docker" or "host": what `network` comes to on this machine."""
        if self.network != "auto":
            return self.network
        return "netns" if self.nodes > 1 and not netns.unavailable_reason() else "host"


def machine_capacity() -> tuple[int, str]:
    """The most processes of the smallest rank this machine can hold, and what bounds it:
    its memory (or its cgroup's) at RANK_BYTES_FLOOR each, or the tasks it may still start
    (pid_max, the user's RLIMIT_NPROC) at RANK_TASKS_FLOOR each."""
    memory = _memory_bytes()
    by_memory = memory // RANK_BYTES_FLOOR
    tasks, limit = _tasks_left()
    by_tasks = tasks // RANK_TASKS_FLOOR
    if by_memory <= by_tasks:
        return by_memory, (f"{memory >> 20} MiB of memory at {RANK_BYTES_FLOOR >> 20} MiB"
                           " a rank at the least")
    return by_tasks, f"{tasks} more tasks under {limit} at {RANK_TASKS_FLOOR} a rank"


def _memory_bytes() -> int:
    """Physical memory, or the cgroup v2 limit of this process where lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        group = Path("/proc/self/cgroup").read_text().strip().rpartition(":")[2]
        limit = Path(f"/sys/fs/cgroup{group}/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def _tasks_left() -> tuple[int, str]:
    """How many more tasks (processes and threads) may start, and which limit says so."""
    import resource

    left: dict[str, int] = {}
    try:  # every task of the machine, against the pids there are
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
        left["pid_max"] = int(Path("/proc/sys/kernel/pid_max").read_text()) - running
    except (OSError, ValueError, IndexError):
        pass
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft != resource.RLIM_INFINITY and os.geteuid() != 0:  # root is not held to it
        left["RLIMIT_NPROC"] = soft  # the user's own tasks not subtracted: an upper bound
    if not left:
        return 1 << 30, "no limit known"
    name = min(left, key=left.__getitem__)
    return max(left[name], 0), name
