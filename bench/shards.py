"""A bit-flip campaign (or the crash states of a save) whole and in shards run at once.

On one machine the shards share its cores, so this measures what sharding
costs and what it buys where the shards do not compete: the wall time of the
whole campaign, of N shards started together (each its own `torchchaos
campaign --shard I/N` process, the reference cached beforehand, as a CI cache
or a shared volume would hold it) and of `torchchaos merge` over them.

    python bench/shards.py --runs 8
    python bench/shards.py --crash-states   # save 2 of the bundled target, 1 and 2 shards

Crash states: the reference and the recording are made first (`crashpoints
--record-only`), as the record job of the crash-states workflow does; the
merge draws the states again from the recording to group them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "torchchaos.cli", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ))


def finish(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        output, _ = proc.communicate()
        if proc.returncode not in (0, 1):
            sys.exit(f"failed ({proc.returncode}): {output[-2000:]}")


JOB = ["--", str(REPO / "targets" / "ddp_lm.py"), "--steps", "20", "--ckpt-every", "5"]


def crash_states(base: Path) -> None:
    cache = ["--cache-dir", str(base / "cache")]
    started = time.monotonic()
    finish([cli("crashpoints", "--record-only", *cache, *JOB)])
    print(f"reference and recording (cached from here): {time.monotonic() - started:.1f} s")
    common = ["crashpoints", "--quiet", *cache]
    started = time.monotonic()
    finish([cli(*common, "--out", str(base / "whole"), *JOB)])
    whole = time.monotonic() - started
    print(f"crash states of save 2, 1 shard: {whole:.1f} s", flush=True)
    started = time.monotonic()
    finish([cli(*common, "--shard", f"{i}/2", "--out", str(base / f"2-{i}"), *JOB)
            for i in (1, 2)])
    ran = time.monotonic() - started
    started = time.monotonic()
    finish([cli("merge", str(base / "2-1"), str(base / "2-2"), "--out", str(base / "m"))])
    print(f"2 shards at once: {ran:.1f} s ({whole / ran:.2f}x), merge"
          f" {time.monotonic() - started:.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--crash-states", action="store_true")
    options = parser.parse_args()
    if options.crash_states:
        with tempfile.TemporaryDirectory() as tmp:
            crash_states(Path(tmp))
        return
    runs = str(options.runs)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        cache = ["--cache-dir", str(base / "cache")]
        common = ["campaign", "--quiet", "--runs", runs, *cache]
        started = time.monotonic()
        finish([cli("campaign", "--quiet", "--runs", "1", *cache, "--out", str(base / "warm"))])
        print(f"reference and one run (cache warm from here): {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        finish([cli(*common, "--out", str(base / "whole"))])
        whole = time.monotonic() - started
        print(f"{runs} runs, 1 shard: {whole:.1f} s", flush=True)
        for count in (2, 4):
            started = time.monotonic()
            finish([cli(*common, "--shard", f"{i}/{count}", "--out", str(base / f"{count}-{i}"))
                    for i in range(1, count + 1)])
            ran = time.monotonic() - started
            started = time.monotonic()
            finish([cli("merge", *[str(base / f"{count}-{i}") for i in range(1, count + 1)],
                        "--out", str(base / f"merged-{count}"))])
            merged = time.monotonic() - started
            print(f"{runs} runs, {count} shards at once: {ran:.1f} s ({whole / ran:.2f}x),"
                  f" merge {merged:.2f} s", flush=True)


if __name__ == "__main__":
    main()
