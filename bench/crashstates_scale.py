"""Crash states at the checkpoint sizes people train with, side by side in one run.

The bundled target (2 ranks, gloo, 20 steps, a checkpoint every 5) with
`--state-mb MB`: every rank saves MB megabytes of its own state into its own
file at every save. `--target adamw` runs `bench/targets/adamw_trainer.py`
instead, a trainer written apart from the harness the way a user writes one (an
MLP, AdamW, a file per rank per save, a `latest` pointer) with the same job
(`--steps 20 --save-every 5 --size-mb MB`). For each size, each from a cold cache:

- `torchchaos crashpoints --save 2` (one recording, crash states from it, one
  recovery per distinct view): wall time to full coverage of save 2 (every
  state at the chosen cuts judged), the state counts of its summary, peak RSS of
  the harness and of the FUSE daemons (sampled every 0.1 s), disk under --out
  and the cache;
- `torchchaos crashpoints --per-point --cap N` (one whole chaos run per file
  event): seconds per point;
- ckpt-chaos 0.1.8 (the peer on the package registry; it reruns the job for
  every crash point), `--max-points N`: seconds per point (`--peer` to include);
- plain torchrun, no harness: the job trained to step 10 (two saves), then a
  resume from step 10 that trains 3 steps and ends, as a crash-state recovery
  does (it stops 3 steps after its resume): the seconds a recovery is held to.

    python bench/crashstates_scale.py [--target {bundled,adamw}] [--sizes 1,30,300,1024]
        [--points 3] [--peer]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
PEER = "ckpt-chaos==0.1.8"


class Target:
    """A training script and the flags of the same job: 20 steps, a save every 5."""

    def __init__(self, name: str, script: Path, every: list[str], size: str, resumed: str,
                 prefix: str) -> None:
        self.name, self.script, self.size, self.resumed = name, script, size, resumed
        self.every = every  # the job's flags but --steps (a plain resume sets its own)
        self.prefix = prefix  # of the folders under --work, so that targets can share one

    def job(self, mb: float) -> list[str]:
        return [str(self.script), "--steps", "20", *self.every, *self.sizing(mb)]

    def sizing(self, mb: float) -> list[str]:
        return [self.size, f"{mb:g}"]


TARGETS = {
    # the target's step watchdog (8 s) is sized for its own small saves: a 1 GB save through
    # the recording filesystem takes about that long on 2 cores
    "bundled": Target("bundled", REPO / "targets" / "ddp_lm.py",
                      ["--ckpt-every", "5", "--watchdog", "120"], "--state-mb",
                      r"resumed from \S+ at step (\d+)", ""),
    # no watchdog of its own; rank 0 prints `resumed from step N`
    "adamw": Target("adamw", REPO / "bench" / "targets" / "adamw_trainer.py",
                    ["--save-every", "5"], "--size-mb", r"resumed from step (\d+)", "adamw-"),
}
MIB = 1 << 20


def rss_of(pid: int) -> int:
    """Resident bytes of a process now (0 once it is gone)."""
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


def fuse_daemons() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"torchchaos.faults.faultfs" in cmd:
                found.append(int(entry))
    return found


def watched(cmd: list[str], cwd: Path) -> tuple[float, str, int, int]:
    """Run `cmd` (exit 0 or 1: a verdict); seconds, output, peak RSS of it and of the
    largest FUSE daemon, sampled. Temporary files go under `cwd` (the peer's torchrun
    leaves its torchelastic_* folders behind)."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "TMPDIR": str(cwd)})
        peak = daemon = 0
        while proc.poll() is None:
            peak = max(peak, rss_of(proc.pid))
            daemon = max([daemon, *(rss_of(p) for p in fuse_daemons())])
            time.sleep(0.1)
        seconds = time.monotonic() - started
        out.seek(0)
        text = out.read()
    if proc.returncode not in (0, 1):
        sys.exit(f"{cmd[:4]} failed ({proc.returncode}):\n{text[-3000:]}")
    return seconds, text, peak, daemon


def disk(*paths: Path) -> int:
    """Bytes on disk under the paths together (a hard link counted once)."""
    done = subprocess.run(["du", "-sck", *map(str, paths)], capture_output=True, text=True)
    return int(done.stdout.strip().splitlines()[-1].split()[0]) * 1024


def states(work: Path, target: Target, mb: float) -> dict:
    out = work / f"{target.prefix}states-{mb:g}"
    cache = work / f"{target.prefix}states-{mb:g}-cache"
    seconds, text, peak, daemon = watched(
        [sys.executable, "-m", "torchchaos.cli", "crashpoints", "--save", "2", "--out", str(out),
         "--cache-dir", str(cache), "--", *target.job(mb)], work)
    line = re.search(r"^save 2: .*$", text, re.M)
    if not line:
        sys.exit(f"no summary in torchchaos's output:\n{text[-3000:]}")
    return {"seconds": seconds, "summary": line.group(0), "harness_rss": peak,
            "daemon_rss": daemon, "out": disk(out), "cache": disk(cache),
            "together": disk(out, cache)}


