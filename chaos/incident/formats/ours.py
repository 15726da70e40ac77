"""This project's own record of a run: its `report.json` or `replay.yaml`.

The faults are known exactly there: an incident imported from a torchchaos run
keeps them as they were run (each spec, fired or not, and the verdict).
"""

from __future__ import annotations

from typing import Any

import yaml

from torchchaos.incident.formats.errorfile import load_json
from torchchaos.incident.observations import Observation, Source
from torchchaos.incident.readers import BadArtefact, Reader


class OwnReport(Reader):
    name = "torchchaos"
    summary = "a torchchaos run's report.json or replay.yaml"
    structured = True

    def sniff(self, data: bytes, name: str) -> bool:
        head = data[:4096]
        return head.lstrip().startswith(b"{") and b'"verdict"' in head and b'"checks"' in head \
            or head.startswith(b"torchchaos: 1") or b"\ntorchchaos: 1\n" in head

    def read(self, data: bytes, name: str) -> list[Observation]:
        if data.lstrip().startswith(b"{"):
            doc = load_json(data)
            faults = doc.get("faults") if isinstance(doc, dict) else None
            specs = [(f"faults[{i}].spec", f.get("spec"), f.get("fired_step"))
                     for i, f in enumerate(faults or []) if isinstance(f, dict)]
        else:
            try:
                doc = yaml.safe_load(data.decode("utf-8"))
            except (UnicodeDecodeError, yaml.YAMLError) as exc:
                raise BadArtefact(f"a replay file that is not YAML: {type(exc).__name__}") \
                    from None
            faults = doc.get("faults") if isinstance(doc, dict) else None
            specs = [(f"faults[{i}]", _spec(f), None) for i, f in enumerate(faults or [])]
        if not isinstance(faults, list):
            raise BadArtefact("a torchchaos file without a list of faults")
        return [Observation("injected", Source(name, key=key), detail=str(spec), step=step)
                for key, spec, step in specs if isinstance(spec, str)]


def _spec(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("fault"), str):
        return item["fault"]
    return None
