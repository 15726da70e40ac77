"""Plug-ins by dotted path: the mechanism the fault-kind and check registries share.

A plug-in is named `module:attribute` (or `module.attribute`), either in a
registry's built-in table or by an installed package's entry point, and is
imported on first use only.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from torchchaos.errors import UsageError, did_you_mean


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


T = TypeVar("T")



class Registry(Generic[T]):
    """Names to dotted paths (a built-in table plus the plug-ins of an entry-point group),
    each object imported the first time its name is asked for and kept. `accept` turns
    what was imported into the registry's object, or raises UsageError; a class as
    `accept` takes a subclass of it whose `name` is the name it is registered under,
    and instantiates it."""

    def __init__(self, group: str, builtin: dict[str, str], what: str,
                 accept: Callable[[str, str, object], T] | type[T]) -> None:
        self.group, self.builtin, self.what = group, builtin, what
        self.accept: Callable[[str, str, object], T] = (
            self._named_instance(accept) if isinstance(accept, type) else accept)
        self._loaded: dict[str, T] = {}

    def _named_instance(self, base: type[T]) -> Callable[[str, str, object], T]:
        def accept(name: str, path: str, found: object) -> T:
            if not (isinstance(found, type) and issubclass(found, base)) \
                    or getattr(found, "name", None) != name:
                raise UsageError(f"{self.what} {name!r}: {path!r} is not a {base.__name__}"
                                 f" named {name!r}")
            return found()

        return accept

    def paths(self) -> dict[str, str]:
        """Every known name and its dotted path; built-ins win over plug-ins."""
        return merged(self.group, self.builtin, self.what)

    def get(self, name: str) -> T:
        if name not in self._loaded:
            paths = self.paths()
            if name not in paths:
                raise UsageError(f"unknown {self.what} {name!r}{did_you_mean(name, paths)}"
                                 f" (known: {', '.join(sorted(paths))})")
            found = load_object(paths[name], f"{self.what} {name!r}")
            self._loaded[name] = self.accept(name, paths[name], found)
        return self._loaded[name]

    def loadable(self) -> dict[str, T]:
        """Every object that loads: a broken plug-in nobody named is skipped."""
        found = {}
        for name in sorted(self.paths()):
            try:
                found[name] = self.get(name)
            except UsageError:
                continue
        return found
