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
