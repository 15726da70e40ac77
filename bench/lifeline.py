"""What the lifeline costs, and how fast a dead harness's run is gone.

Three measurements, both sides alternated in one invocation:

1. per training step: fault-free harness runs of `bench/train_ddp.py` (its own
   in-loop step timer) with the lifeline and with TORCHCHAOS_NO_LIFELINE=1,
   each harness a fresh process, alternated round by round;
2. the lifeline's start in a fresh process: the sweep for leftovers, the lock
   file and the watcher's launch (what the first run of a harness pays once);
3. SIGKILL of a harness whose ranks train (one of them SIGSTOPped): seconds
   until no process of the run is alive, with the lifeline and without it.

    python bench/lifeline.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from torchchaos.host import procs  # noqa: E402
from torchchaos.host.lifeline import OFF_ENV  # noqa: E402

SCRIPT = str(REPO / "bench" / "train_ddp.py")
ARGS = ["--size", "small", "--steps", "300"]
HARNESS = """
import json, sys, time
from pathlib import Path
from torchchaos.harness.runner import Job
from torchchaos.scenario.model import Scenario
outcome = Job(Scenario(script=sys.argv[1], args=sys.argv[3:], nproc=2), Path(sys.argv[2]),
              faults=[]).run()
assert outcome.completed, outcome.log_tail()
print(json.dumps({"wall": outcome.wall_seconds}))
"""
START = """
import time
t = time.perf_counter()
from torchchaos.host import lifeline
lifeline.own("0123456789ab")
print(time.perf_counter() - t)
"""


def _env(lifeline: bool) -> dict[str, str]:
    environ = dict(os.environ)  # torchchaos is installed (pip install -e .)
    if not lifeline:
        environ[OFF_ENV] = "1"
    return environ


def one_run(lifeline: bool) -> tuple[float, float]:
    """(median step seconds, job wall seconds) of one fault-free harness run."""
    with tempfile.TemporaryDirectory() as run_dir:
        done = subprocess.run([sys.executable, "-c", HARNESS, SCRIPT, run_dir, *ARGS],
                              env=_env(lifeline), capture_output=True, text=True, check=True)
        steps = json.loads((Path(run_dir) / "step_times.json").read_text())
        return statistics.median(steps), json.loads(done.stdout.splitlines()[-1])["wall"]


def start_cost() -> float:
    done = subprocess.run([sys.executable, "-c", START], env=_env(True), capture_output=True,
                          text=True, check=True)
    return float(done.stdout.strip())


def death_to_nothing(lifeline: bool, limit: float = 10.0) -> float | None:
    """SIGKILL a harness mid-training with a rank stopped; seconds until none of its
    processes is alive (None: some still were after `limit` s; then reaped here)."""
    with tempfile.TemporaryDirectory() as run_dir:
        steps = ["--size", "small", "--steps", "100000"]
        harness = subprocess.Popen([sys.executable, "-c", HARNESS, SCRIPT, run_dir, *steps],
                                   env=_env(lifeline), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        prefix = f"TORCHCHAOS_RUN_DIR={run_dir}".encode()
        ranks: list[int] = []
        while len(ranks) < 3:  # torchrun and two ranks
            time.sleep(0.2)
            ranks = procs.pids_with_env(lambda item: item == prefix)
        time.sleep(3)
        os.kill(max(ranks), signal.SIGSTOP)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        died = time.monotonic()
        while procs.pids_with_env(lambda item: item == prefix):
            if time.monotonic() - died > limit:
                procs.reap(None, procs.pids_with_env(lambda item: item == prefix))
                return None
            time.sleep(0.02)
        return time.monotonic() - died


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    step: dict[bool, list[float]] = {True: [], False: []}
    wall: dict[bool, list[float]] = {True: [], False: []}
    for number in range(repeats):
        for side in (True, False):
            seconds, whole = one_run(side)
            step[side].append(seconds)
            wall[side].append(whole)
        print(f"  round {number + 1}: step {step[True][-1] * 1e3:.3f} ms with the lifeline,"
              f" {step[False][-1] * 1e3:.3f} ms without; wall {wall[True][-1]:.2f} s vs"
              f" {wall[False][-1]:.2f} s", flush=True)
    on, off = statistics.median(step[True]), statistics.median(step[False])
    print(f"per step: median {on * 1e3:.3f} ms with the lifeline, {off * 1e3:.3f} ms without,"
          f" ratio {on / off:.3f}; job wall {statistics.median(wall[True]):.2f} s vs"
          f" {statistics.median(wall[False]):.2f} s")
    starts = [start_cost() for _ in range(repeats * 2)]
    print(f"lifeline start (sweep, lock, watcher launch): median"
          f" {statistics.median(starts) * 1e3:.1f} ms, max {max(starts) * 1e3:.1f} ms")
    for side in (True, False):
        gone = [death_to_nothing(side) for _ in range(repeats)]
        shown = ", ".join("still alive after 10 s" if g is None else f"{g:.2f} s" for g in gone)
        print(f"harness SIGKILLed, a rank stopped, {'with' if side else 'without'} the"
              f" lifeline: every process gone after {shown}")


if __name__ == "__main__":
    main()
