"""Resolve symbolic fault targets with one seeded RNG and store the result.

The seed alone does not make a run replayable (real concurrency is not
deterministic), so the *resolved* schedule is written into every run
directory; the agent in each rank reads it from there.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from torchchaos.errors import UsageError
from torchchaos.faults.contract import ResolvedFault
from torchchaos.scenario.spec import FaultSpec

__all__ = ["ResolvedFault", "load", "resolve", "save"]


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
