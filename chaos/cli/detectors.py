"""`torchchaos detectors`: score SDC detectors against the field's fault models
(docs/tutorials/bit-flips.md)."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    from torchchaos.sdc.campaign import DEFAULT_DETECTORS
    from torchchaos.sdc.models import MODELS

    cmd = sub.add_parser(
        "detectors", help="score SDC detectors: detection probability with intervals,"
        " latency, false alarms, cost",
        description="Runs N trials per fault model (a wrong matrix product: one element, a"
        " warp's 32, a burst of bits, a NaN, a persistently defective unit; a flipped"
        " weight) and clean trials, many per launch of one real torchrun job: each trial"
        " restores the state kept in memory, injects on a seeded rank and step, runs"
        " --steps steps with every detector watching, and compares the final weights with"
        " the fault-free ones. Prints each model and detector's detection probability with"
        " its 95 %% Wilson interval, the latency in steps, the false alarms over the clean"
        " trials and the cost per step; writes detectors.json and detectors.svg. Exit 1 if"
        " a --require or --max-false-alarms is not met, else 0.")
    cmd.add_argument("--trainee", default=None, metavar="FILE.py[:FUNCTION]",
                     help="the training to score on (default: the bundled target's,"
                     " targets/sdc_trainee.py)")
    cmd.add_argument("--model", action="append", default=None, metavar="NAME",
                     help=f"fault model (repeatable; default all: {', '.join(MODELS)})")
    cmd.add_argument("--detector", action="append", default=None, metavar="SPEC",
                     help="detector, e.g. replica:every=10 (repeatable; default "
                     f"{' '.join(DEFAULT_DETECTORS)})")
    cmd.add_argument("--trials", type=int, default=200, metavar="N",
                     help="trials per fault model (default 200)")
    cmd.add_argument("--clean", type=int, default=None, metavar="N",
                     help="fault-free trials for the false alarms (default as --trials)")
    cmd.add_argument("--steps", type=int, default=8, metavar="K",
                     help="steps per trial (default 8; the fault strikes in the first half)")
    cmd.add_argument("--warmup", type=int, default=8, metavar="W",
                     help="clean steps before the state is kept (default 8)")
    cmd.add_argument("--ranks", type=int, default=2, help="data-parallel ranks (default 2)")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--bound", type=int, default=None, metavar="STEPS",
                     help="the latency a detection must stay within (the checkpoint"
                     " interval): a later one, or a miss, is OUT of bound")
    cmd.add_argument("--require", action="append", default=[], metavar="DETECTOR[/MODEL]=P",
                     help="the 95 %% interval's low end of its detection probability must be"
                     " at least P (and within --bound) (repeatable)")
    cmd.add_argument("--require-detection", type=float, default=None, metavar="P",
                     help="--require P for every detector")
    cmd.add_argument("--max-false-alarms", type=float, default=None, metavar="P",
                     help="the false-alarm interval's high end may be at most P")
    cmd.add_argument("--out", type=Path, default=None, metavar="DIR",
                     help="a new folder for the results (default"
                     " ./torchchaos-runs/<time>-detectors)")
    cmd.add_argument("--quiet", action="store_true", help="no progress lines")


def cmd_detectors(ns: argparse.Namespace) -> int:
    from torchchaos.cli.output import progress_printer
    from torchchaos.engine import check_out_dir, prepare_out_dir
    from torchchaos.errors import UsageError
    from torchchaos.sdc import campaign

    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}-detectors"
    out = (ns.out or Path("torchchaos-runs") / stamp).resolve()
    detectors = ns.detector or list(campaign.DEFAULT_DETECTORS)
    required = dict(_requirement(r) for r in ns.require)
    if ns.require_detection is not None:
        required |= {d: ns.require_detection for d in detectors if d not in required}
    plan = campaign.Campaign(
        out=out, trainee=ns.trainee or str(campaign.BUNDLED_TRAINEE),
        models=ns.model or list(campaign.MODELS), detectors=detectors, trials=ns.trials,
        clean=ns.trials if ns.clean is None else ns.clean, steps=ns.steps, warmup=ns.warmup,
        seed=ns.seed, ranks=ns.ranks, bound=ns.bound, required=required,
        max_false_alarms=ns.max_false_alarms)
    plan.check()
    check_out_dir(out)
    if ns.bound is not None and ns.bound >= ns.steps:
        raise UsageError(f"--bound {ns.bound}: a trial has {ns.steps} steps; a bound needs"
                         " --steps above it to be missed")
    prepare_out_dir(out)
    outcome = campaign.run(plan, progress_printer(ns.quiet))
    print(outcome.text)
    print(f"\nresults: {out}/detectors.json, plot: {out}/detectors.svg")
    for failure in outcome.failures:
        print(f"requirement not met: {failure}", file=sys.stderr)
    return 1 if outcome.failures else 0


def _requirement(text: str) -> tuple[str, float]:
    from torchchaos.errors import UsageError

    key, eq, value = text.rpartition("=")
    try:
        if not eq or not key:
            raise ValueError
        return key, float(value)
    except ValueError:
        raise UsageError(f"--require {text!r}: needs DETECTOR[/MODEL]=P, P a number") from None


COMMANDS = {"detectors": cmd_detectors}
