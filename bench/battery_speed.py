"""Where a battery's time goes, warm and cold, against one plain run of the same job.

    python bench/battery_speed.py [--targets bundled,slow_build] [--jobs N]

For each target, side by side in one run on this machine:

1. one plain `torchrun --standalone --nproc-per-node 2` of the job, as its user runs
   it today, timed from outside;
2. the fault-free reference, made once per start mode and not timed (the battery
   reuses it by content, as it does in CI after the first run);
3. `torchchaos battery` with exec'd ranks (`TORCHCHAOS_COLD_START=1`, "cold"), with warm
   ranks each launcher an interpreter of its own (`TORCHCHAOS_SPARE_LAUNCHER=0`,
   "warm"), and with warm ranks whose launchers are forked from the harness's launcher
   server (the default, "spare"), timed from outside, as the ratio to the plain run;
4. the battery's rows split by their own histories: start-up (a launch or a restart
   until its ranks' agents boot: interpreter, imports), init (boot to the first step:
   the script's own set-up, the process group, loading a checkpoint), training (first
   to last step of each attempt), the end (last step until the launcher is gone), and
   the rest of each row's wall time (the harness: set-up, mounts, judging).

`slow_build` is `bench/targets/slow_build.py`, an independent DDP script whose model
takes seconds to build.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchchaos.rundir.history import History

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TARGETS = {
    "bundled": (REPO / "targets" / "ddp_lm.py", ["--steps", "20", "--ckpt-every", "5"]),
    "slow_build": (HERE / "targets" / "slow_build.py", ["--steps", "20", "--save-every", "5"]),
}
PARTS = ("start-up", "init", "training", "end", "harness")


def plain_run(script: Path, args: list[str], scratch: Path) -> float:
    folder = scratch / "plain"
    folder.mkdir()
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script), *args], cwd=folder,
                          capture_output=True, text=True, env={**os.environ, "TMPDIR": str(folder)})
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"the plain run of {script.name} failed: {done.stderr[-800:]}")
    return seconds


MODES = {"cold": {"TORCHCHAOS_COLD_START": "1"}, "warm": {"TORCHCHAOS_SPARE_LAUNCHER": "0"},
         "spare": {}}


def torchchaos(command: list[str], cache: Path, out: Path, mode: str) -> float:
    environ = {k: v for k, v in os.environ.items() if k not in MODES["cold"]
               and k not in MODES["warm"]}
    environ.update(MODES[mode])
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torchchaos.cli", command[0], "--cache-dir",
                           str(cache), "--out", str(out), "--quiet", *command[1:]],
                          capture_output=True, text=True, env=environ)
    seconds = time.monotonic() - start
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} could not judge: {done.stderr.strip()[-800:]}")
    return seconds


def split(run_dir: Path, wall: float) -> dict[str, float]:
    """One row's wall time in PARTS, from its histories."""
    evs = History.of_run(run_dir).events
    parts = dict.fromkeys(PARTS, 0.0)
    attempts: dict[tuple[int, int], list[dict]] = {}
    for e in evs:
        if e["ev"] in ("boot", "step", "rank_exit") and "launch" in e:
            attempts.setdefault((e["launch"], e.get("attempt", 0)), []).append(e)
    launches = {e["launch"]: e["t"] for e in evs if e["ev"] == "launch"}
    exits = [e["t"] for e in evs if e["ev"] == "job_exit"]
    began = None  # when the attempt before ended: a restart starts there
    for (launch, attempt), mine in sorted(attempts.items()):
        boots = [e["t"] for e in mine if e["ev"] == "boot"]
        steps = [e["t"] for e in mine if e["ev"] == "step"]
        ended = [e["t"] for e in mine if e["ev"] == "rank_exit"]
        if not boots:
            continue
        start = launches[launch] if attempt == 0 and launch in launches else began
        parts["start-up"] += max(min(boots) - (start or min(boots)), 0.0)
        if steps:
            parts["init"] += steps[0] - min(boots)
            parts["training"] += steps[-1] - steps[0]
        began = max(ended) if ended else (steps[-1] if steps else max(boots))
    if began is not None and exits:
        parts["end"] += max(max(exits) - began, 0.0)
    parts["harness"] = max(wall - sum(parts.values()), 0.0)
    return parts


def rows(out: Path) -> list[tuple[Path, float]]:
    found = []
    for report in sorted(out.rglob("report.json")):
        data = json.loads(report.read_text())
        if "wall_seconds" in data and (report.parent / "chaos").is_dir():
            found.append((report.parent / "chaos", float(data["wall_seconds"])))
    return found


def bench(name: str, jobs: int, scratch: Path) -> None:
    script, args = TARGETS[name]
    plain = plain_run(script, args, scratch)
    results = {}
    for mode in MODES:
        cache = scratch / f"cache-{mode}"
        torchchaos(["run", "--", str(script), *args], cache, scratch / f"ref-{mode}", mode)
        out = scratch / f"battery-{mode}"
        seconds = torchchaos(["battery", "--jobs", str(jobs), "--", str(script), *args],
                             cache, out, mode)
        totals = dict.fromkeys(PARTS, 0.0)
        found = rows(out)
        for run_dir, wall in found:
            for part, value in split(run_dir, wall).items():
                totals[part] += value
        results[mode] = (seconds, len(found), totals)
    print(f"{name}: one plain torchrun {plain:.1f} s")
    for mode, (seconds, count, totals) in results.items():
        shares = ", ".join(f"{part} {value:.1f}" for part, value in totals.items())
        print(f"  battery {mode:5}: {seconds:6.1f} s = {seconds / plain:4.1f}x the plain run;"
              f" {count} rows, their wall time in s: {shares}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="bundled,slow_build")
    parser.add_argument("--jobs", type=int, default=1, help="chaos runs at a time")
    ns = parser.parse_args()
    for name in ns.targets.split(","):
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as scratch:
            bench(name, ns.jobs, Path(scratch))


if __name__ == "__main__":
    main()
