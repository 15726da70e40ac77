"""Blind attribution: inject each fault kind, keep only what the job left, import, compare.

    python bench/incident_attribution.py --make /tmp/corpus      # run the jobs (minutes)
    python bench/incident_attribution.py --score /tmp/corpus     # import each, print the table
    python bench/incident_attribution.py --replay /tmp/corpus --planted   # replay each

`--make` runs, for each script, the battery's rows as the reference run places them
(kills of rank 0 and the last rank between saves, a node kill, kills inside the 2nd
save, a torn write, a power loss, a preemption), then a stopped rank, a rank held in
a collective, a SIGSEGV, and the field's kinds (OOM, exceptions, native crashes, a
hang holding the GIL, an abort). Two exceptions follow: one out of the writer's save,
and one out of the restart's load after a kill. That last case is scored on both
failures: the first one, and the restart's own, by its rank and phase.

The scripts: the bundled target; tests/scripts/plain_ddp.py, a DDP script written
apart that prints almost nothing; two more written apart, the AdamW trainer of
bench/targets with per-rank files and tests/scripts/safetensors_ddp.py in a Hugging
Face Trainer's layout; and targets/dcp_lm.py, DCP's async save of FSDP2 shards,
its main under torchelastic's @record (error files, faulthandler). `--scripts hf` adds
targets/hf_trainer_lm.py, the Hugging Face Trainer itself, `--scripts lightning`
targets/lightning_lm.py, Lightning's Trainer, and `--scripts accelerate`
targets/accelerate_lm.py, Accelerate's recipe (all three need the `frameworks` extra),
and two held-out scripts written apart by helpers that never read the readers:
`--scripts logging` (tests/scripts/logging_trainer.py, Python's `logging`),
`--scripts dcptrainer` (tests/scripts/dcp_trainer.py, FSDP2 and DCP), `--scripts
jsonlog` (tests/scripts/jsonlog_trainer.py, a JSON object per log line) and `--scripts
ignite` (tests/scripts/ignite_trainer.py, PyTorch-Ignite; the `frameworks` extra).

Each run's folder keeps only what a failed job leaves an engineer: the launcher's
logs, torchelastic's error files, the stacks a hang watchdog took, and the
checkpoint folders. The harness's report and the agent's history stay out;
`injected.json` beside the copy says what was injected, for the scoring only.

The jobs run with exec'd ranks (`TORCHCHAOS_COLD_START=1`), as a user's torchrun
starts them, so that torchrun's lines are its subprocess mode's.

`--score` imports each copy with `torchchaos.incident` and compares kind, rank
(or node), phase and the step window with what was injected. A miss that the
import said it could not tell is counted apart from a wrong guess.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = {
    "bundled": (REPO / "targets" / "ddp_lm.py", ["--steps", "20", "--ckpt-every", "5"]),
    "plain_ddp": (REPO / "tests" / "scripts" / "plain_ddp.py", []),
    # written apart, as other teams write one: per-rank files under step folders and a
    # `latest` marker, a SIGTERM handler, a log line per save
    "adamw": (REPO / "bench" / "targets" / "adamw_trainer.py", ["--steps", "20",
                                                                 "--save-every", "5"]),
    # a Hugging Face Trainer's layout: checkpoint-N/ folders, safetensors from Rust
    "safetensors": (REPO / "tests" / "scripts" / "safetensors_ddp.py", []),
    # another save protocol: FSDP2 shards saved by DCP's async_save from a background
    # thread, a folder per checkpoint, a manifest published by rank 0
    "dcp": (REPO / "targets" / "dcp_lm.py", ["--steps", "20", "--ckpt-every", "5"]),
    # a framework's own loop and logging: the Hugging Face Trainer as its docs show it
    # (tqdm bars, dicts of metrics, no step line of the script's own); opt in, it needs
    # the `frameworks` extra
    "hf": (REPO / "targets" / "hf_trainer_lm.py", ["--steps", "20", "--ckpt-every", "5"]),
    # another framework, as quiet as its docs' recipe leaves it: Lightning's Trainer with
    # no progress bar and no logger, ModelCheckpoint's `epoch=0-step=10.ckpt` and
    # `last.ckpt`, and a SIGTERM that ends the fit with exit 0; opt in (`frameworks`)
    "lightning": (REPO / "targets" / "lightning_lm.py", ["--steps", "20", "--ckpt-every",
                                                          "5"]),
    # Accelerate's recipe: save_state into step_N folders (safetensors, every rank's RNG
    # state), load_state of the newest, skip_first_batches; opt in (`frameworks`)
    "accelerate": (REPO / "targets" / "accelerate_lm.py", ["--steps", "20", "--ckpt-every",
                                                            "5"]),
    # written apart by a helper that never read the readers: Python's logging with
    # timestamps and `rank=N`, `global_step=12`, "restored state from ...", "checkpoint
    # ... committed", global_step_N/ folders with a COMPLETE marker; opt in, a held-out one
    "logging": (REPO / "tests" / "scripts" / "logging_trainer.py", ["--steps", "20",
                                                                     "--ckpt-every", "5"]),
    # the second held out, written apart the same way: FSDP2 over a CPU mesh, DCP's
    # save and load into step-N/ folders, a `[trainer]` logger on rank 0 only; opt in
    "dcptrainer": (REPO / "tests" / "scripts" / "dcp_trainer.py", ["--steps", "20",
                                                                    "--ckpt-every", "5"]),
    # the third held out: a JSON object per log line (a log store's structured logs)
    "jsonlog": (REPO / "tests" / "scripts" / "jsonlog_trainer.py", ["--steps", "20",
                                                                     "--ckpt-every", "5"]),
    # the fourth: PyTorch-Ignite as its examples show it (needs the `frameworks` extra)
    "ignite": (REPO / "tests" / "scripts" / "ignite_trainer.py", ["--steps", "20",
                                                                   "--ckpt-every", "5"]),
}
# karpathy/nanoGPT's train.py as its authors wrote it (opt in): not in this repository.
# NANOGPT names a copy prepared as bench/nanogpt_crashstates.sh prepares one (its
# two-line CPU path, the character data set made by its own prepare.py). It prints on
# rank 0 only, writes out/ckpt.pt in place, and starts from scratch unless told to
# resume, so torchrun's restarts train again from step 0.
NANOGPT = Path(os.environ.get("NANOGPT", "/tmp/nanogpt/nanoGPT"))
SCRIPTS["nanogpt"] = (NANOGPT / "train.py", [
    str(NANOGPT / "config" / "train_shakespeare_char.py"), "--device=cpu", "--backend=gloo",
    "--dtype=float32", "--compile=False", "--gradient_accumulation_steps=2", "--n_layer=2",
    "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--max_iters=20",
    "--lr_decay_iters=20", "--warmup_iters=2", "--eval_interval=5", "--eval_iters=2",
    "--log_interval=1", "--always_save_checkpoint=True", "--dropout=0.0",
    "--out_dir={run_dir}/out"])
# pytorch/examples' DDP tutorial (distributed/ddp-tutorial-series/multigpu_torchrun.py),
# as its authors wrote it (opt in): DDP_TUTORIAL names a copy prepared by
# bench/ddp_tutorial_prepare.sh. A line per epoch and none per step, "[GPU1]" for its
# rank, snapshot.pt written in place in the working directory after every epoch.
DDP_TUTORIAL = Path(os.environ.get("DDP_TUTORIAL", "/tmp/ddp-tutorial"))
SCRIPTS["ddp_tutorial"] = (DDP_TUTORIAL / "multigpu_torchrun.py", ["4", "1"])
# what a script reads from its working directory, linked into each run's folder
LINKS = {"nanogpt": [str(NANOGPT / "configurator.py"), str(NANOGPT / "data")]}
DEFAULT_SCRIPTS = ["bundled", "plain_ddp", "adamw", "safetensors", "dcp"]


# A case of two faults, the second on the restart the first causes: `first + then`
THEN = " + "


def expected(spec: str) -> dict:
    """What the import should find for an injected spec; for `first + then`, the first
    failure, and under `then` the restart's own failure."""
    from torchchaos.scenario.spec import parse_fault_spec

    if THEN in spec:
        first, then = spec.split(THEN)
        return {**expected(first), "then": expected(then)}
    fault = parse_fault_spec(spec)
    params, trig = fault.params, fault.trigger
    kind = {"raise": "exception"}.get(fault.kind, fault.kind)
    if fault.kind == "dataloader" and params.get("mode") == "stop":
        kind = "hang"  # a stopped worker: the rank waits for its batch, the others for it
    if fault.kind == "kill":
        kind = {"SIGTERM": "preempt", "SIGSEGV": "crash"}.get(str(params.get("signal")), "kill")
        if fault.target_type == "node":
            kind = "node"
    elif fault.kind == "storage":
        kind = {"torn": "torn_write", "lose_unsynced": "power_loss"}[str(params["mode"])]
    phase = {"checkpoint_save": "mid_save", "checkpoint_load": "load"}.get(
        trig.phase or "", "between_saves")
    # a torn write (via the agent) kills its rank's whole node, a power loss every process:
    # the rank it fired in names no rank that died alone
    alone = fault.target_type == "rank" and fault.kind != "storage"
    return {"kind": kind, "rank": int(fault.target) if alone else None,
            "node": int(fault.target) if fault.target_type == "node" else None,
            "phase": phase, "step": trig.step}


