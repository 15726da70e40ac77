"""Plug-ins by dotted path: what the fault-kind and check registries share.

A plug-in is named `module:attribute` (or `module.attribute`), either in a
registry's built-in table or by an installed package's entry point, and is
imported on first use only.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from chaos.errors import UsageError


def installed(group: str) -> dict[str, str]:
    """Name -> dotted path of every entry point of `group` in the installed packages."""
    return {ep.name: ep.value for ep in entry_points(group=group)}


def load_object(path: str, what: str) -> object:
    """Import `module:attribute` (or `module.attribute`); a UsageError names `what`."""
    module, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise UsageError(f"{what}: cannot load {path!r} ({error})") from None