def per_point(work: Path, target: Target, mb: float, points: int) -> dict:
    out = work / f"{target.prefix}points-{mb:g}"
    seconds, text, peak, _ = watched(
        [sys.executable, "-m", "torchchaos.cli", "crashpoints", "--per-point", "--cap", str(points),
         "--save", "2", "--out", str(out), "--cache-dir", str(out) + "-cache", "--",
         *target.job(mb)], work)
    line = re.search(r"^\d+ of \d+ points run.*$", text, re.M)
    return {"seconds": seconds, "summary": line.group(0) if line else text[-500:],
            "harness_rss": peak}


def plain_resume(work: Path, target: Target, mb: float) -> float:
    """Seconds of a plain torchrun resume of the same job: from the checkpoint of step 10,
    3 steps, then exit (a crash-state recovery stops 3 steps after its resume)."""
    run_dir = work / f"{target.prefix}plain-{mb:g}"
    run_dir.mkdir()
    base = ["torchrun", "--standalone", "--nproc-per-node", "2", str(target.script),
            *target.every, *target.sizing(mb)]
    environ = {**os.environ, "TMPDIR": str(run_dir), "OMP_NUM_THREADS": "1"}
    subprocess.run([*base, "--steps", "10"], cwd=run_dir, env=environ, check=True,
                   capture_output=True, timeout=900)  # a hang at exit must not stall the bench
    started = time.monotonic()
    subprocess.run([*base, "--steps", "13"], cwd=run_dir, env=environ, check=True,
                   capture_output=True, timeout=900)
    return time.monotonic() - started


def per_recovery(summary: str) -> float | None:
    found = re.search(r"([\d.]+) s per recovery", summary)
    return float(found.group(1)) if found else None


def peer(work: Path, target: Target, mb: float, points: int) -> dict:
    env_dir = work / "peer-venv"
    if not env_dir.exists():
        venv.create(env_dir, with_pip=True, system_site_packages=True)  # torch from here
        subprocess.run([env_dir / "bin" / "pip", "install", "-q", PEER], check=True)
    seconds, text, peak, _ = watched(
        [str(env_dir / "bin" / "ckpt-chaos"), "run", "--ranks", "2", "--step-regex",
         target.resumed, "--max-points", str(points), "--work",
         str(work / f"{target.prefix}peer-{mb:g}"), "--", str(env_dir / "bin" / "python"),
         *target.job(mb), "--ckpt-dir", "{out}"], work)
    rows = re.findall(r"^(?:#\d+ |no crash \(control\))", text, re.M)
    return {"seconds": seconds, "summary": f"{len(rows)} points", "harness_rss": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=sorted(TARGETS), default="bundled",
                        help="bundled: targets/ddp_lm.py --state-mb MB (default); adamw:"
                             " bench/targets/adamw_trainer.py --size-mb MB")
    parser.add_argument("--sizes", default="1,30,300,1024",
                        help="MB of state per rank, comma-separated (default 1,30,300,1024)")
    parser.add_argument("--points", type=int, default=3,
                        help="points for --per-point and ckpt-chaos (default 3)")
    parser.add_argument("--peer", action="store_true", help="also run ckpt-chaos 0.1.8")
    parser.add_argument("--no-per-point", action="store_true")
    parser.add_argument("--work", type=Path, default=None)
    ns = parser.parse_args()
    work = ns.work or Path(tempfile.mkdtemp(prefix="torchchaos-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    target = TARGETS[ns.target]
    print(f"target: {target.name} ({target.script.relative_to(REPO)}"
          f" {' '.join(target.job(0)[1:-1])} MB)", flush=True)
    for mb in (float(s) for s in ns.sizes.split(",")):
        found = states(work, target, mb)
        print(f"{target.name}, {mb:g} MB per rank: crash states to full coverage of save 2 in"
              f" {found['seconds']:.1f} s; harness peak RSS {found['harness_rss'] / MIB:.0f}"
              f" MiB, FUSE daemon {found['daemon_rss'] / MIB:.0f} MiB; disk --out"
              f" {found['out'] / MIB:.0f} MiB, cache {found['cache'] / MIB:.0f} MiB, both"
              f" {found['together'] / MIB:.0f} MiB\n  {found['summary']}", flush=True)
        plain, ours = plain_resume(work, target, mb), per_recovery(found["summary"])
        ratio = f" (a recovery: {ours / plain:.2f}x that)" if ours else ""
        print(f"  plain torchrun resume from step 10, 3 steps: {plain:.1f} s{ratio}",
              flush=True)
        if not ns.no_per_point:
            points = per_point(work, target, mb, ns.points)
            print(f"  --per-point: {points['seconds']:.1f} s ({points['summary']});"
                  f" harness peak RSS {points['harness_rss'] / MIB:.0f} MiB", flush=True)
        if ns.peer:
            theirs = peer(work, target, mb, ns.points)
            print(f"  {PEER}: {theirs['seconds']:.1f} s ({theirs['summary']})", flush=True)
    print(f"work: {work}")


if __name__ == "__main__":
    main()
