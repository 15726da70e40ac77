"""A detector campaign, harness side: launch the trials, watch them, score them.

`torchchaos detectors` checks everything it is given before any process starts, writes
the trials' configuration into a folder of its own, starts one torchrun job
(`torchchaos.sdc.trials`, its processes marked with the campaign's run id and on the
harness's lifeline), says how far it got while it runs, reaps it on every exit path,
and then scores what rank 0 wrote: the table, `detectors.json` (every cell, the false
alarms, the costs, what was asked and what failed), `detectors.svg` (by model) and
`detectors-bits.svg` (by model and bit class).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchchaos import env
from torchchaos.errors import CannotJudge, UsageError
from torchchaos.host import lifeline, procs
from torchchaos.progress import Progress
from torchchaos.sdc import detectors as detector_kinds
from torchchaos.sdc import score
from torchchaos.sdc.models import MODELS

BUNDLED_TRAINEE = env.package_dir("torchchaos.targets") / "sdc_trainee.py"
DEFAULT_DETECTORS = ("loss_spike", "grad_z", "replica:every=5", "rerun", "target_guard")


@dataclass
class Campaign:
    out: Path
    trainee: str = str(BUNDLED_TRAINEE)
    models: list[str] = field(default_factory=lambda: list(MODELS))
    detectors: list[str] = field(default_factory=lambda: list(DEFAULT_DETECTORS))
    trials: int = 200  # per model
    clean: int = 200
    steps: int = 8  # per trial
    warmup: int = 8
    seed: int = 0
    ranks: int = 2
    bound: int | None = None  # steps: a later detection misses it
    required: dict[str, float] = field(default_factory=dict)  # 'detector[/model]' -> low end
    max_false_alarms: float | None = None

    def check(self) -> None:
        """Every input, before anything starts: one line each (UsageError)."""
        path, _, function = self.trainee.partition(":")
        if not path.endswith(".py") or not Path(path).is_file():
            raise UsageError(f"trainee {self.trainee!r}: needs FILE.py[:FUNCTION], an existing"
                             " Python file whose function (default build) returns a Trainee")
        if function and not function.isidentifier():
            raise UsageError(f"trainee {self.trainee!r}: {function!r} is not a function name")
        unknown = [m for m in self.models if m not in MODELS]
        if unknown:
            raise UsageError(f"unknown fault model {unknown[0]!r} (known: {', '.join(MODELS)})")
        for spec in self.detectors:
            try:
                detector_kinds.parse(spec)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            missing = detector_kinds.missing_package(spec)
            if missing:
                raise UsageError(missing)
        labels = set(self.detectors)
        for key, low in self.required.items():
            detector, _, model = key.partition("/")
            if detector not in labels:
                raise UsageError(f"--require {key}: no detector {detector!r} in this campaign"
                                 f" (its detectors: {', '.join(self.detectors)})")
            if model and model not in self.models:
                raise UsageError(f"--require {key}: no model {model!r} in this campaign")
            if not 0 <= low <= 1:
                raise UsageError(f"--require {key}={low:g}: a probability is 0 to 1")
        for name, value, least in (("--trials", self.trials, 1), ("--clean", self.clean, 0),
                                   ("--steps", self.steps, 2), ("--warmup", self.warmup, 1),
                                   ("--ranks", self.ranks, 1)):
            if value < least:
                raise UsageError(f"{name} {value}: needs {least} or more")

    def config(self) -> dict[str, Any]:
        path, colon, function = self.trainee.partition(":")
        return {"trainee": f"{Path(path).resolve()}{colon}{function}",
                "models": self.models, "detectors": self.detectors, "trials": self.trials,
                "clean": self.clean, "steps": self.steps, "warmup": self.warmup,
                "seed": self.seed, "out": str(self.out)}


@dataclass
class Outcome:
    results: list[dict[str, Any]]
    table: list[score.Cell]
    by_bit_class: list[score.Cell]
    alarms: dict[str, dict[str, float | int]]
    costs: dict[str, Any]
    failures: list[str]
    text: str


def run(campaign: Campaign, progress: Progress) -> Outcome:
    """Run the trials (the out folder must be new: `engine.prepare_out_dir`) and score them."""
    campaign.check()
    run_id = uuid.uuid4().hex[:12]
    lifeline.own(run_id, campaign.out)  # before anything of the run exists
    config = campaign.out / "config.json"
    config.write_text(json.dumps(campaign.config(), indent=1))
    total = campaign.trials * len(campaign.models) + campaign.clean
    results = campaign.out / "trials.jsonl"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(campaign.ranks), "-m", "torchchaos.sdc.trials",
               str(config)]
    scratch = campaign.out / "tmp"  # torchrun's own temporary folders: inside the run's
    scratch.mkdir()
    environ = {**os.environ, env.RUN_ID: run_id, **lifeline.lock_env(),
               "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch),
               "PYTHONPATH": os.pathsep.join(p for p in (*env.import_path(),
                                                         os.environ.get("PYTHONPATH", ""))
                                             if p)}
    log = campaign.out / "trials.log"
    progress(f"{total} trials ({campaign.trials} of each of {len(campaign.models)} models,"
             f" {campaign.clean} clean) on {campaign.ranks} ranks")
    with log.open("ab") as log_file:
        job = subprocess.Popen(command, env=environ, stdout=log_file, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True,
                               cwd=campaign.out)
    try:
        code = _watch(job, results, total, progress)
    finally:
        procs.reap(run_id, [job.pid])
    if code != 0:
        raise CannotJudge(f"the trials' job exited {code} ({_cause(log)}); its log: {log}")
    return score_folder(campaign)


def _watch(job: subprocess.Popen[bytes], results: Path, total: int,
           progress: Progress) -> int:
    said, last = 0, time.monotonic()
    while (code := job.poll()) is None:
        time.sleep(0.5)
        done = _lines(results)
        if done != said and (time.monotonic() - last > 10 or done == total):
            progress(f"trials {done}/{total}")
            said, last = done, time.monotonic()
    return code


def _cause(log: Path) -> str:
    """The line of the job's log that says what failed: the last exception's, else the
    root cause torchrun names."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    said = [line.strip() for line in lines
            if line and not line.startswith(" ") and ("Error" in line or "error" in line)
            and "ChildFailedError" not in line]
    return said[-1][:300] if said else "no error line; see the log"


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def score_folder(campaign: Campaign) -> Outcome:
    """Score what the trials wrote; write detectors.json and detectors.svg."""
    out = campaign.out
    results = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    costs = json.loads((out / "costs.json").read_text())
    labels = campaign.detectors
    table = score.cells(results, labels, campaign.bound)
    by_class = score.cells(results, labels, campaign.bound, by_bit_class=True)
    alarms = score.false_alarms(results, labels)
    failures = score.requirement_failures(table, alarms, campaign.required,
                                          campaign.max_false_alarms, campaign.bound)
    actions = {spec: _action(spec) for spec in labels}
    hours = costs["seconds"] / 3600
    cpu_hours = hours * campaign.ranks
    text = score.table_text(table, alarms, costs, actions) + (
        f"\n\n{costs['trials']} trials in {costs['seconds']:.1f} s on {campaign.ranks} ranks"
        f" ({costs['trials'] / max(cpu_hours, 1e-9):.0f} trials per CPU-hour); a step"
        f" {costs['step_ms']:.2f} ms without checks")
    (out / "detectors.json").write_text(json.dumps({
        "config": campaign.config(), "cells": [c.to_dict() for c in table],
        "by_bit_class": [c.to_dict() for c in by_class], "false_alarms": alarms,
        "costs": costs, "actions": actions, "bound": campaign.bound,
        "required": campaign.required, "max_false_alarms": campaign.max_false_alarms,
        "failures": failures}, indent=1))
    (out / "detectors.svg").write_text(score.plot_svg(
        table, f"detection probability by fault model, 95 % intervals ({len(results)} trials)"))
    (out / "detectors-bits.svg").write_text(score.plot_svg(
        by_class, "detection probability by fault model and bit class, 95 % intervals"))
    return Outcome(results, table, by_class, alarms, costs, failures, text)


def _action(spec: str) -> str:
    return detector_kinds.action_of(detector_kinds.parse(spec)[0])
