"""Resolve symbolic fault targets with one seeded RNG and store the result.

The seed alone does not make a run replayable (real concurrency is not
deterministic), so the *resolved* schedule is written into every run
directory; the agent in each rank reads it from there.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from chaos.errors import UsageError
from chaos.spec import FaultSpec, Trigger


@dataclass(frozen=True)
class ResolvedFault:
    id: str  # unique within the run; names the fault's "fired" marker file
    kind: str
    target_type: str  # "rank" or "node"
    index: int
    trigger: Trigger
    params: dict[str, object]
    spec: str
    seed: int  # for probabilistic triggers

    def describe(self) -> str:
        return f"{self.kind}:{self.target_type}={self.index},{self.trigger.describe()}"

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["trigger"] = asdict(self.trigger)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ResolvedFault:
        fields = dict(data)
        fields["trigger"] = Trigger(**fields["trigger"])
        return cls(**fields)


def resolve(specs: list[FaultSpec], seed: int, nproc: int, nodes: int) -> list[ResolvedFault]:
    """Turn symbolic targets into indices; raise UsageError for out-of-range ones."""
    rng = random.Random(seed)
    resolved = []
    for number, spec in enumerate(specs):
        size = nproc * nodes if spec.target_type == "rank" else nodes
        if spec.target == "one":
            index = rng.randrange(size)
        else:
            index = int(spec.target)
            if index >= size:
                raise UsageError(
                    f"fault {spec.text!r}: {spec.target_type} {index} does not exist"
                    f" (the job has {size} {spec.target_type}s)"
                )
        fault_id = f"f{number}-{spec.kind}"
        resolved.append(
            ResolvedFault(fault_id, spec.kind, spec.target_type, index, spec.trigger,
                          dict(spec.params), spec.text, rng.randrange(2**31))
        )
    return resolved


def save(faults: list[ResolvedFault], path: Path) -> None:
    """Replace the file atomically: on several machines each node's harness writes the
    same schedule while another's workers may already read it."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps([f.to_dict() for f in faults], indent=2))
    os.replace(temp, path)


def load(path: Path) -> list[ResolvedFault]:
    if not path.exists():
        return []
    return [ResolvedFault.from_dict(d) for d in json.loads(path.read_text())]
