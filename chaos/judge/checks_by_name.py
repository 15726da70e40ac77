"""Checks by name, loaded on first use; the built-in ones run when none are named.

A check is a function `(Evidence) -> CheckResult` (`torchchaos.judge.checkers` holds
the built-in ones and says what each decides). Other packages add checks
through the `torchchaos.checks` entry-point group; those run when named
(`--check NAME`, a scenario's `checks:`), never by default, so installing a
plug-in does not change anyone's verdicts:

    [project.entry-points."torchchaos.checks"]
    loss_spikes = "mypackage.checks:loss_spikes"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torchchaos.entrypoints import Registry
from torchchaos.errors import UsageError

if TYPE_CHECKING:
    from torchchaos.judge.checkers import CheckResult
    from torchchaos.judge.evidence import Evidence

ENTRY_POINT_GROUP = "torchchaos.checks"

# In the order of the verdict table's columns (those of OPT_IN only when named).
BUILTIN: dict[str, str] = {
    "completes": "torchchaos.judge.checkers:completes",
    "atomic_recovery": "torchchaos.judge.checkers:atomic_recovery",
    "deterministic_resume": "torchchaos.judge.checkers:deterministic_resume",
    "bounded_lost_work": "torchchaos.judge.checkers:bounded_lost_work",
    "durable_checkpoints": "torchchaos.judge.checkers:durable_checkpoints",
    "sdc_detected": "torchchaos.judge.checkers:sdc_detected",
    "hang_detected": "torchchaos.judge.checkers:hang_detected",
    "no_split_brain": "torchchaos.judge.checkers:no_split_brain",
    "no_orphans": "torchchaos.judge.checkers:no_orphans",
    "clean_exit": "torchchaos.judge.checkers:clean_exit",
}
# Built in, run only when named: a hang at exit, after training ended, is said by
# `completes` without failing the recovery unless the user asks for this too.
OPT_IN = ("clean_exit",)

Check = Callable[["Evidence"], "CheckResult"]


def _callable(name: str, path: str, found: object) -> Check:
    if not callable(found):
        raise UsageError(f"check {name!r}: {path!r} is not callable")
    return found  # type: ignore[return-value]


CHECKS: Registry[Check] = Registry(ENTRY_POINT_GROUP, BUILTIN, "check", _callable)


def check_paths() -> dict[str, str]:
    """Every known check's name and dotted path; built-ins win over plug-ins."""
    return CHECKS.paths()


def default_checks() -> list[str]:
    return [name for name in BUILTIN if name not in OPT_IN]


def validate(names: list[str]) -> None:
    """Raise UsageError for a name no built-in check or installed plug-in has, or whose
    plug-in does not load: before any run starts, not after two."""
    for name in names:
        get_check(name)


def get_check(name: str) -> Check:
    return CHECKS.get(name)


def run_checks(ev: Evidence, names: list[str] | None = None) -> dict[str, CheckResult]:
    """Each named check's result (the built-in ones when `names` is empty), in order."""
    return {name: get_check(name)(ev) for name in (names or default_checks())}
