"""Errors that decide the exit status.

Anything the user can fix (a malformed fault spec, a missing script, an output
directory that already holds data) is a `UsageError`; anything that keeps the
harness from judging the target (the target fails without faults, the
reference run times out) is a `CannotJudge`. Both end the CLI with exit 2 and a
one-line reason; neither is ever shown as a traceback.
"""


class ChaosError(Exception):
    """Base class: the harness could not produce a verdict."""


class UsageError(ChaosError):
    """Bad input from the user: fix the command line, the spec or the file."""


class Unavailable(UsageError):
    """This machine cannot have what the scenario asks for (a fault kind that needs a GPU):
    exit 2 on the command line, a skip with the reason in pytest."""


class CannotJudge(ChaosError):
    """The target or the environment keeps the harness from judging."""
