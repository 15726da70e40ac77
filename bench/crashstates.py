"""Crash states per minute on one job, side by side in one run:

- `torchchaos crashpoints` (one recording, crash states from it, one recovery per
  distinct view);
- `torchchaos crashpoints --per-point` (one whole chaos run per file event);
- ckpt-chaos 0.1.8, the nearest peer on the package registry (it reruns the job
  for every crash point), installed into a venv of its own by this script.

All three on the bundled target (2 ranks, gloo, 20 steps, a checkpoint every 5),
each with a cold torchchaos reference cache. Prints each tool's points (states)
per minute and the ratios.

    python bench/crashstates.py [--points N] [--work DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "targets" / "ddp_lm.py"
JOB = ["--steps", "20", "--ckpt-every", "5"]
PEER = "ckpt-chaos==0.1.8"


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    """Seconds and standard output of a command that exits 0 (all passed) or 1 (a
    verdict failed)."""
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1):
        sys.exit(f"{cmd[0]} failed ({done.returncode}):\n{done.stdout[-2000:]}"
                 f"\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def torchchaos(work: Path, extra: list[str]) -> tuple[int, float, str]:
    out = work / f"tc{len(list(work.glob('tc*')))}"
    seconds, text = timed([sys.executable, "-m", "torchchaos.cli", "crashpoints", "--out", str(out),
                           "--cache-dir", str(out) + "-cache", *extra, "--", str(TARGET),
                           *JOB], work)
    found = re.search(r"^.*?(\d+) of \d+ (?:crash states judged|points run).*$", text, re.M)
    if not found:
        sys.exit(f"no count in torchchaos's output:\n{text[-3000:]}")
    return int(found.group(1)), seconds, found.group(0)


def peer(work: Path, points: int) -> tuple[int, float, str]:
    """ckpt-chaos runs each rank itself (`--ranks 2`: RANK, WORLD_SIZE, MASTER_* set):
    under torchrun it arms only in the launcher and sees no worker's files."""
    env_dir = work / "peer-venv"
    if not env_dir.exists():
        venv.create(env_dir, with_pip=True, system_site_packages=True)  # torch from here
        subprocess.run([env_dir / "bin" / "pip", "install", "-q", PEER], check=True)
    seconds, text = timed([str(env_dir / "bin" / "ckpt-chaos"), "run", "--ranks", "2",
                           "--step-regex", r"resumed from \S+ at step (\d+)", "--max-points",
                           str(points), "--work", str(work / "peer-runs"), "--",
                           str(env_dir / "bin" / "python"), str(TARGET), *JOB, "--ckpt-dir",
                           "{out}"], work)
    rows = re.findall(r"^(?:#\d+ |no crash \(control\))", text, re.M)
    summary = re.search(r"^\s*\d+ file events -> .*$", text, re.M)
    return len(rows), seconds, summary.group(0).strip() if summary else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=12,
                        help="points for --per-point and ckpt-chaos (their rate per point"
                             " does not depend on how many; default 12)")
    parser.add_argument("--work", type=Path, default=None)
    ns = parser.parse_args()
    work = ns.work or Path(tempfile.mkdtemp(prefix="torchchaos-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.glob("tc*")):
        sys.exit(f"{work} holds an earlier run: give a new --work")
    results = {}
    results["torchchaos crashpoints"] = torchchaos(work, [])
    results["torchchaos crashpoints --per-point"] = torchchaos(
        work, ["--per-point", "--cap", str(ns.points)])
    results["ckpt-chaos 0.1.8"] = peer(work, ns.points)
    rates = {}
    for name, (n, seconds, last) in results.items():
        rates[name] = n / seconds * 60
        print(f"{name}: {n} states/points in {seconds:.1f} s: {rates[name]:.1f} per minute"
              f"  ({last})")
    ours = rates["torchchaos crashpoints"]
    print(f"ratio to ckpt-chaos: {ours / rates['ckpt-chaos 0.1.8']:.1f}x;"
          f" to --per-point: {ours / rates['torchchaos crashpoints --per-point']:.1f}x")
    print(f"work: {work}")


if __name__ == "__main__":
    main()
