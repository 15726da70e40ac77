"""The `torchchaos` command line.

Exit status: 0 every check held; 1 a check failed (the target has a bug);
2 the harness could not judge (bad arguments, the target fails without
faults, a harness error), always with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchchaos.cli import cluster, detectors, docker, nodes
from torchchaos.cli.incident import cmd_incident
from torchchaos.cli.output import print_report, progress_printer
from torchchaos.cli.parser import build_parser
from torchchaos.errors import CannotJudge, ChaosError, UsageError
from torchchaos.faults.registry import get_kind
from torchchaos.harness.reference import check_cache_dir, default_cache_dir
from torchchaos.host import leftovers, owners

if TYPE_CHECKING:
    from torchchaos.explore.rows import Entry
    from torchchaos.progress import Progress
    from torchchaos.scenario.model import Scenario

def _scenario(ns: argparse.Namespace, script: str, args: list[str], faults: list[str]) -> Any:
    from torchchaos.scenario.model import Scenario

    args = args[1:] if args[:1] == ["--"] else args
    scenario = Scenario.build(
        script, faults=faults, args=args, nproc=ns.nproc, nodes=ns.nodes, network=ns.network,
        min_nodes=ns.min_nodes, checks=ns.check,
        max_lost_steps=ns.max_lost_steps, max_lost_seconds=ns.max_lost_seconds,
        max_detect_steps=ns.max_detect_steps, hang_timeout=ns.hang_timeout, seed=ns.seed,
        timeout=ns.timeout, max_restarts=ns.max_restarts, max_relaunches=ns.max_relaunches,
        reference_runs=ns.reference_runs, mtbf_hours=ns.mtbf,
        full_fingerprints=ns.full_fingerprints, links=ns.link,
    )
    scenario.check_machine(ns.force)
    return scenario


def _dirs(ns: argparse.Namespace) -> tuple[Path, Path]:
    """--out and --cache-dir, refused here (one line, exit 2) when they hold data or cannot
    be written: before any process starts and before anything (replay.yaml) is written."""
    from torchchaos.engine import check_out_dir

    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    out = (ns.out or Path("torchchaos-runs") / stamp).resolve()
    cache = (ns.cache_dir or default_cache_dir()).resolve()
    check_cache_dir(cache)
    check_out_dir(out)
    _check_junitxml(getattr(ns, "junitxml", None))
    return out, cache


def _check_junitxml(path: Path | None) -> None:
    """The JUnit file is written at the end of a sweep: refuse it now if it cannot be."""
    from torchchaos.rundir.folders import unwritable

    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"--junitxml {path} is a folder; name a file")
    why = unwritable(path.resolve().parent)
    if why:
        raise UsageError(f"--junitxml {path}: {why}; choose another")


def cmd_run(ns: argparse.Namespace) -> int:
    from torchchaos.engine import run_scenario

    scenario = _scenario(ns, ns.script, ns.args, ns.fault)
    out, cache = _dirs(ns)
    report = run_scenario(scenario, out, cache, progress_printer(ns.quiet))
    return print_report(report, out)


def _battery_scenario(ns: argparse.Namespace) -> Scenario:
    """The scenario every run of a battery shares (no fault yet); with no SCRIPT, the
    bundled reference target."""
    from torchchaos.explore import battery

    if ns.script is None:
        script, args = str(battery.BUNDLED_TARGET), battery.BUNDLED_ARGS
    else:
        script, args = ns.script, ns.args
    return _scenario(ns, script, args, [])


def _battery_base(ns: argparse.Namespace) -> tuple[Scenario, Path, Path]:
    """The scenario every run of a battery shares, and its folders."""
    from torchchaos.explore.shards import from_environment

    if getattr(ns, "shard", None) == "auto":  # before any run: a missing variable is bad input
        ns.shard = from_environment()
    base = _battery_scenario(ns)
    return (base, *_dirs(ns))


def _run_sweep(ns: argparse.Namespace, command: str, entries: list[Entry], base: Scenario,
               out: Path, cache: Path, extra: dict[str, object] | None = None) -> list[int]:
    """Run the planned entries (this shard's, with --shard); returns their numbers."""
    from torchchaos.explore import runs

    numbers = ns.shard.numbers(len(entries)) if ns.shard else list(range(1, len(entries) + 1))
    if ns.shard:
        progress_printer(ns.quiet)(f"shard {ns.shard}: runs {', '.join(map(str, numbers))}"
                                   f" of {len(entries)}")
    try:
        runs.run_entries(entries, base, out, cache, progress_printer(ns.quiet),
                          title=runs.TITLES[command], jobs=ns.jobs, numbers=numbers,
                          exitfirst=getattr(ns, "exitfirst", False))
    except runs.SweepInterrupted as stop:  # what finished is shown, then exit 130
        runs.finish(command, entries, stop.finished, out, ns.junitxml, f"{stop}")
        raise
    if ns.shard:
        from torchchaos.explore.shards import write_manifest

        write_manifest(out, command, runs.TITLES[command], ns.shard, entries, extra)
    return numbers


def _merge_searches(searches: list[tuple[Path, dict]], out: Path) -> int:
    """Every search shard's result, and the smallest failing schedule of all (its replay
    file copied to OUT/minimal.yaml); exit 1 when one failed, else 0."""
    import shutil

    from torchchaos.explore.search import describe

    failing = []
    for directory, manifest in searches:
        found, shard = manifest["runs"], "/".join(map(str, manifest["shard"]))
        minimal = found["minimal"]
        print(f"shard {shard}: {found['runs']} run(s), " + (
            f"minimal failing schedule ({len(minimal)} fault(s)): {describe(minimal)}"
            if minimal is not None else "no failing schedule") + f"  ({directory})")
        for schedule in found["flaky"]:
            print(f"  flaky (fails only some of the time): {describe(schedule)}")
        if minimal is not None:
            failing.append((len(minimal), manifest["shard"][0], minimal, directory))
    total = sum(m["runs"]["runs"] for _, m in searches)
    if not failing:
        print(f"no failing schedule in {total} run(s) of {len(searches)} shard(s)")
        return 0
    _, index, minimal, directory = min(failing, key=lambda f: (f[0], f[1]))
    path = shutil.copy2(directory / "minimal.yaml", out / "minimal.yaml")
    print(f"minimal failing schedule ({len(minimal)} fault(s)): {describe(minimal)}"
          f" (shard {index}/{len(searches)})")
    print(f"replay it: torchchaos replay {path}")
    print(f"{total} run(s) in {len(searches)} shard(s)")
    return 1


def cmd_battery(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import battery, runs
    from torchchaos.explore.keywords import Keywords

    keywords = Keywords(ns.keyword) if ns.keyword is not None else None
    if ns.list:
        return _list_battery(ns, keywords)
    base, out, cache = _battery_base(ns)
    progress = progress_printer(ns.quiet)
    if keywords is not None:  # before anything runs, as far as it is known without a run
        rows = [entry for entry, _ in _battery_rows(base, cache, lambda _message: None)[0]]
        _refuse_no_selection(keywords, rows)
    entries = battery.plan(base, cache, progress)
    if keywords is not None:  # placed now: the selection is exact
        planned = entries
        entries = [entry for entry in planned if keywords.selects(entry.name)]
        _refuse_no_selection(keywords, planned)
        progress(f"-k {keywords.text!r}: {len(entries)} of {len(planned)} row(s)")
    prepare_out_dir(out)
    try:
        numbers = _run_sweep(ns, "battery", entries, base, out, cache)
    except runs.SweepStopped as stop:  # -x: what finished is shown, the exit as theirs
        return runs.finish("battery", entries, stop.finished, out, ns.junitxml, f"{stop}")
    return runs.finish("battery", entries, numbers, out, ns.junitxml)


def _battery_rows(base: Scenario, cache: Path, progress: Any) -> tuple[list, bool]:
    """The battery's rows as far as they are known without running anything, each with
    the condition under which the job has it (""), and whether they are placed: from
    the reference run where the cache holds it, else outlined (`?` where it places)."""
    from torchchaos.explore import battery

    history = battery.cached_history(base, cache, progress)
    if history is None:
        return battery.outline(base, progress), False
    return [(entry, "") for entry in battery.plan_from(history, base, progress)], True


def _refuse_no_selection(keywords: Any, entries: list[Entry]) -> None:
    if all(keywords.selects(entry.name) is False for entry in entries):
        raise UsageError(f"-k {keywords.text!r} selects none of the battery's rows"
                         " (`torchchaos battery --list` names them)")


def _list_battery(ns: argparse.Namespace, keywords: Any) -> int:
    """--list: each row's name and fault, as the table and `--fault` name them; runs
    nothing and writes nothing (not even the cache folder)."""
    import textwrap

    base = _battery_scenario(ns)
    cache = (ns.cache_dir or default_cache_dir()).resolve()
    rows, placed = _battery_rows(base, cache, progress_printer(ns.quiet))
    chosen = [(entry, condition, keywords.selects(entry.name) if keywords else True)
              for entry, condition in rows]
    if keywords is not None:
        _refuse_no_selection(keywords, [entry for entry, _ in rows])
    chosen = [row for row in chosen if row[2] is not False]
    if placed:
        head = f"the battery: {len(rows)} row(s), placed from the reference run cached in {cache}"
    else:
        head = (f"the battery, outlined: the reference run is not cached in {cache}, so ?"
                " stands for what it places (the step between two checkpoints, the rank that"
                " writes checkpoints, a file event of its 2nd save, the folder that save"
                " writes in); a row with a condition runs only where the job meets it")
    print("\n".join(textwrap.wrap(head, 100, break_on_hyphens=False)))
    if keywords is not None:
        maybe = sum(1 for row in chosen if row[2] is None)
        print(f"-k {keywords.text!r} selects {len(chosen) - maybe} of {len(rows)}"
              + (f" (and maybe {maybe} more, once placed)" if maybe else ""))
    for number, (entry, condition, selects) in enumerate(chosen, start=1):
        print(f"{number:02d}  {entry.name}" if placed else f"    {entry.name}")
        print(f"      {entry.fault}")
        if condition:
            print(f"      ({condition})")
        if selects is None:
            print("      (-k names a number: whether it selects this row waits for the"
                  " reference run)")
    return 0


def cmd_merge(ns: argparse.Namespace) -> int:
    from torchchaos.engine import check_out_dir
    from torchchaos.explore import runs, shards

    check_out_dir(ns.out)
    if ns.fail_on and shards.command_of(ns.dirs[0]) != "campaign":
        raise UsageError("merge --fail-on is for a campaign's shards: the others fail on a"
                         " failed check already")
    merged = shards.merge(ns.dirs, ns.out)  # checks every shard whole, then writes
    if merged.command == "search":
        return _merge_searches(merged.searches, ns.out)
    numbers = list(range(1, len(merged.entries) + 1))
    summary = ""
    if merged.command == "crashstates":
        from torchchaos.explore.crash import sweep as crashsweep

        groups = crashsweep.merged_groups(ns.out / "record", merged.extra, merged.details)
        ran = sum(len(d["recoveries"]) for d in merged.details)
        summary = crashsweep.merged_summary(merged.entries, merged.extra, groups,
                                            len(merged.details), ran)
        return runs.finish(merged.command, merged.entries, numbers, ns.out, ns.junitxml,
                             summary, crashsweep.report_rows(merged.entries, numbers, groups))
    if merged.command == "crashpoints":
        failed = sum(1 for e in merged.entries if e.report and e.report.verdict == "fail")
        summary = (f"{len(merged.entries)} of {merged.extra.get('total')} points run,"
                   f" {failed} broke the protocol")
    return runs.finish(merged.command, merged.entries, numbers, ns.out, ns.junitxml,
                         summary, fail_on=ns.fail_on)


def cmd_doctor(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import doctor

    base, out, cache = _battery_base(ns)
    prepare_out_dir(out)
    findings = doctor.examine(base, cache, out, progress_printer(ns.quiet))
    print(f"torchchaos doctor: {' '.join([base.script, *base.args])}"
          f" ({base.nproc} rank(s) x {base.nodes} node(s))")
    print(doctor.table(findings))
    print(f"runs: {out}")
    return doctor.exit_code(findings)


def cmd_crashpoints(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import runs
    from torchchaos.explore.crash import points as crashpoints
    from torchchaos.explore.crash import sweep as crashsweep

    base, out, cache = _battery_base(ns)
    progress = progress_printer(ns.quiet)
    modes = ns.mode or list(crashpoints.MODES)
    if ns.record_only and ns.per_point:
        raise UsageError("--record-only makes the recording crash states are judged from;"
                         " --per-point records nothing")
    if not ns.per_point:
        crashpoints.check_modes(modes)
        if ns.jobs > 1:
            progress("--jobs applies to --per-point: recoveries from a recording run one at"
                     " a time")
        if ns.record_only:
            save = _one_save(ns, "--record-only", progress)
            entry = crashsweep.record_only(base, cache, progress, save)
            print(f"recording of save {save}: {entry}; pass --cache-dir {cache} to the"
                  " shards")
            return 0
        if ns.save is not None or ns.shard:
            return _crash_states(ns, base, out, cache, progress, modes,
                                 _one_save(ns, "--shard", progress), ns.junitxml)
        return _crash_states_of_each_shape(ns, base, out, cache, progress, modes)
    ns.save = _one_save(ns, "--per-point", progress)
    found = crashpoints.plan(base, cache, progress, ns.save, modes,
                             50 if ns.cap is None else ns.cap, from_snapshot=not ns.from_scratch)
    prepare_out_dir(out)
    entries = crashpoints.entries(found, ns.save)
    total = found.total
    base.stop_after = ns.steps_after_resume or None
    progress(f"{len(entries)} of {total} crash point(s) in save {ns.save}")
    started = time.monotonic()
    numbers = _run_sweep(ns, "crashpoints", entries, base, out, cache, {"total": total})
    minutes = (time.monotonic() - started) / 60
    ran = [entries[n - 1] for n in numbers]
    failed = sum(1 for e in ran if e.report and e.report.verdict == "fail")
    return runs.finish("crashpoints", entries, numbers, out, ns.junitxml,
                         f"{len(ran)} of {total} points run, {failed} broke the protocol;"
                         f" {len(ran) / minutes:.1f} points per minute")


def _one_save(ns: argparse.Namespace, option: str, progress: Progress) -> int:
    """--save, or save 2 where a mode that takes one save was asked for without it."""
    if ns.save is None:
        progress(f"{option} covers one save: save 2, the first with a checkpoint to fall"
                 " back to (pass --save K for another)")
        return 2
    return ns.save


def _crash_states_of_each_shape(ns: argparse.Namespace, base: Scenario, out: Path,
                                cache: Path, progress: Progress, modes: list[str]) -> int:
    """Without --save: the crash states of one save of each shape the reference shows
    (torchchaos.explore.crash.shapes), each in OUT/save-K where there are several."""
    from torchchaos.explore.crash import shapes
    from torchchaos.harness.reference import get_reference

    chosen, notes = shapes.choose(get_reference(base, cache, progress).history())
    if not chosen:  # no 2nd save: the sweep of save 2 says so in its own words
        chosen = [shapes.ChosenSave(2, "the first with a checkpoint to fall back to")]
    for save in chosen:
        print(f"save {save.save}: {save.why}", flush=True)
    for note in notes:
        print(note, flush=True)
    codes = []
    for save in chosen:
        where = out if len(chosen) == 1 else out / f"save-{save.save}"
        junitxml = ns.junitxml if len(chosen) == 1 or ns.junitxml is None else (
            ns.junitxml.with_name(f"{ns.junitxml.stem}-save{save.save}{ns.junitxml.suffix}"))
        codes.append(_crash_states(ns, base, where, cache, progress, modes, save.save,
                                   junitxml))
    if len(chosen) > 1:
        print(f"saves {', '.join(str(c.save) for c in chosen)}: pages in"
              f" {', '.join(str(out / f'save-{c.save}') for c in chosen)}")
    return max(codes)


def _crash_states(ns: argparse.Namespace, base: Scenario, out: Path, cache: Path,
                  progress: Progress, modes: list[str], save: int,
                  junitxml: Path | None) -> int:
    """Every crash state of save `save` judged from its recording: the table and pages."""
    from torchchaos.explore import runs
    from torchchaos.explore.crash import sweep as crashsweep

    try:
        result = crashsweep.sweep(base, out, cache, progress, save, modes, ns.cap,
                                  ns.steps_after_resume or 3, ns.shard)
    except crashsweep.Interrupted as stop:  # what was judged is shown, then exit 130
        runs.finish("crashstates", stop.result.entries, stop.judged, out, junitxml,
                      f"save {save}: {stop}",
                      crashsweep.report_rows(stop.result.entries, stop.judged,
                                             stop.result.groups()))
        raise
    if ns.shard:
        from torchchaos.explore.runs import TITLES
        from torchchaos.explore.shards import CRASH_STATES, write_manifest

        write_manifest(out, CRASH_STATES, TITLES[CRASH_STATES], ns.shard, result.entries,
                       crashsweep.shard_extra(base, result, save, modes, ns.cap),
                       crashsweep.shard_details(result))
    return runs.finish("crashstates", result.entries, result.numbers, out, junitxml,
                         crashsweep.summary(result, save),
                         crashsweep.report_rows(result.entries, result.numbers,
                                                result.groups()))


def cmd_campaign(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import battery, campaign, runs
    if ns.script is None:
        ns.script, ns.args = str(battery.BUNDLED_TARGET), [*battery.BUNDLED_ARGS,
                                                           "--no-sdc-defences"]
    base, out, cache = _battery_base(ns)
    progress = progress_printer(ns.quiet)
    entries = campaign.plan(base, cache, progress, ns.runs, ns.seed,
                            ns.tensor or list(campaign.TENSORS),
                            ns.bit or list(get_kind("bitflip").choices["bit"]))
    prepare_out_dir(out)
    numbers = _run_sweep(ns, "campaign", entries, base, out, cache)
    return runs.finish("campaign", entries, numbers, out, ns.junitxml, fail_on=ns.fail_on)


def cmd_replay(ns: argparse.Namespace) -> int:
    from torchchaos.engine import run_scenario
    from torchchaos.scenario import files as scenario_file

    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    loaded = scenario_file.load(ns.file, ns.script, args if ns.script else None)
    out, cache = _dirs(ns)
    report = run_scenario(loaded.scenario, out, cache, progress_printer(ns.quiet))
    expect = loaded.expect or scenario_file.Expectation()
    mismatches = expect.mismatches(report)
    verdict = f"expected {expect.verdict}" + (" and got it" if not mismatches
                                              else f", but: {'; '.join(mismatches)}")
    code = print_report(report, out, f"replay of {ns.file}: {verdict}")
    if loaded.incident is not None:
        from torchchaos.incident.importing import judge_replay

        line, page = judge_replay(loaded.incident, out, loaded.name or str(ns.file),
                                  report.verdict, report.failing())
        print(line)
        print(f"postmortem: {page}")
    return code


def _save_minimal(base: Scenario, schedule: list[str], out: Path, runs: Any) -> Path:
    """OUT/minimal.yaml: the base scenario with the minimal schedule, expected to fail
    the way its last run failed."""
    import dataclasses

    from torchchaos.scenario import files as scenario_file
    from torchchaos.scenario.spec import parse_fault_spec

    scenario = dataclasses.replace(base, faults=[parse_fault_spec(s) for s in schedule])
    minimal = scenario_file.for_run(scenario, scenario_file.resolve(scenario),
                                    runs.last_run_of(schedule))
    minimal.name = f"minimal failing schedule ({len(schedule)} fault(s))"
    return minimal.save(out / "minimal.yaml")


def _print_search_end(result: Any, runs: Any, out: Path, base: Scenario) -> int:
    """What a search or shrink found (a `torchchaos.explore.search.SearchResult`); exit 1 with a
    failing schedule, else 0."""
    from torchchaos.explore.search import describe

    found, minimal = result.found, result.minimal
    for schedule in result.flaky:
        print(f"flaky (fails only some of the time): {describe(schedule)}")
    if minimal is None:
        print(f"no failing schedule in {len(runs.reports)} run(s); runs: {out}")
        return 0
    if found is not None and found != minimal:
        print(f"first failure, shrunk by Hypothesis: {describe(found)}")
    print(f"minimal failing schedule ({len(minimal)} fault(s)): {describe(minimal)}")
    if result.budget_spent:
        print("  (the run budget ran out while shrinking: a fault of it may still be"
              " droppable; raise --max-runs)")
    report = runs.last_run_of(minimal)
    if report is not None:
        print(report.table())
    path = _save_minimal(base, minimal, out, runs)
    print(f"replay it: torchchaos replay {path}")
    print(f"{len(runs.reports)} run(s); runs: {out}")
    return 1


def cmd_search(ns: argparse.Namespace) -> int:
    from hypothesis.configuration import set_hypothesis_home_dir

    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import search, shards, strategies
    from torchchaos.explore.schedule_runs import ScheduleRuns
    from torchchaos.harness.reference import get_reference

    base, out, cache = _battery_base(ns)
    progress = progress_printer(ns.quiet)
    history = get_reference(base, cache, progress).history()
    shape = strategies.JobShape.of(history, base.nodes, ns.every_step)
    try:
        fault = strategies.faults(shape, ns.kind or ("kill", "preempt", "save_kill"))
    except ValueError as exc:
        raise UsageError(f"--kind: {exc}") from None
    prepare_out_dir(out)
    # Hypothesis keeps a cache in ./.hypothesis; the harness writes only in its run dirs.
    set_hypothesis_home_dir(out / "_hypothesis")
    runs = ScheduleRuns(base, out, cache, progress)
    trials = search.Trials(runs, ns.repeats or 1, ns.max_runs, progress)
    progress(f"searching schedules of up to {ns.max_faults} fault(s) at steps {shape.steps}")
    seed, examples = ns.seed, ns.examples
    if ns.shard:  # its own seed, its share of the examples
        seed, examples = shards.search_seed(ns.seed, ns.shard), -(-ns.examples // ns.shard.count)
        progress(f"shard {ns.shard}: seed {seed}, {examples} example(s)")
    result = search.search(trials, strategies.schedules(fault, ns.max_faults), seed, examples,
                           ns.shrink_runs)
    code = _print_search_end(result, runs, out, base)
    if ns.shard:
        plan = {k: getattr(ns, k) for k in ("seed", "examples", "kind", "max_faults",
                                            "every_step", "repeats", "max_runs",
                                            "shrink_runs")}
        shards.write_search_manifest(out, ns.shard, plan, {
            "runs": len(runs.reports), "found": result.found, "minimal": result.minimal,
            "flaky": result.flaky, "budget_spent": result.budget_spent})
    return code


def cmd_shrink(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import search
    from torchchaos.explore.schedule_runs import ScheduleRuns
    from torchchaos.scenario import files as scenario_file

    loaded = scenario_file.load(ns.file)
    base = loaded.scenario
    schedule = [f.text for f in base.faults]
    if not schedule:
        raise UsageError(f"{ns.file}: no faults to shrink")
    out, cache = _dirs(ns)
    prepare_out_dir(out)
    progress = progress_printer(ns.quiet)
    runs = ScheduleRuns(base, out, cache, progress)
    trials = search.Trials(runs, ns.repeats or 1, ns.max_runs, progress)
    first = trials.judge(schedule)
    if first != search.FAIL:
        raise CannotJudge(f"{ns.file}: its schedule does not fail to begin with"
                          f" ({first} in {trials.runs} run(s)); nothing to shrink")
    minimal = search.ddmin(schedule, trials.fails)
    result = search.SearchResult(None, minimal, trials.runs, trials.flaky, trials.budget_spent)
    return _print_search_end(result, runs, out, base)


def cmd_export(ns: argparse.Namespace) -> int:
    from torchchaos.scenario import chaosmesh, jobset
    from torchchaos.scenario import files as scenario_file

    loaded = scenario_file.load(ns.file)
    if ns.jobset is not None:
        from torchchaos.engine import prepare_out_dir

        prepare_out_dir(ns.jobset)  # a new folder: no file of the user's is overwritten
    node_label = ns.node_label
    if ns.jobset is not None and node_label == chaosmesh.DEFAULT_NODE_LABEL:
        node_label = jobset.NODE_LABEL  # what the JobSet's pods carry
    options = chaosmesh.Options(
        namespace=ns.namespace, node_label=node_label, volume_path=ns.volume_path,
        seconds_per_step=ns.seconds_per_step, pod_per_rank=ns.pod_per_rank,
        step_times=chaosmesh.step_times(ns.run_dir) if ns.run_dir else None,
        name=ns.name or chaosmesh.name_of(ns.file))
    result = chaosmesh.export(loaded, options)
    text = chaosmesh.render(result, ns.file, options, ns.bare)
    if ns.jobset is not None:
        job = jobset.JobOptions(options.name, ns.namespace, ns.image, ns.claim)
        for path in jobset.write(loaded.scenario, job, result.kept, text, ns.jobset):
            print(f"wrote {path}", file=sys.stderr)
    if ns.out is None:
        sys.stdout.write(text)
    else:
        try:
            ns.out.write_text(text)
        except OSError as exc:
            raise UsageError(f"cannot write {ns.out}: {exc.strerror or exc}") from None
    for line in result.not_exported:
        print(f"not exported: {line}", file=sys.stderr)
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    from torchchaos.report.report_file import Report

    path = ns.out / "report.json"
    if not path.is_file():
        raise UsageError(f"no report.json in {ns.out}")
    try:
        report = Report.read(path)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{path} is not a torchchaos report: {exc}") from None
    print(report.table())
    from torchchaos.report import html_report

    if html_report.run_dir_of(report, ns.out) is not None:
        print(f"report: {html_report.write_run(report, ns.out)}")
    else:
        print("the run directory is gone: report.html not rewritten")
    if report.verdict == "error":
        print(f"torchchaos: error: {report.reason}", file=sys.stderr)
    return report.exit_code()


def cmd_suite(pytest_args: list[str]) -> int:
    """The suites are pytest modules: `pytest --pyargs torchchaos.suites ARGS`, with pytest's exit
    status (0 all passed, 1 a test failed, 4 bad options, 5 nothing selected)."""
    import pytest

    return int(pytest.main(["--pyargs", "torchchaos.suites", *pytest_args]))


def cmd_clean(ns: argparse.Namespace) -> int:
    found = leftovers.inventory()
    who = owners.owners()  # read after listing: a live run is registered before it exists
    stale = leftovers.stale(found, who)
    # every live harness, wherever it keeps its lock: those of this state folder, those
    # the processes name, those a process holds open
    named = {x.lock for x in found if x.lock}
    live = who.plus(owners.read_live(named)).plus(owners.held_anywhere()).live
    here = owners.state_dir().resolve()
    for harness in live:
        mine = leftovers.of_lock(found, harness)
        elsewhere = "" if harness.path.parent == here else f"; its lock is in {harness.path.parent}"
        print(f"left alone: {len(mine)} thing(s) of live harness pid {harness.pid}"
              f" ({harness.command[:80]}{elsewhere})")
    if not stale:
        print("nothing left behind by dead harnesses")
        return 0
    print(f"{len(stale)} leftover(s) of dead harnesses:")
    for item in stale:
        print(f"  {item.describe()}")
    if not ns.yes:
        print("run `torchchaos clean --yes` to remove them")
        return 1
    failures = leftovers.remove(stale)
    for failure in failures:
        print(f"could not remove {failure}", file=sys.stderr)
    print(f"removed {len(stale) - len(failures)} of {len(stale)}")
    return 1 if failures else 0


def cmd_faults(_ns: argparse.Namespace) -> int:
    from torchchaos.faults.registry import all_kinds

    for name, kind in sorted(all_kinds().items()):
        print(f"{name:<10} {kind.summary}  (parameters: {', '.join(kind.params) or 'none'})")
    return 0


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    # Both signals become KeyboardInterrupt so `finally` blocks heal and reap; SIGINT is
    # set explicitly because a shell's background job starts with it ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        argv = sys.argv[1:] if argv is None else argv
        if argv[:1] == ["suite"]:  # every argument after it is pytest's
            return cmd_suite(argv[1:])
        ns = build_parser().parse_args(argv)
        if ns.command is None:
            build_parser().print_help()
            return 2
        commands = {"run": cmd_run, "battery": cmd_battery, "crashpoints": cmd_crashpoints,
                    "campaign": cmd_campaign, "report": cmd_report, "replay": cmd_replay,
                    "search": cmd_search, "shrink": cmd_shrink,
                    "faults": cmd_faults, "export": cmd_export, "doctor": cmd_doctor,
                    "clean": cmd_clean, "merge": cmd_merge, "incident": cmd_incident,
                    **nodes.COMMANDS, **cluster.COMMANDS, **docker.COMMANDS,
                    **detectors.COMMANDS}
        return commands[ns.command](ns)
    except ChaosError as exc:
        print(f"torchchaos: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torchchaos: interrupted; every process of the run was reaped", file=sys.stderr)
        return 130
    except Exception as exc:  # a harness bug: still one line, exit 2
        debug = bool(os.environ.get("TORCHCHAOS_DEBUG"))
        if debug:
            traceback.print_exc()  # the traceback asked for; the exit status stays 2
        where = "the traceback is above" if debug else "set TORCHCHAOS_DEBUG=1 for a traceback"
        print(f"torchchaos: internal error: {type(exc).__name__}: {exc} ({where})",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
