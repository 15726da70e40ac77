"""The JSON schemas exported manifests are checked against before they are written
(`schemas/*.json`: Chaos Mesh's CRDs, the JobSet API), and how a break is said."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def load(name: str) -> dict[str, Any]:
    """schemas/NAME.json."""
    return json.loads(resources.files("torchchaos.scenario").joinpath(f"schemas/{name}.json")
                      .read_text())


def errors(name: str, manifest: Any) -> list[str]:
    """Every way `manifest` breaks schemas/NAME.json, as 'path: message', in path order;
    [] if none."""
    import jsonschema  # only exports need it

    validator = jsonschema.Draft202012Validator(load(name))
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(manifest), key=lambda e: list(e.path))]
