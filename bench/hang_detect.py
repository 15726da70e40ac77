"""How fast is a hang noticed, and how fast is the job gone?

For each hang kind, on the bundled reference target (2 gloo ranks, CPU), two
real chaos runs side by side:
1. with the target's own 5 s collective timeout: from the injected hang to the
   job's reaction (a rank exits) and to the first step after the restart;
2. with torch's default timeouts (gloo: 30 minutes): from the injected hang to
   the harness's detection (no progress for --hang-timeout seconds, stacks
   taken) and to a torn-down job (every process killed and gone).

    python bench/hang_detect.py [--hang-timeout 10]

Times come from the runs' histories (one monotonic clock for every process).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from torchchaos.engine import run_scenario
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario

TARGET = Path(__file__).resolve().parent.parent / "targets" / "ddp_lm.py"
STEPS = ["--steps", "20", "--ckpt-every", "5"]
KINDS = {
    "SIGSTOP": "hang:rank=1,step=10",
    "held before DDP all-reduce": "hang:rank=1,step=10,mode=collective",
    "held in dist.all_reduce": "hang:rank=0,step=10,mode=collective,op=all_reduce",
    "collective order mismatch": "hang:rank=1,step=10,mode=mismatch",
}
GLOO_DEFAULT_SECONDS = 1800.0  # torch's default process-group timeout for gloo


def _after(history: History, start: float, kind: str) -> float | None:
    return next((e["t"] - start for e in history.of(kind) if e["t"] > start), None)


def measure(fault: str, args: list[str], hang_timeout: float | None,
            folder: Path) -> dict[str, float | None]:
    scenario = Scenario.build(str(TARGET), faults=[fault], args=args,
                              hang_timeout=hang_timeout)
    report = run_scenario(scenario, folder, folder.parent / "cache")
    history = History.of_run(Path(report.run_dir))
    began = history.of("hang_begin")[0]["t"]
    restarted = [e["t"] - began for e in history.steps() if e["t"] > began
                 and e["attempt"] + e["launch"] > 0]
    return {"reaction": _after(history, began, "rank_exit"),
            "first_step_after": min(restarted, default=None),
            "detected": _after(history, began, "hang"),
            "torn_down": _after(history, began, "reaped") or _after(history, began,
                                                                    "job_exit")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang-timeout", type=float, default=None)
    ns = parser.parse_args()
    print(f"{'hang kind':<28} {'timeouts on: reaction':>22} {'back to work':>13}"
          f" {'timeouts off: detected':>23} {'torn down':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for number, (name, fault) in enumerate(KINDS.items()):
            on = measure(fault, STEPS, None, Path(tmp) / f"on-{number}")
            off = measure(fault, [*STEPS, "--default-timeouts"], ns.hang_timeout,
                          Path(tmp) / f"off-{number}")
            print(f"{name:<28} {_s(on['reaction']):>22} {_s(on['first_step_after']):>13}"
                  f" {_s(off['detected']):>23} {_s(off['torn_down']):>10}", flush=True)
    print(f"without timeouts and without the harness, gloo waits {GLOO_DEFAULT_SECONDS:.0f} s"
          " before a collective fails")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


if __name__ == "__main__":
    main()
