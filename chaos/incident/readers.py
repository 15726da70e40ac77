"""Artefact readers by name: the contract, the built-ins and `torchchaos.readers` plug-ins.

A reader is small and pure: a file's bytes in, `Observation`s out. `sniff` says
from the content (never the name alone) whether the file is its format;
`read` turns it into observations, or raises `BadArtefact` with one line when
the file is its format but broken (a cut-off JSON error file). A site adds its
own log format as a package with an entry point of the same shape:

    [project.entry-points."torchchaos.readers"]
    mylogs = "mypackage.logs:MyLogReader"
"""

from __future__ import annotations

from torchchaos.entrypoints import Registry
from torchchaos.incident.observations import Observation

ENTRY_POINT_GROUP = "torchchaos.readers"


class BadArtefact(Exception):
    """A file of a known format that cannot be read: the one-line reason."""


class Reader:
    """One artefact format. `structured` readers own a whole file (a JSON document, a
    dump); the others read lines of a log, and several may read the same log."""

    name: str = ""
    summary: str = ""
    structured: bool = False

    def sniff(self, data: bytes, name: str) -> bool:
        raise NotImplementedError

    def read(self, data: bytes, name: str) -> list[Observation]:
        raise NotImplementedError


BUILTIN: dict[str, str] = {
    "torchrun": "torchchaos.incident.formats.torchrun:TorchrunLog",
    "collectives": "torchchaos.incident.formats.collectives:CollectiveErrors",
    "stacks": "torchchaos.incident.formats.stack_dumps:Stacks",
    "kernel": "torchchaos.incident.formats.kernel:KernelLog",
    "trainlog": "torchchaos.incident.formats.trainlog:TrainingLog",
    "errorfile": "torchchaos.incident.formats.errorfile:ErrorFile",
    "kubernetes": "torchchaos.incident.formats.kubernetes:KubernetesStatus",
    "slurm": "torchchaos.incident.formats.slurm:Sacct",
    "slurmout": "torchchaos.incident.formats.slurm:SlurmOutput",
    "scontrol": "torchchaos.incident.formats.slurm:ScontrolJob",
    "slurmctld": "torchchaos.incident.formats.slurm:SlurmctldLog",
    "batchscript": "torchchaos.incident.formats.batch_script:BatchScript",
    "flight": "torchchaos.incident.formats.flight:FlightRecorder",
    "torchchaos": "torchchaos.incident.formats.ours:OwnReport",
}


READERS: Registry[Reader] = Registry(ENTRY_POINT_GROUP, BUILTIN, "artefact reader", Reader)


def all_readers() -> list[Reader]:
    """Every reader that loads, structured ones first (they claim a file whole)."""
    found = list(READERS.loadable().values())
    return sorted(found, key=lambda r: (not r.structured, r.name))
