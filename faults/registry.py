"""Fault kinds by name, loaded on first use.

The registry imports no fault implementation: it maps each kind's name to a
dotted path (`module:Class`) and imports the module only when the kind is
first asked for. The built-in kinds are listed below; other packages add
kinds through the `torchchaos.faults` entry-point group, whose entries have
the same shape (see the README's "Writing a fault kind"):

    [project.entry-points."torchchaos.faults"]
    slowdisk = "mypackage.slowdisk:SlowDisk"

A name is the spec's `KIND` (`slowdisk:rank=0,step=5`); the class is a
`torchchaos.faults.contract.FaultKind` whose `name` must equal it.
"""

from __future__ import annotations

from torchchaos.entrypoints import Registry
from torchchaos.faults.contract import FaultKind

ENTRY_POINT_GROUP = "torchchaos.faults"

BUILTIN: dict[str, str] = {
    "abort": "torchchaos.faults.abort:Abort",
    "bitflip": "torchchaos.faults.bitflip:BitFlip",
    "crash": "torchchaos.faults.crash:Crash",
    "dataloader": "torchchaos.faults.dataloader:DataLoaderWorker",
    "gpu": "torchchaos.faults.gpu:GpuError",
    "hang": "torchchaos.faults.hang:Hang",
    "kill": "torchchaos.faults.kill:Kill",
    "oom": "torchchaos.faults.oom:OutOfMemory",
    "partition": "torchchaos.faults.partition:Partition",
    "link": "torchchaos.faults.link:Link",
    "freeze": "torchchaos.faults.freeze:Freeze",
    "miscompute": "torchchaos.faults.miscompute:Miscompute",
    "raise": "torchchaos.faults.exception:Raise",
    "storage": "torchchaos.faults.storage:Storage",
    "slurm": "torchchaos.faults.slurm:Slurm",
    "straggler": "torchchaos.faults.straggler:Straggler",
    "toxic": "torchchaos.faults.toxic:Toxic",
}

KINDS: Registry[FaultKind] = Registry(ENTRY_POINT_GROUP, BUILTIN, "fault kind", FaultKind)


def kind_paths() -> dict[str, str]:
    """Every known kind's name and dotted path; built-ins win over plug-ins."""
    return KINDS.paths()


def get_kind(name: str) -> FaultKind:
    """The kind named `name`, imported now if it was not yet."""
    return KINDS.get(name)


def all_kinds() -> dict[str, FaultKind]:
    """Every kind, loaded (`torchchaos faults`): a plug-in that does not load is an error."""
    return {name: get_kind(name) for name in sorted(kind_paths())}


def loadable_kinds() -> dict[str, FaultKind]:
    """Every kind that loads, for what only looks kinds over (the timeline's marks, the
    search's names): a broken plug-in the job does not use must not stop those."""
    return KINDS.loadable()
