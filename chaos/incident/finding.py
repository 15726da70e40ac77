"""What an import concludes: the finding (the fault, its rank, phase and step window), each
rank's story, the restart's own failure, and the incident that holds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchchaos.incident.observations import (
    Observation,
)

KINDS = ("oom", "crash", "dataloader", "abort", "exception", "hang", "preempt", "kill", "node",
         "torn_write", "power_loss", "unknown")


PHASES = ("startup", "between_saves", "mid_save", "load", "after_resume", "exit", "unknown")


# how a hang reads where the rank waited in its data loader (mapping replays it so)
LOADER_WAIT = "waiting for a batch from its DataLoader worker"


@dataclass
class RankStory:
    """One rank as the artefacts tell it."""

    rank: int
    last_step: int | None = None
    end: str = ""              # "SIGKILL", "exit 1", "stopped by the launcher", "OOM-killed"
    error: str = ""            # its own last error line
    frame: str = ""            # where it was: the innermost frame that says
    phase: str | None = None   # what that frame says (save, load, collective, ...)
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, "", [])}


@dataclass
class Finding:
    """The fault the artefacts point to."""

    kind: str = "unknown"
    rank: int | None = None
    node: int | None = None
    role: str = "unknown"       # writer | other | node | job | unknown
    phase: str = "unknown"
    phase_seen: bool = False    # False: placed by rule, not seen in a frame or a file
    # mid_save seen as a peer waiting inside a save of its own (every rank takes part in
    # the save): the failing rank was deep enough in it that the others had joined
    peers_in_save: bool = False
    how: str = ""               # SIGKILL, SIGTERM, SIGSEGV, "RuntimeError: ...", OOM
    collective: str | None = None
    step_window: tuple[int | None, int | None] = (None, None)
    # which save of its launch (1st, 2nd, ...) a death mid-save fell in, where the rule
    # that placed it names that save's step and the steps between saves are known
    save: int | None = None
    # other kinds the same artefacts fit, said rather than chosen between, and why
    alternatives: list[str] = field(default_factory=list)
    alternatives_why: str = ""
    rules: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        found = {k: v for k, v in self.__dict__.items() if v not in (None, "", [])}
        found["step_window"] = list(self.step_window)
        return found


@dataclass
class RestartFailure:
    """The restart's own failure, where the restart after the first failure failed too."""

    rank: int | None
    phase: str      # load | mid_save | after_resume | unknown
    how: str        # its error, first sentence
    source: str
    # the error says the checkpoint it read is bad or missing (a file that does not
    # load, a key or file not there): the script's own doing after the first failure,
    # which a replay of that failure reproduces; else a fault of its own (an I/O error,
    # a timeout, any other exception raised while the data was fine)
    bad_data: bool = False
    role: str = "unknown"   # writer | other, as the first failure's rank is told

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Incident:
    finding: Finding
    ranks: dict[int, RankStory]
    restarts: int = 0
    resumed: list[str] = field(default_factory=list)   # what the logs say it resumed from
    checkpoints: list[str] = field(default_factory=list)  # checkpoint files that do not load
    unknowns: list[str] = field(default_factory=list)
    script: str | None = None
    world_size: int | None = None
    recovery: str = "not seen"  # what the restart after the first failure did
    restart_failure: RestartFailure | None = None
    save_interval: int | None = None  # the steps between the job's saves, where known

    def to_dict(self) -> dict[str, Any]:
        return {"finding": self.finding.to_dict(),
                "ranks": {str(r): s.to_dict() for r, s in sorted(self.ranks.items())},
                "restarts": self.restarts, "resumed": self.resumed,
                "checkpoints": self.checkpoints, "unknowns": self.unknowns,
                "recovery": self.recovery,
                **({"restart_failure": self.restart_failure.to_dict()}
                   if self.restart_failure else {}),
                **({"world_size": self.world_size} if self.world_size else {})}


def say(finding: Finding, rule: str, *sources: Observation) -> None:
    finding.rules.append(rule)
    finding.sources += [str(o.source) for o in sources if str(o.source) not in finding.sources]


@dataclass
class FirstFailure:
    """What the failure rules read: the observations of the launch where the first failure
    shows (and those tied to no launch), the pids the launcher stopped itself, each rank's
    story, and the finding the rule that applies fills in."""

    obs: list[Observation]
    stopped: set[int | None]
    ranks: dict[int, RankStory]
    finding: Finding
    # an error the rule found to be the first failure's consequence, not a failure of its
    # own (a resume that died loading the file a save cut short): the restart's failure
    consequence: Observation | None = None
    # a launch whose log ended with no failure and no success, and what shows a later
    # launch took over (a resume, a failed load, a log that went on past it): its end is
    # the first failure, and the later launch's lines are not in `obs`
    vanished: tuple[str, Observation] | None = None
