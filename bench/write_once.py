"""Recording mounts that write every byte once, side by side with a baseline revision that
writes each byte twice (to the file under the mount and to the blob file) and copies a
crash state's folder into every recovery.

For each size (`--state-mb` of the bundled target, 2 ranks), each revision gets a
cache of its own holding the reference run; then, `--repeats` times, alternating
revisions: the recording of save 2 made again (`crashpoints --record-only`, its
cached recording removed first: the seconds of recording alone), then the sweep of
save 2 from that recording (`crashpoints --save 2`: the seconds of the sweep, its
"s per recovery"), and the disk under the sweep's --out and the cache. Beside them,
plain torchrun runs the same job to the step after save 2 (the recording run's job,
with no harness and no mount).

    python bench/write_once.py [--sizes 300,1024] [--repeats 3] [--baseline c897b7e]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crashstates_scale import disk
from warm_recoveries import JOB, REPO, TARGET, baseline_python, sweep

MIB = 1 << 20


def record(python: str, cache: Path, mb: float) -> float:
    """Seconds to make the recording of save 2 again (the reference is cached)."""
    for made in cache.glob("*-save2*"):
        shutil.rmtree(made) if made.is_dir() else made.unlink()
    started = time.monotonic()
    done = subprocess.run([python, "-m", "torchchaos.cli", "crashpoints", "--record-only",
                           "--save", "2", "--cache-dir", str(cache), "--", str(TARGET), *JOB,
                           "--state-mb", f"{mb:g}"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"--record-only failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return time.monotonic() - started


def plain(work: Path, mb: float) -> float:
    """Seconds of plain torchrun running the job to step 11 (two saves), no harness."""
    run_dir = work / f"plain-{mb:g}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    started = time.monotonic()
    subprocess.run(["torchrun", "--standalone", "--nproc-per-node", "2", str(TARGET), "--steps",
                    "11", "--ckpt-every", "5", "--watchdog", "120", "--state-mb", f"{mb:g}"],
                   cwd=run_dir, env={**os.environ, "TMPDIR": str(run_dir),
                                     "OMP_NUM_THREADS": "1"}, check=True, capture_output=True)
    seconds = time.monotonic() - started
    shutil.rmtree(run_dir)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="300,1024", help="MB of state per rank")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default="c897b7e",
                        help="a revision whose recording mounts write every byte twice")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="write-once-", dir=os.path.expanduser("~")))
    work.mkdir(parents=True, exist_ok=True)
    pythons = {"baseline": baseline_python(work, args.baseline), "write once": sys.executable}
    try:
        for mb in (float(s) for s in args.sizes.split(",")):
            seen: dict[str, dict[str, list[float]]] = {
                name: {"record": [], "sweep": [], "disk": []} for name in pythons}
            lines: dict[str, str] = {}
            plains = []
            for name, python in pythons.items():  # the reference, made once per cache
                record(python, work / f"cache-{name.replace(' ', '-')}-{mb:g}", mb)
            for _ in range(args.repeats):
                plains.append(plain(work, mb))
                for name, python in pythons.items():
                    cache = work / f"cache-{name.replace(' ', '-')}-{mb:g}"
                    seen[name]["record"].append(record(python, cache, mb))
                    out = work / f"sweep-{name.replace(' ', '-')}-{mb:g}"
                    shutil.rmtree(out, ignore_errors=True)
                    seconds, lines[name] = sweep(python, out, cache, mb)
                    seen[name]["sweep"].append(seconds)
                    seen[name]["disk"].append(disk(out, cache) / MIB)
                    shutil.rmtree(out)
            print(f"{mb:g} MB per rank, medians of {args.repeats}; plain torchrun to step 11:"
                  f" {statistics.median(plains):.1f} s ({', '.join(f'{s:.1f}' for s in plains)})")
            for name, measured in seen.items():
                print(f"  {name}: recording {statistics.median(measured['record']):.1f} s"
                      f" ({', '.join(f'{s:.1f}' for s in measured['record'])}), sweep"
                      f" {statistics.median(measured['sweep']):.1f} s"
                      f" ({', '.join(f'{s:.1f}' for s in measured['sweep'])}), disk --out and"
                      f" cache after the sweep {max(measured['disk']):.0f} MiB\n    last:"
                      f" {lines[name]}", flush=True)
            for name in pythons:
                shutil.rmtree(work / f"cache-{name.replace(' ', '-')}-{mb:g}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(work / "baseline")],
                       cwd=REPO, check=False)


if __name__ == "__main__":
    main()
