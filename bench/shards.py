"""A bit-flip campaign whole and in 2 and 4 shards run at once, then merged.

On one machine the shards share its cores, so this measures what sharding
costs and what it buys where the shards do not compete: the wall time of the
whole campaign, of N shards started together (each its own `torchchaos
campaign --shard I/N` process, the reference cached beforehand, as a CI cache
or a shared volume would hold it) and of `torchchaos merge` over them.

    python bench/shards.py --runs 8
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
    return subprocess.Popen([sys.executable, "-m", "chaos.cli", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def finish(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        output, _ = proc.communicate()
        if proc.returncode not in (0, 1):
            sys.exit(f"failed ({proc.returncode}): {output[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    runs = str(parser.parse_args().runs)
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
