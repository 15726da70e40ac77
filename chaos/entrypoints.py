"""Plug-ins by dotted path: what the fault-kind and check registries share.

A plug-in is named `module:attribute` (or `module.attribute`), either in a
registry's built-in table or by an installed package's entry point, and is
imported on first use only.
"""

from __future__ import annotations

import importlib
import warnings
from importlib.metadata import entry_points

from chaos.errors import UsageError


def installed(group: str) -> dict[str, str]:
    """Name -> dotted path of every entry point of `group` in the installed packages."""
    return {ep.name: ep.value for ep in entry_points(group=group)}


def merged(group: str, builtin: dict[str, str], what: str) -> dict[str, str]:
    """The built-in table plus the plug-ins of `group`; a plug-in that takes a built-in
    name is ignored, with a warning that says so (never silently)."""
    plugins = installed(group)
    for name in sorted(set(plugins) & set(builtin)):
        if plugins[name] != builtin[name]:
            warnings.warn(f"the plug-in {what} {name!r} ({plugins[name]}) is ignored: a"
                          f" built-in {what} has that name", stacklevel=3)
    return {**plugins, **builtin}


def load_object(path: str, what: str) -> object:
    """Import `module:attribute` (or `module.attribute`); a UsageError names `what`."""
    module, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise UsageError(f"{what}: cannot load {path!r} ({error})") from None
