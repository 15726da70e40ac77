"""Checkpoint write speed through the fault filesystem vs the plain folder under it.

Side by side in one run: torch.save of a state dict (temp file, fsync, rename,
fsync of the folder: the atomic-publish recipe) into a plain folder, then into
the fault filesystem mounted over another folder of the same disk.

    python bench/faultfs.py [--mb 256] [--repeat 3] [--no-fsync]

The fault filesystem records an fsync in its durability model instead of
issuing it, so with fsyncs the mount can beat the plain folder; `--no-fsync`
leaves them out on both sides and shows the pass-through cost alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from torchchaos.faults.faultfs.mount import Mount


def publish(state: dict, folder: Path, sync: bool) -> float:
    start = time.perf_counter()
    tmp = folder / "ckpt.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, folder / "ckpt.pt")
    if sync:
        fd = os.open(folder, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-fsync", action="store_true", help="leave out every fsync")
    args = parser.parse_args()
    state = {"w": torch.randn(args.mb * 2**20 // 4)}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        plain = Path(tmp) / "plain"
        plain.mkdir()
        with Mount(Path(tmp) / "mnt", Path(tmp) / "state", Path(tmp) / "fs.jsonl") as mount:
            times: dict[str, list[float]] = {"plain": [], "faultfs": []}
            for _ in range(args.repeat):
                times["plain"].append(publish(state, plain, not args.no_fsync))
                times["faultfs"].append(publish(state, mount.mountpoint, not args.no_fsync))
    for name, seconds in times.items():
        best = min(seconds)
        print(f"{name:8} best {best:.3f} s  median {statistics.median(seconds):.3f} s"
              f"  {args.mb / best:.0f} MB/s")
    print(f"faultfs / plain (best): {min(times['faultfs']) / min(times['plain']):.2f}")


if __name__ == "__main__":
    main()
