"""Wall time of the default CPU battery and the crash-point rate, as a user runs them.

Runs the real commands (`torchchaos battery`, `torchchaos crashpoints`) on the
bundled target and times them from outside:

1. the battery with a cold reference cache (the fault-free run is made first)
   and again with the cache warm (the reference is reused by content: script
   bytes, arguments, job shape, torch and torchchaos versions);
2. crash-point enumeration of save 2 (kill / lose_unsynced / torn at every
   file event), as points per minute.

    python bench/battery.py [--jobs N] [--cap N]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(command: list[str], cache: Path, out: Path) -> tuple[float, str]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torchchaos.cli", *command, "--cache-dir",
                           str(cache), "--out", str(out), "--quiet"],
                          capture_output=True, text=True)
    seconds = time.monotonic() - start
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} could not judge: {done.stderr.strip()[-500:]}")
    return seconds, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="chaos runs at a time")
    parser.add_argument("--cap", type=int, default=0, help="crash points to sample (0: all)")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "cache"
        jobs = ["--jobs", str(ns.jobs)]
        cold, table = timed(["battery", *jobs], cache, Path(scratch) / "cold")
        runs = len([line for line in table.splitlines() if line.endswith(("PASS", "FAIL"))])
        warm, _ = timed(["battery", *jobs], cache, Path(scratch) / "warm")
        print(f"battery ({runs} runs, --jobs {ns.jobs}): {cold:.1f} s with a cold reference"
              f" cache, {warm:.1f} s warm ({cold - warm:.1f} s is the reference run)")
        cap = ["--cap", str(ns.cap)] if ns.cap else []
        seconds, text = timed(["crashpoints", *jobs, *cap], cache, Path(scratch) / "points")
        rate = re.search(r"(\d+) of (\d+) points run.*?([\d.]+) points per minute", text)
        if rate:
            print(f"crash points: {rate[1]} of {rate[2]} in save 2, {seconds:.1f} s in all,"
                  f" {rate[3]} points per minute (timed over the points)")


if __name__ == "__main__":
    main()
