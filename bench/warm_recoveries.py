"""Warm recoveries side by side: a crash-state sweep with recoveries held at their gate
against the same sweep from a baseline revision whose every recovery starts cold.

For each size (`--state-mb` of the bundled target, 2 ranks), the reference and the
recording of save 2 are made once (in one cache both revisions read), then the
sweep alone runs `--repeats` times for each revision, alternating, each from the
cached recording: the wall seconds of the sweep (the command, start to end), its
recoveries, and its own "s per recovery" (from the gate's opening to the job's end
where recoveries are held, from the start of the job otherwise).

The baseline is checked out into a git worktree and installed, with no
dependencies, into a venv that sees this interpreter's packages; its commands run
with that venv's python.

    python bench/warm_recoveries.py [--sizes 1,1024] [--repeats 3] [--baseline 71fb00a]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "targets" / "ddp_lm.py"
JOB = ["--steps", "20", "--ckpt-every", "5", "--watchdog", "120"]


def baseline_python(work: Path, revision: str) -> str:
    tree, env_dir = work / "baseline", work / "baseline-venv"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), revision], cwd=REPO,
                   check=True)
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    subprocess.run([env_dir / "bin" / "pip", "install", "-q", "--no-deps", "-e", str(tree)],
                   check=True)
    return str(env_dir / "bin" / "python")


def sweep(python: str, out: Path, cache: Path, mb: float) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run([python, "-m", "torchchaos.cli", "crashpoints", "--save", "2",
                           "--out", str(out), "--cache-dir", str(cache), "--", str(TARGET),
                           *JOB, "--state-mb", f"{mb:g}"], capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1):
        sys.exit(f"crashpoints failed ({done.returncode}):\n{done.stdout[-2000:]}"
                 f"{done.stderr[-2000:]}")
    line = re.search(r"^save 2: .*$", done.stdout, re.M)
    return seconds, line.group(0) if line else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,1024", help="MB of state per rank, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default="71fb00a", help="a revision with cold recoveries")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="warm-", dir=os.path.expanduser("~")))
    work.mkdir(parents=True, exist_ok=True)
    old = baseline_python(work, args.baseline)
    try:
        for mb in (float(s) for s in args.sizes.split(",")):
            cache = work / f"cache-{mb:g}"
            sweep(sys.executable, work / f"first-{mb:g}", cache, mb)  # reference, recording
            times: dict[str, list[float]] = {"baseline": [], "warm": []}
            lines: dict[str, str] = {}
            for n in range(args.repeats):
                for name, python in (("baseline", old), ("warm", sys.executable)):
                    seconds, line = sweep(python, work / f"{name}-{mb:g}-{n}", cache, mb)
                    times[name].append(seconds)
                    lines[name] = line
            cold, warm = statistics.median(times["baseline"]), statistics.median(times["warm"])
            print(f"{mb:g} MB per rank: sweep from the cached recording, median of"
                  f" {args.repeats}: baseline {cold:.1f} s, warm {warm:.1f} s,"
                  f" warm/baseline {warm / cold:.2f}x")
            for name in times:
                print(f"  {name}: {', '.join(f'{s:.1f}' for s in times[name])} s;"
                      f" last: {lines[name]}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(work / "baseline")],
                       cwd=REPO, check=False)


if __name__ == "__main__":
    main()
