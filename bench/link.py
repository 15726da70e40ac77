"""What does a degraded link cost a job, and does the verdict stay right?

The bundled reference target on two simulated nodes (one gloo rank each, network
namespaces), with node 1's link degraded after step 10 for `--for` seconds
(torchchaos.faults.link: nftables loss and rate limit; netem delay where the
kernel has it). For each row: the verdict, the wall time of the run, and the
median step time of rank 0 while the degradation was in force against the same
run's steps outside it (one monotonic clock for every process).

    python bench/link.py [--for 5]

Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from torchchaos.engine import run_scenario
from torchchaos.faults import link
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario

TARGET = Path(__file__).resolve().parent.parent / "targets" / "ddp_lm.py"
ARGS = ["--steps", "40", "--ckpt-every", "5", "--timeout", "3"]
ROWS = ["loss=5", "loss=5,rate=200", "loss=30", "rate=20", "loss=100", "delay=200"]


def step_gaps(history: History, inside: tuple[float, float] | None) -> tuple[list, list]:
    steps = sorted(e["t"] for e in history.steps(rank=0))
    gaps = list(zip(steps, steps[1:], strict=False))
    if inside is None:
        return [], [b - a for a, b in gaps]
    lo, hi = inside
    within = [b - a for a, b in gaps if lo <= b <= hi + 0.5]
    outside = [b - a for a, b in gaps if not lo <= b <= hi + 0.5]
    return within, outside


def ms(gaps: list[float]) -> str:
    return f"{statistics.median(gaps) * 1000:.0f}" if gaps else "-"


def row(degrade: str | None, seconds: float, folder: Path) -> str:
    faults = [] if degrade is None else [f"link:node=1,step=10,{degrade},for={seconds:g}"]
    scenario = Scenario.build(str(TARGET), args=ARGS, nproc=1, nodes=2, network="netns",
                              faults=faults)
    report = run_scenario(scenario, folder, folder.parent / "cache")
    history = History.of_run(Path(report.run_dir))
    begun, ended = history.of("nemesis_begin"), history.of("nemesis_end")
    window = (begun[0]["t"], ended[0]["t"]) if begun and ended else None
    within, outside = step_gaps(history, window)
    failing = [k for k, c in report.checks.items() if c["ok"] is False]
    return (f"| {degrade or 'none'} | {report.verdict.upper()} {' '.join(failing)} |"
            f" {report.restarts} | {report.wall_seconds:.1f} | {ms(within)} | {ms(outside)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--for", dest="seconds", type=float, default=5.0)
    a = parser.parse_args()
    rows = [r for r in ROWS if "delay" not in r or not link.netem_missing()]
    print("| link of node 1 (after step 10) | verdict | restarts | wall s |"
          " median step ms, degraded | median step ms, other steps |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for n, degrade in enumerate([None, *rows]):
            print(row(degrade, a.seconds, Path(tmp) / f"row{n}"), flush=True)
    if link.netem_missing():
        print(f"(delay rows left out: no netem here: {link.netem_missing()})")


if __name__ == "__main__":
    main()
