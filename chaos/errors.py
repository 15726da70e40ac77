"""Errors that decide the exit status.

Anything the user can fix (a malformed fault spec, a missing script, an output
directory that already holds data) is a `UsageError`; anything that keeps the
harness from judging the target (the target fails without faults, the
reference run times out) is a `CannotJudge`. Both end the CLI with exit 2 and a
one-line reason; neither is ever shown as a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class ChaosError(Exception):
    """Base class: the harness could not produce a verdict."""


class UsageError(ChaosError):
    """Bad input from the user: fix the command line, the spec or the file."""


class Unavailable(UsageError):
    """This machine cannot have what the scenario asks for (a fault kind that needs a GPU):
    exit 2 on the command line, a skip with the reason in pytest."""


class CannotJudge(ChaosError):
    """The target or the environment keeps the harness from judging."""


def did_you_mean(word: str, choices: Iterable[object]) -> str:
    """The hint ` (did you mean 'rank'?)` where one of `choices` is close to `word` (a
    typo), else ""."""
    import difflib

    names = [str(c) for c in choices]
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
