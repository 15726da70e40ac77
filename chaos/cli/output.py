"""What every command prints: progress lines on stderr, a finished run's verdict table."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def progress_printer(quiet: bool) -> Callable[[str], None]:
    """Where long work says how far it got: each message on stderr with the seconds
    since the printer was made; nothing with --quiet."""
    start = time.monotonic()

    def say(message: str) -> None:
        if not quiet:
            print(f"[torchchaos {time.monotonic() - start:6.1f}s] {message}", file=sys.stderr,
                  flush=True)

    return say


def print_report(report: Any, out: Path, expectation: str = "") -> int:
    """The verdict table, the page to open, and the exit status of a finished run."""
    print(report.table())
    if (out / "report.html").is_file():
        print(f"report: {out / 'report.html'}")
    if expectation:
        print(expectation)
    if report.verdict == "error":
        print(f"torchchaos: error: {report.reason}", file=sys.stderr)
    return report.exit_code()


def print_down(what: str, root: Path, failures: list[str]) -> int:
    """What `cluster down` or `docker down` could not remove, then the outcome: exit 0
    when all is gone, 1 when something is left."""
    for failure in failures:
        print(f"could not remove {failure}")
    print(f"{what} down: {root} removed" if not failures else f"{what} down, with leftovers")
    return 1 if failures else 0
