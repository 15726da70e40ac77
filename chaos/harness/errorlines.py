"""What a launch's log says its script died of, in the script's own words.

A script says why it stops in more ways than a traceback: argparse prints
`train.py: error: unrecognized arguments: ...` and exits 2, `raise
SystemExit("no data in /x")` prints the message alone, a launcher wrapper
prints a line and calls `sys.exit(1)`. torchrun then adds its own lines (the
`failed (exitcode ...)` line, a traceback of its own that ends in
ChildFailedError, a banner of `=`), which say that a rank failed, never why.

So the error lines of a log are its exception lines (`SomeError: ...`),
argparse's `error:` lines, and, for a rank that died with neither, the last
line it printed before torchrun reported the failure.
"""

from __future__ import annotations

import re

from torchchaos.log_lines import (
    COLLATERAL,
    ERROR_LINE,
    LAUNCHER_ECHO,
    TORCHRUN_RANK_TAG,
    USAGE_ERROR,
    WORKER_FAILED,
)

# lines that are the launcher's or the library's, never a script's last word
NOT_THE_SCRIPT = re.compile(r"^\[?[EWID]\d{4} |^=+$|^-+$|Warning|warnings\.warn|^\s*\^+\s*$"
                            r"|^\s*(File \"|Traceback \(most recent)|^usage: ")


def error_lines(lines: list[str], open_end: bool = False) -> list[str]:
    """The lines of a log (stripped) that say why a script stopped, in order. With
    `open_end`, the log is read while its ranks have just exited, before torchrun says
    so: its last line of the script's counts as a last word."""
    found: list[str] = []
    last_word = ""
    for raw in lines:
        line = TORCHRUN_RANK_TAG.sub("", raw.strip())
        if not line:
            continue
        if (failed := WORKER_FAILED.search(line)):  # what the rank printed before is its last word
            if int(failed.group(1)) > 0 and last_word and last_word not in found[-2:]:
                found.append(last_word)  # a signal's death has no last word
            last_word = ""
        elif ERROR_LINE.search(line) and not LAUNCHER_ECHO.search(line) or \
                USAGE_ERROR.search(line):
            found.append(line)
            last_word = ""
        elif not NOT_THE_SCRIPT.search(line):
            last_word = line
    if open_end and last_word and last_word not in found[-2:]:
        found.append(last_word)
    return found


def causes(lines: list[str]) -> list[str]:
    """The error lines that are not the echo of another rank's death (a peer's lost
    connection), or all of them where every one is."""
    errors = error_lines(lines)
    return [e for e in errors if not COLLATERAL.search(e)] or errors
