"""Where the harness keeps its files inside a run directory.

The run directory is also the target's working directory, so everything the
harness writes lives under one sub-folder, `_chaos/`, that targets never see.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CHAOS_DIR = "_chaos"


@dataclass(frozen=True)
class RunLayout:
    run_dir: Path

    @property
    def chaos_dir(self) -> Path:
        return self.run_dir / CHAOS_DIR

    @property
    def history_dir(self) -> Path:
        return self.chaos_dir / "history"

    @property
    def fired_dir(self) -> Path:
        return self.chaos_dir / "fired"

    @property
    def lasting_dir(self) -> Path:
        """Faults whose effect outlives the process it fired in (a defective device):
        one note each, `{"fault": ..., ...}`, carried by every process that starts where
        it lasts (`FaultKind.carry`)."""
        return self.chaos_dir / "lasting"

    @property
    def logs_dir(self) -> Path:
        return self.chaos_dir / "logs"

    @property
    def gate_file(self) -> Path:
        """Written when a job held at its gate may start (`torchchaos.harness.gate`)."""
        return self.chaos_dir / "gate"

    @property
    def tmp_dir(self) -> Path:
        return self.chaos_dir / "tmp"

    @property
    def stopped_dir(self) -> Path:
        """One marker per rank that stopped as asked (Scenario.stop_after)."""
        return self.chaos_dir / "stopped"

    @property
    def schedule_file(self) -> Path:
        return self.chaos_dir / "schedule.json"

    @property
    def weights_dir(self) -> Path:
        """Each rank's weights after its latest step (`torchchaos.rank.weights`)."""
        return self.chaos_dir / "weights"

    @property
    def beats_dir(self) -> Path:
        """Each rank's heartbeat (`torchchaos.rundir.heartbeat`)."""
        return self.chaos_dir / "beats"

    def beat_file(self, rank: int) -> Path:
        return self.beats_dir / f"rank-{rank}.json"

    @property
    def stacks_dir(self) -> Path:
        """Stacks of a hung job's ranks (`torchchaos.host.stacks`)."""
        return self.chaos_dir / "stacks"

    def faulthandler_file(self, rank: int, pid: int) -> Path:
        """Where the agent's faulthandler writes a process's stacks on request."""
        return self.stacks_dir / f"rank-{rank}.pid-{pid}.txt"

    @property
    def snapshot_dir(self) -> Path:
        """What the checkpoint folders held once a save ended (`env.SNAPSHOT_AFTER_SAVE`)."""
        return self.chaos_dir / "snapshot"

    @property
    def requests_dir(self) -> Path:
        """A rank's requests for harness faults (`torchchaos.harness.nemesis`)."""
        return self.chaos_dir / "requests"

    def weights_file(self, rank: int) -> Path:
        return self.weights_dir / f"rank-{rank}.pt"

    def rank_history(self, rank: int) -> Path:
        return self.history_dir / f"rank-{rank}.jsonl"

    @property
    def harness_history(self) -> Path:
        return self.history_dir / "harness.jsonl"

    def link(self, targets: list[str]) -> None:
        """Show each target in the run directory under its own name (Scenario.links). The
        nodes of one job share the run directory, so a link already in place is kept."""
        for target in targets:
            link = self.run_dir / Path(target).name
            if not (link.is_symlink() and os.readlink(link) == target):
                link.symlink_to(target)

    def create(self) -> None:
        for folder in (self.history_dir, self.fired_dir, self.logs_dir, self.tmp_dir,
                       self.stopped_dir, self.weights_dir, self.beats_dir, self.stacks_dir):
            folder.mkdir(parents=True, exist_ok=True)
