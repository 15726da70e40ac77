"""SDC trials two ways, side by side: many per launch, or one chaos run each.

A sample of `param_flip` trials of the detector campaign (`torchchaos detectors`:
trials inside one torchrun job, state restored in memory between them), and the same
trials as whole chaos runs (`torchchaos run` of `bench/targets/sdc_trainee_run.py`, the same
training step for step, with a `bitflip` fault naming the same parameter, element and
bit after the same step, and the same detector reporting through
`torchchaos.api.report_detection`). For each trial the outcome both ways (masked,
detected, silent divergence) and, for each way, the wall time and trials per CPU-hour
(2 ranks: 2 CPUs).

    python bench/sdc_trials.py [--trials 10] [--detector replica:every=2] [--seed 3]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "targets"))

from torchchaos.faults import bits  # noqa: E402
from torchchaos.sdc.models import plan  # noqa: E402

from tiny_lm import TinyLM  # noqa: E402

WARMUP, STEPS, RANKS = 8, 8, 2


def chaos_spec(trial, names: list[tuple[str, torch.Tensor]]) -> str:
    """The bitflip fault that makes the campaign's flip (chaos.sdc.trials._flip_weight)."""
    rng = random.Random(trial.seed)
    name, param = names[rng.randrange(len(names))]
    element = rng.randrange(param.numel())
    bit = bits.choose_bit(param.dtype, trial.bit_class, rng)
    return (f"bitflip:rank={trial.rank},step={WARMUP + trial.step},tensor=param,"
            f"name=module.{name},element={element},bit={bit}")


def in_process(out: Path, trials: int, detector: str, seed: int) -> tuple[dict, float]:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "torchchaos.cli", "detectors", "--out", str(out),
                    "--quiet", "--model", "param_flip", "--trials", str(trials), "--clean",
                    "0", "--detector", detector, "--seed", str(seed), "--steps", str(STEPS),
                    "--warmup", str(WARMUP)], check=True, capture_output=True)
    seconds = time.monotonic() - started
    lines = [json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines()]
    return {r["index"]: _outcome(r, detector) for r in lines}, seconds


def _outcome(result: dict, detector: str) -> str:
    if not result["corrupted"]:
        return "masked"
    return "detected" if result["detected"][detector] is not None else "silent divergence"


def one_chaos_run(out: Path, spec: str, detector: str) -> str:
    subprocess.run([sys.executable, "-m", "torchchaos.cli", "run", "--quiet", "--nproc",
                    str(RANKS), "--out", str(out), "--cache-dir", str(out.parent / "cache"),
                    "--fault", spec, "--", str(REPO / "bench" / "targets" / "sdc_trainee_run.py"),
                    "--warmup", str(WARMUP), "--steps", str(STEPS), "--detector", detector],
                   capture_output=True)
    report = json.loads((out / "report.json").read_text())
    return report["checks"]["sdc_detected"].get("outcome") or "not judged"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--detector", default="replica:every=2")
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args()
    names = [(n, t) for n, t in TinyLM().named_parameters() if t.requires_grad]
    sample = plan(["param_flip"], args.trials, 0, STEPS, RANKS, args.seed)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        inside, inside_s = in_process(root / "campaign", args.trials, args.detector,
                                      args.seed)
        one_chaos_run(root / "warm", chaos_spec(sample[0], names), args.detector)  # the reference
        started = time.monotonic()
        outside = {t.index: one_chaos_run(root / f"run-{t.index}", chaos_spec(t, names),
                                          args.detector) for t in sample}
        outside_s = time.monotonic() - started
    agree = sum(inside[t.index] == outside[t.index] for t in sample)
    print(f"{'trial':>5}  {'in one launch':<18} {'one chaos run each':<18} fault")
    for t in sample:
        print(f"{t.index:>5}  {inside[t.index]:<18} {outside[t.index]:<18} {chaos_spec(t, names)}")
    print(f"\nsame outcome: {agree} of {len(sample)}")
    for label, seconds in (("in one launch", inside_s), ("one chaos run each", outside_s)):
        per_hour = len(sample) / (seconds * RANKS / 3600)
        print(f"{label:<20} {seconds:7.1f} s for {len(sample)} trials,"
              f" {seconds / len(sample):6.2f} s a trial, {per_hour:8.0f} trials per CPU-hour")
    print(f"ratio: {outside_s / inside_s:.1f} x (the launch's start-up included in the"
          f" first; the reference run excluded from the second)")


if __name__ == "__main__":
    main()
