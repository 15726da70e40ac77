"""How long work says where it is: a callable that takes one line.

The command line prints each line with the time since it started; pytest's
plugin and the library's callers pass their own, or nothing. Every layer that
runs something long (a reference run, a sweep, a report's pictures) takes one.
"""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None]
