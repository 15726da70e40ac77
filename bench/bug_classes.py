"""Issue 59's table: the resume bugs users reported in 2026, each judged with
`torchchaos battery` and `torchchaos crashpoints` on a script written the way that
project's code is, beside its correct variant.

    python bench/bug_classes.py [--out DIR]

Prints, per (class, variant): each command's exit status (0 pass, 1 a check failed,
2 could not judge), the rows that failed, and the first failing check's words (the
cause a user reads). The scripts are the verdict matrix's (tests/matrix/targets/).
Takes about 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = Path(__file__).resolve().parent.parent / "tests" / "matrix" / "targets"
# class -> (script, its arguments, bug variant, the check that must fail); a stopped rank
# is no crash state of a recording (nothing on disk changes): its crash points run one
# chaos run each (--per-point --mode stop), a sample of 4
STOPS = ["--per-point", "--mode", "stop", "--cap", "4"]
CLASSES = {
    "async save, tracker never written": ("async_tracker", ["--save-dir", "ckpts"],
                                          "no_tracker", "bounded_lost_work"),
    "data loader one batch ahead": ("async_tracker", ["--save-dir", "ckpts"],
                                    "loader_ahead", "deterministic_resume"),
    "RNG one draw off after the restore": ("async_tracker", ["--save-dir", "ckpts"],
                                           "rng_one_draw", "deterministic_resume"),
    "universal resume resets optimizer and schedule": ("async_tracker",
                                                       ["--save-dir", "ckpts"],
                                                       "weights_only", "deterministic_resume"),
    "latest symlink swapped before the async flush": ("dcp_latest", ["--ckpt", "checkpoints"],
                                                      "early_latest", "atomic_recovery"),
    "save with barriers, no collective timeout": ("barrier_save",
                                                  ["--checkpoint-dir", "checkpoints"],
                                                  "no_timeout", "hang_detected"),
}


def run(command: list[str], script: str, args: list[str], variant: str, out: Path,
        cache: Path) -> tuple[int, list[dict], float]:
    """One command; its exit status, the reports of its runs and its wall seconds."""
    begun = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torchchaos.cli", *command, "--quiet",
                           "--out", str(out), "--cache-dir", str(cache),
                           str(TARGETS / f"{script}.py"), *args, "--variant", variant],
                          capture_output=True, text=True)
    reports = [json.loads(p.read_text()) for p in sorted(out.rglob("report.json"))]
    return done.returncode, reports, time.monotonic() - begun


def summary(code: int, reports: list[dict], check: str | None) -> str:
    failed = [r for r in reports if r["verdict"] != "pass"]
    if code == 2 or not reports:
        return "exit 2 (could not judge)"
    if not failed:
        return f"exit {code}: {len(reports)} of {len(reports)} pass"
    named = [r for r in failed if check and r["checks"].get(check, {}).get("ok") is False]
    first = (named or failed)[0]
    why = (first["checks"][check]["detail"] if named else first.get("reason") or
           next((c["detail"] for c in first["checks"].values() if c.get("ok") is False), ""))
    return f"exit {code}: {len(failed)} of {len(reports)} fail; {why[:160]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    ns = parser.parse_args()
    out = ns.out or Path(tempfile.mkdtemp(prefix="bug-classes-"))
    cache = out / "cache"
    done: set[tuple[str, str]] = set()
    for name, (script, args, bug, check) in CLASSES.items():
        for variant, expect in ((bug, check), ("correct", None)):
            if (script, variant) in done:
                continue
            done.add((script, variant))
            commands = [["battery"], ["crashpoints"]]
            if check == "hang_detected":
                commands.append(["crashpoints", *STOPS])
            for command in commands:
                where = out / f"{script}-{variant}-{'-'.join(command).strip('-')}"
                code, reports, seconds = run(command, script, args, variant, where, cache)
                label = name if variant == bug else f"({script}, correct)"
                print(f"{label} | {variant} | {' '.join(command)} |"
                      f" {summary(code, reports, expect)} | {seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
