"""A rank holding the GIL, again and again: detected, its holder named, nothing left.

Runs `hang:mode=gil` on the bundled target with torch's default timeouts (nothing in
the job reacts) N times (default 10) and, for each run, reports how long the
harness took to declare the hang against its bound, whether the verdict names
the frame that holds the GIL, whether `no_orphans` passed (every process of the run
reaped) and whether `torchchaos clean` finds anything afterwards.

    python bench/gil_hang.py [--runs 10] [--hang-timeout 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchchaos.engine import run_scenario
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario

TARGET = Path(__file__).resolve().parent.parent / "targets" / "ddp_lm.py"
ARGS = ["--steps", "12", "--ckpt-every", "4", "--default-timeouts"]
FAULT = "hang:rank=1,step=6,mode=gil"
HOLDER = "the GIL held in _hold_gil (hang.py:"


def one(folder: Path, cache: Path, bound: float) -> dict[str, object]:
    scenario = Scenario.build(str(TARGET), faults=[FAULT], args=ARGS, hang_timeout=bound)
    start = time.monotonic()
    report = run_scenario(scenario, folder, cache)
    wall = time.monotonic() - start
    history = History.of_run(Path(report.run_dir))
    began = history.of("hang_begin")[0]["t"]
    hang = history.of("hang")
    detected = hang[0]["t"] - began if hang else None
    check = report.checks["hang_detected"]
    clean = subprocess.run([sys.executable, "-m", "torchchaos.cli", "clean"],
                           capture_output=True, text=True)
    return {"detected_s": detected,
            "named": HOLDER in check.get("detail", ""),
            "orphans_ok": report.checks["no_orphans"]["ok"] is True,
            "clean": clean.returncode == 0 and "nothing left behind" in clean.stdout,
            "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hang-timeout", type=float, default=5.0)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gil-hang-"))
    print("run  detected (s)  holder named  no_orphans  clean  wall (s)")
    results = []
    for n in range(args.runs):
        r = one(base / f"run-{n}", base / "cache", args.hang_timeout)
        results.append(r)
        print(f"{n:>3}  {r['detected_s']:>12.2f}  {r['named']!s:>12}"
              f"  {r['orphans_ok']!s:>10}  {r['clean']!s:>5}  {r['wall_s']:>8.1f}", flush=True)
    within = sum(1 for r in results if r["detected_s"] is not None
                 and r["detected_s"] < args.hang_timeout + 2)
    print(f"detected within the bound ({args.hang_timeout:g} s, +2 s for the stacks):"
          f" {within}/{len(results)}; holder named: {sum(r['named'] for r in results)}"
          f"/{len(results)}; nothing left: {sum(r['clean'] for r in results)}/{len(results)}")
    print(f"runs kept in {base}")


if __name__ == "__main__":
    main()