def make(corpus: Path, names: list[str]) -> None:
    from torchchaos import env
    from torchchaos.engine import run_scenario

    # exec'd ranks under torchrun's own subprocess mode, as a user's job runs: a forked
    # rank leaves by os._exit, faster than an exec'd one tears down, and a peer's echo
    # then dies before torchrun's next poll as often as the rank it echoes (bundled/10:
    # torchrun named only the peer's exit 1, not rank 1's SIGSEGV)
    os.environ[env.COLD_START] = "1"
    from torchchaos.explore import battery
    from torchchaos.scenario.model import Scenario

    cache = corpus / "cache"
    for name in names:
        script, args = SCRIPTS[name]
        base = Scenario.build(str(script), args=args, hang_timeout=6.0,
                              links=LINKS.get(name, []))
        entries = battery.plan(base, cache, lambda m: None)
        mid = next(int(e.fault.split("step=")[1].split(",")[0]) for e in entries
                   if e.fault.startswith("kill:rank=0,step="))
        in_save = next(e.fault.split(",", 1)[1] for e in entries
                       if e.fault.startswith("kill:rank=0,phase=checkpoint_save"))
        specs = [e.fault for e in entries] + [
            f"hang:rank=1,step={mid},mode=stop", f"hang:rank=1,step={mid},mode=collective",
            f"kill:rank=1,step={mid},signal=SIGSEGV"] + field_kinds(mid, name) + \
            save_and_load_kinds(mid, in_save)
        for i, spec in enumerate(specs):
            case = corpus / name / f"{i:02d}"
            if (case / "injected.json").exists():
                continue
            print(f"[{name} {i}] {spec}", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                scenario = Scenario.build(str(script), faults=spec.split(THEN), args=args + (
                    LOADER if spec.startswith("dataloader") else []), hang_timeout=6.0,
                    links=LINKS.get(name, []))
                report = run_scenario(scenario, Path(tmp) / "run", cache)
                keep(Path(tmp) / "run" / "chaos", case / "left")
                fired = [f.get("fired_step") for f in report.faults]
            (case / "injected.json").write_text(json.dumps(
                {"spec": spec, "fired_step": fired[0] if fired else None,
                 "verdict": report.verdict, **expected(spec)}, indent=1))


# The bundled target's option that gives each rank DataLoader workers to fault
LOADER = ["--loader-workers", "2"]


def field_kinds(mid: int, name: str) -> list[str]:
    """The kinds behind field incidents (issue 39): OOM kills and failed allocations, an
    exception, native crashes, a hang holding the GIL, a communicator abort, and on the
    bundled target (the script with DataLoader workers) a worker killed and one stopped."""
    specs = [f"oom:rank=1,step={mid}", f"oom:rank=1,step={mid},mode=raise",
             f"raise:rank=1,step={mid}", f"crash:rank=0,step={mid},signal=abrt",
             f"crash:rank=1,step={mid},signal=bus", f"hang:rank=1,step={mid},mode=gil",
             f"abort:rank=1,step={mid}"]
    if name == "bundled":
        specs += [f"dataloader:rank=1,step={mid},mode=kill",
                  f"dataloader:rank=1,step={mid},mode=stop"]
    return specs


def save_and_load_kinds(mid: int, in_save: str) -> list[str]:
    """Exceptions where a checkpoint is written or read: one out of the writer's save (the
    place of the battery's first kill inside a save), and one out of the restart's first
    read after rank 1 was killed (an exception at load: it needs a restart to load)."""
    return [f"raise:rank=0,{in_save}",
            f"kill:rank=1,step={mid}{THEN}raise:rank=0,phase=checkpoint_load,event=1"]


def keep(run_dir: Path, dest: Path) -> None:
    """What the job and its launcher left: logs, error files, stacks, checkpoints."""
    chaos = run_dir / "_chaos"
    for log in sorted((chaos / "logs").glob("*.log")):
        _copy(log, dest / "logs" / log.name)
    for stack in sorted((chaos / "stacks").glob("*.txt")):
        if stack.stat().st_size:
            _copy(stack, dest / "stacks" / stack.name)
    for error in sorted((chaos / "tmp").glob("torchelastic_*/*/attempt_*/*/error.json")):
        rel = error.relative_to(chaos / "tmp")
        _copy(error, dest / "errors" / Path(*rel.parts[2:]))
    for folder in sorted(p for p in run_dir.iterdir() if p.is_dir() and p.name != "_chaos"
                         and not p.is_symlink()):
        shutil.copytree(folder, dest / folder.name, dirs_exist_ok=True)
    # what a script saved in its working directory itself (the DDP tutorial's snapshot.pt)
    for file in sorted(p for p in run_dir.iterdir() if p.is_file() and not p.is_symlink()):
        _copy(file, dest / "workdir" / file.name)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def score(corpus: Path) -> int:
    from torchchaos.errors import UsageError
    from torchchaos.incident.attribute import attribute
    from torchchaos.incident.gather import gather

    rows, exact, parts = [], 0, {"kind": 0, "rank": 0, "phase": 0, "wrong": 0, "by_rule": 0}
    for case in sorted(corpus.glob("*/[0-9][0-9]")):
        want = json.loads((case / "injected.json").read_text())
        want.update(expected(want["spec"]))  # today's expectation, not the one made with it
        try:
            gathered = gather([case / "left"])
            found = attribute(gathered.observations, gathered.sources)
        except UsageError as exc:
            rows.append((case, want, None, f"error: {exc}"))
            continue
        f = found.finding
        rank_ok = f.rank == want["rank"] if want["rank"] is not None else \
            (f.role == "node" or f.rank is None)
        step = want.get("fired_step") or want.get("step")
        lo, hi = f.step_window
        window = "-" if step is None else "unknown" if lo is None else \
            "yes" if lo <= step and (hi is None or step <= hi) else f"no ({lo}-{hi})"
        ok = f.kind == want["kind"] and rank_ok and f.phase == want["phase"]
        again, then = found.restart_failure, want.get("then")
        then_wrong = False
        if then is not None:  # the restart's own failure must be told too, rank and phase
            then_ok = again is not None and (again.rank, again.phase) == (
                then["rank"], then["phase"])
            # told wrong: a rank, or a phase it did not say it could not tell
            then_wrong = again is not None and again.rank is not None and (
                again.rank != then["rank"] or again.phase not in ("unknown", then["phase"]))
            ok = ok and then_ok
        exact += ok
        parts["by_rule"] += ok and not f.phase_seen  # a prior that happened to be right
        parts["kind"] += f.kind == want["kind"]
        parts["rank"] += rank_ok
        parts["phase"] += f.phase == want["phase"]
        # wrong: a field the import told (not unknown, not among the kinds it said the
        # artefacts fit, a phase it saw rather than placed by rule) that is not what was
        # done; a miss with nothing told wrong is one it said it could not tell
        told_wrong = then_wrong or f.kind not in ("unknown", want["kind"]) and \
            want["kind"] not in f.alternatives or f.rank is not None and not rank_ok or \
            f.phase_seen and f.phase not in ("unknown", want["phase"])
        verdict = "exact" if ok else "WRONG" if told_wrong else "said unknown"
        parts["wrong"] += verdict == "WRONG"
        rows.append((case, want, found, f"{verdict}; step in window: {window}"))
    print(f"{'case':<14} {'injected':<62} {'imported (kind rank phase)':<36} result")
    for case, want, found, result in rows:
        f = found.finding if found else None
        got = "-" if f is None else f"{f.kind} {f.rank if f.rank is not None else f.role}" \
            f" {f.phase}{'' if f is None or f.phase_seen else '*'}"
        if found is not None and found.restart_failure is not None:
            again = found.restart_failure
            got += f", then {again.rank} {again.phase}"
        print(f"{case.parent.name + '/' + case.name:<14} {want['spec'][:62]:<62} {got:<36}"
              f" {result}")
    print(f"exact on kind + rank + phase: {exact}/{len(rows)}"
          " (* = phase placed by rule, not seen)")
    print(f"of them, phase seen: {exact - parts['by_rule']}; placed by rule:"
          f" {parts['by_rule']}")
    print(f"right: kind {parts['kind']}, rank (or node) {parts['rank']}, phase {parts['phase']}"
          f" of {len(rows)}; wrong guesses: {parts['wrong']}")
    return 0


# The hang bound of the replays: roomy, since start-up under load is not a hang (issue 43)
REPLAY_HANG_BOUND = 20.0

# A planted bug of targets/ddp_lm.py per phase, and the check it breaks: the replay of an
# incident on the buggy variant must fail that check.
PLANTED = {"mid_save": (["--bug", "write_in_place"], "atomic_recovery"),
           "between_saves": (["--bug", "replay_data"], "deterministic_resume")}


def replay(corpus: Path, planted: bool, only: list[str]) -> int:
    """Import each case on the script it ran, replay it, say whether the signature was
    reproduced; with `planted`, replay it on the bundled target's bug for its phase too."""
    import dataclasses

    from torchchaos.engine import run_scenario
    from torchchaos.incident.importing import import_artefacts, judge_replay
    from torchchaos.scenario.model import Scenario

    cache = corpus / "cache"
    rows, reproduced = [], 0
    for case in sorted(corpus.glob("*/[0-9][0-9]")):
        name = case.parent.name
        if only and not any(fnmatch.fnmatch(f"{name}/{case.name}", o) for o in only):
            continue
        script, args = SCRIPTS[name]
        spec = json.loads((case / "injected.json").read_text())["spec"]
        args = args + (LOADER if spec.startswith("dataloader") else [])
        base = Scenario.build(str(script), args=args, hang_timeout=REPLAY_HANG_BOUND,
                              links=LINKS.get(name, []))
        imported = import_artefacts([case / "left"], base, cache, lambda m: None)
        incident = imported.file.incident
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "replay"
            scenario = dataclasses.replace(imported.file.scenario,
                                           hang_timeout=REPLAY_HANG_BOUND)
            report = run_scenario(scenario, out, cache)
            line, _page = judge_replay(incident, out, case.name, report.verdict,
                                       report.failing())
        ok = line.startswith("incident reproduced")
        reproduced += ok
        bug = "-"
        phase = imported.incident.finding.phase
        if planted and name == "bundled" and phase in PLANTED:
            # imported again onto the buggy script, as its owner would: its own reference
            # run places the faults (a save written in place has other file events)
            flags, check = PLANTED[phase]
            buggy_base = dataclasses.replace(base, args=[*args, *flags])
            again = import_artefacts([case / "left"], buggy_base, cache, lambda m: None)
            buggy = dataclasses.replace(again.file.scenario, hang_timeout=REPLAY_HANG_BOUND)
            with tempfile.TemporaryDirectory() as tmp:
                bad = run_scenario(buggy, Path(tmp) / "bug", cache)
            bug = f"{' '.join(flags[1:])}: {bad.verdict}" + (
                f" ({check} failed)" if bad.checks.get(check, {}).get("ok") is False
                else f" ({check} did not fail)")
        specs = ", ".join(f.text for f in scenario.faults)
        rows.append((f"{name}/{case.name}", specs, report.verdict, line, bug))
        print(f"{name}/{case.name}: {specs} -> {report.verdict}; {line}; bug: {bug}",
              flush=True)
    print(f"reproduced: {reproduced}/{len(rows)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--make", type=Path, help="run the jobs and keep their artefacts here")
    parser.add_argument("--score", type=Path, help="import every kept case and compare")
    parser.add_argument("--replay", type=Path, help="import each kept case, replay it on its"
                        " script, and say whether the replay reproduced it")
    parser.add_argument("--planted", action="store_true", help="with --replay: replay the"
                        " bundled target's incidents on its planted bug for their phase too")
    parser.add_argument("--only", action="append", metavar="GLOB",
                        help="with --replay: only these cases (bundled/05, plain_ddp/*)")
    parser.add_argument("--scripts", nargs="+", choices=sorted(SCRIPTS), default=None,
                        help="with --make: only these scripts (default: all)")
    ns = parser.parse_args()
    if ns.make:
        make(ns.make, ns.scripts or DEFAULT_SCRIPTS)
    if ns.score:
        score(ns.score)
    if ns.replay:
        replay(ns.replay, ns.planted, ns.only or [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
