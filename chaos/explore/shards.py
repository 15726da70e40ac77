"""Sharded sweeps: one plan, run on N machines, merged into one report.

`--shard I/N` on `battery`, `crashpoints` and `campaign`: every
shard makes (or, through the reference cache, reuses) the same fault-free
reference, derives the same plan from it, and runs the plan's runs numbered
I, I+N, I+2N, ... (round robin: a plan's costly runs tend to sit together),
each in OUT/NN with NN its number in the whole plan. Beside them it writes
OUT/shard.json: the command, the whole plan, which shard this is and what
became of each of its runs. `torchchaos merge DIR... --out M` checks the
shards are of one plan and cover it exactly once, brings their run folders
into M (hard links where the filesystem allows, else copies) and writes what
the unsharded command writes: the table, index.html, campaign.json, JUnit.

Crash states (`crashpoints` without --per-point) are drawn from a recording
of the save, which the cache keeps beside the reference: shards on one cache
judge one recording (two recordings differ: temporary names, interleavings,
and their plans would not merge). Each shard runs the recoveries its states
need; the merge draws the states again from the recording and groups them by
the recovery one unsharded sweep would have run (`crashsweep.canonical_groups`).

No scheduler: whatever starts the N shards (a CI matrix, a Kubernetes
Indexed Job, a Slurm array) passes I and N; `--shard auto` reads them from
the environment those engines set.

`search --shard I/N` is not a plan cut in pieces (Hypothesis decides what to
run next from what it saw): each shard searches with a seed of its own and
its share of `--examples`, and the merge reports every shard's result and
the smallest failing schedule of all.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from torchchaos.engine import check_out_dir
from torchchaos.errors import UsageError
from torchchaos.explore.rows import Entry
from torchchaos.report.report_file import Report

MANIFEST = "shard.json"
CRASH_STATES = "crashstates"  # `crashpoints` without --per-point
PLAN_FIELDS = ("name", "fault", "seed", "start_from")
# (index variable, count variable, first index): what each engine sets in a shard
ENGINES = (("TORCHCHAOS_SHARD_INDEX", "TORCHCHAOS_SHARD_COUNT", 1),
           ("JOB_COMPLETION_INDEX", "TORCHCHAOS_SHARD_COUNT", 0),  # Kubernetes Indexed Job
           ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", None))  # Slurm job array


def folder_digits(command: str) -> int:
    """Digits of a run folder's number in a sweep's --out: three for crash states (a save
    has hundreds), else two."""
    return 3 if command == CRASH_STATES else 2


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """'I/N' (1 <= I <= N), or 'auto': from a CI matrix, Indexed Job or job array."""
        if text == "auto":
            return from_environment()
        index, _, count = text.partition("/")
        try:
            shard = cls(int(index), int(count))
        except ValueError:
            raise UsageError(f"--shard {text!r}: give I/N, e.g. 2/4, or auto") from None
        if not 1 <= shard.index <= shard.count:
            raise UsageError(f"--shard {text!r}: I must be between 1 and N")
        return shard

    def numbers(self, total: int) -> list[int]:
        """The plan's run numbers (1-based) this shard runs."""
        return [n for n in range(1, total + 1) if (n - 1) % self.count == self.index - 1]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def from_environment() -> Shard:
    """The shard a CI matrix, a Kubernetes Indexed Job or a Slurm job array started."""
    for index_var, count_var, first in ENGINES:
        if index_var not in os.environ:
            continue
        if count_var not in os.environ:
            raise UsageError(f"--shard auto: {index_var} is set but {count_var} is not")
        index, count = int(os.environ[index_var]), int(os.environ[count_var])
        if first is None:  # Slurm: indexes from SLURM_ARRAY_TASK_MIN (0 or 1, as given)
            first = int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0"))
        return Shard.parse(f"{index - first + 1}/{count}")
    names = ", ".join(dict.fromkeys(v for e in ENGINES for v in e[:2] if v))
    raise UsageError(f"--shard auto: none of {names} is set")


def write_manifest(out_dir: Path, command: str, title: str, shard: Shard,
                   entries: list[Entry], extra: dict[str, object] | None = None,
                   details: dict[str, object] | None = None) -> Path:
    """OUT/shard.json: the whole plan and what became of this shard's runs (`extra`: the
    same in every shard; `details`: this shard's own, for the merge)."""
    ran = {str(n): {"error": entries[n - 1].error,
                    "report": entries[n - 1].report is not None}
           for n in shard.numbers(len(entries))}
    manifest = {"command": command, "title": title, "shard": [shard.index, shard.count],
                "plan": [e.plan_row() for e in entries],
                "runs": ran, "extra": extra or {}, "details": details or {},
                "out": str(out_dir.resolve())}  # where the reports say they are
    path = out_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def search_seed(seed: int, shard: Shard) -> int:
    """A search shard's own seed: the shards of one search draw different schedules."""
    return int(hashlib.sha256(f"{seed}:{shard}".encode()).hexdigest()[:8], 16)


def write_search_manifest(out_dir: Path, shard: Shard, plan: dict[str, object],
                          found: dict[str, object]) -> Path:
    """OUT/shard.json of a search shard: the search's options and what this shard found
    (`found`: runs, found, minimal, flaky, budget_spent)."""
    manifest = {"command": "search", "title": "torchchaos search",
                "shard": [shard.index, shard.count], "plan": plan, "runs": found, "extra": {}}
    path = out_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


@dataclass
class Merged:
    command: str
    title: str
    entries: list[Entry]
    extra: dict[str, object]
    searches: list[tuple[Path, dict]] = field(default_factory=list)  # search: per shard
    details: list[dict] = field(default_factory=list)  # each shard's own, in shard order


def merge(dirs: list[Path], out_dir: Path) -> Merged:
    """Join the shards in `dirs` into `out_dir`, a new folder. A search's shards are not
    one plan cut in pieces but searches with their own seeds: their results are listed,
    and the smallest failing schedule is the answer. Every shard is checked whole (its
    manifest, run folders and reports) before `out_dir` is made: a bad shard is refused
    with nothing written, never half merged."""
    manifests = _whole_plan(dirs)
    claimed: dict[int, Path] = {}
    for directory, manifest in manifests:
        _check_folders(directory, manifest)
        if manifest["command"] == "search":
            continue
        for number in map(int, manifest["runs"]):
            if number in claimed:  # two shards ran it: copying the second would clash
                raise UsageError(f"shard {directory}: run {number} was run by shard"
                                 f" {claimed[number]} too; merge each shard once")
            claimed[number] = directory
    check_out_dir(out_dir)
    first = manifests[0][1]
    if first["command"] == "search":
        out_dir.mkdir(parents=True, exist_ok=True)
        return Merged("search", first["title"], [], {}, manifests)
    # built beside it and renamed into place: a copy that fails half way (a full disk)
    # leaves no half-merged folder
    staging = out_dir.parent / f".{out_dir.name}.merging-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        entries = _merge_runs(manifests, staging, out_dir)
        os.replace(staging, out_dir)
    except OSError as exc:
        raise UsageError(f"merge into {out_dir}: {exc.strerror or exc}"
                         f"{f' ({exc.filename})' if exc.filename else ''}; nothing was"
                         " merged") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Merged(first["command"], first["title"], entries, first["extra"],
                  details=[manifest.get("details", {}) for _, manifest in manifests])


def _merge_runs(manifests: list[tuple[Path, dict]], staging: Path,
                out_dir: Path) -> list[Entry]:
    """Every shard's run folders into `staging`, their reports naming `out_dir`."""
    first = manifests[0][1]
    entries = [Entry.from_plan_row(p) for p in first["plan"]]
    digits = folder_digits(first["command"])
    for directory, manifest in manifests:
        if first["command"] == CRASH_STATES:  # what crash states' reports name besides
            # their own folder: the recording (the same in every shard), their recoveries
            for name in ["record", *_recoveries(directory)]:
                if not (staging / name).exists():
                    _bring_folder(directory, staging, name)
        for number, ran in manifest["runs"].items():
            entry = entries[int(number) - 1]
            entry.error = ran["error"]
            entry.report = (_bring(directory, manifest.get("out"), staging, out_dir,
                                   f"{int(number):0{digits}d}")
                            if ran["report"] else None)
    return entries


def _recoveries(shard_dir: Path) -> list[str]:
    """A crash-state shard's recovery folders (named by the first state they served, so
    the shards' names never collide)."""
    return [f"recoveries/{p.name}" for p in sorted((shard_dir / "recoveries").glob("*"))]


def _whole_plan(dirs: list[Path]) -> list[tuple[Path, dict]]:
    """Each shard's manifest, in shard order, once it is certain they are all the shards
    of one plan."""
    manifests = [_read_manifest(d) for d in dirs]
    first = manifests[0]
    for directory, manifest in zip(dirs, manifests):
        for key in ("command", "plan", "extra"):
            if manifest[key] != first[key]:
                why = (" and recording (shards without a shared --cache-dir each record the"
                       " save, and two recordings differ: see `crashpoints --record-only`)"
                       if first["command"] == CRASH_STATES else "")
                raise UsageError(f"{directory} is a shard of another {key} than {dirs[0]}:"
                                 " shards to merge come from one command with the same"
                                 f" script, arguments, options and reference{why}")
        if manifest["shard"][1] != first["shard"][1]:
            raise UsageError(f"{directory} is shard {'/'.join(map(str, manifest['shard']))},"
                             f" {dirs[0]} is of {first['shard'][1]} shards")
    count = first["shard"][1]
    by_index = {}
    for directory, manifest in zip(dirs, manifests):
        index = manifest["shard"][0]
        if index in by_index:
            raise UsageError(f"shard {index}/{count} given twice: {by_index[index]} and"
                             f" {directory}")
        by_index[index] = directory
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in by_index]
    if missing:
        raise UsageError(f"shard(s) {', '.join(missing)} missing: merge needs all {count}")
    return sorted(zip(dirs, manifests), key=lambda pair: pair[1]["shard"][0])


def command_of(directory: Path) -> str:
    """The command a shard's folder is of (campaign, battery, ...)."""
    return str(_read_manifest(directory)["command"])


def _read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not path.is_file():
        raise UsageError(f"{directory} has no {MANIFEST}: not the --out of a run with --shard")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a shard manifest ({exc})") from None
    why = _manifest_problem(manifest)
    if why:
        raise UsageError(f"{path}: not a shard manifest ({why}); run the shard again")
    return manifest


# What every manifest holds, and what a sweep's or a search's holds besides: the keys the
# merge reads, with their types.
MANIFEST_KEYS: dict[str, type | tuple[type, ...]] = {
    "command": str, "title": str, "shard": list, "runs": dict, "extra": dict}
SWEEP_KEYS = {"plan": list}
OPTIONAL_KEYS = {"details": dict, "out": str}  # absent from older manifests
SEARCH_KEYS = {"plan": dict}
SEARCH_RUNS = {"runs": int, "minimal": (list, type(None)), "flaky": list}
COMMANDS = ("battery", "crashpoints", CRASH_STATES, "campaign", "search")


def _manifest_problem(manifest: object) -> str:
    """What keeps `manifest` from being merged (a list, `{}`, a key missing or of another
    type, runs outside its plan), or ""."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    search = manifest.get("command") == "search"
    for key, kind in {**MANIFEST_KEYS, **(SEARCH_KEYS if search else SWEEP_KEYS)}.items():
        if not isinstance(manifest.get(key), kind):
            return f"no {key!r}" if key not in manifest else f"{key!r} is not a {_name(kind)}"
    for key, kind in OPTIONAL_KEYS.items():
        if key in manifest and not isinstance(manifest[key], kind):
            return f"{key!r} is not a {_name(kind)}"
    if manifest["command"] not in COMMANDS:
        return f"unknown command {manifest['command']!r}"
    shard = manifest["shard"]
    if not (len(shard) == 2 and all(isinstance(n, int) for n in shard)
            and 1 <= shard[0] <= shard[1]):
        return f"'shard' is {shard!r}, not [I, N]"
    return _search_problem(manifest["runs"]) if search else _plan_problem(manifest)


def _name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))


def _search_problem(runs: dict) -> str:
    for key, kind in SEARCH_RUNS.items():
        if not isinstance(runs.get(key), kind):
            return f"runs[{key!r}] is missing or not a {_name(kind)}"
    return ""


def _plan_problem(manifest: dict) -> str:
    plan, runs = manifest["plan"], manifest["runs"]
    if not all(isinstance(p, dict) and all(k in p for k in PLAN_FIELDS) for p in plan):
        return f"a 'plan' entry lacks one of {', '.join(PLAN_FIELDS)}"
    for number, ran in runs.items():
        if not (number.isascii() and number.isdecimal() and 1 <= int(number) <= len(plan)):
            return f"run {number!r} is not in its plan of {len(plan)} run(s)"
        if not (isinstance(ran, dict) and isinstance(ran.get("report"), bool)
                and isinstance(ran.get("error"), (str, type(None)))):
            return f"run {number}: not {{'error': ..., 'report': true|false}}"
    return ""


def _check_folders(directory: Path, manifest: dict) -> None:
    """Each run folder the manifest names is there with a report.json that reads (and a
    crash-state shard's recording, a failing search's minimal.yaml)."""
    if manifest["command"] == "search":
        if manifest["runs"]["minimal"] is not None and not (
                directory / "minimal.yaml").is_file():
            raise UsageError(f"shard {directory}: minimal.yaml is missing although its"
                             f" {MANIFEST} names a failing schedule; run the shard again")
        return
    names = ["record"] if manifest["command"] == CRASH_STATES else []
    digits = folder_digits(manifest["command"])
    reports = [f"{int(n):0{digits}d}" for n, ran in manifest["runs"].items() if ran["report"]]
    for name in [*names, *reports]:
        if not (directory / name).is_dir():
            raise UsageError(f"shard {directory}: run folder {name} is missing although its"
                             f" {MANIFEST} names it; copy the whole --out of the shard")
    for name in reports:
        path = directory / name / "report.json"
        try:
            Report.read(path)
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"shard {directory}: {name}/report.json cannot be read"
                             f" ({exc}); run the shard again") from None


def _bring_folder(shard_dir: Path, out_dir: Path, name: str) -> None:
    (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(shard_dir / name, out_dir / name, symlinks=True,
                    copy_function=link_or_copy)


def _bring(shard_dir: Path, written_in: str | None, staging: Path, out_dir: Path,
           name: str) -> Report:
    """Run folder `name` of a shard into the merge's staging folder; its report.json
    rewritten to name the merged folder `out_dir` instead of where the shard wrote it
    (`written_in`: on another machine, maybe), the other files shared with the shard,
    not rewritten."""
    source, target = shard_dir / name, staging / name
    _bring_folder(shard_dir, staging, name)
    text = (source / "report.json").read_text()
    for where in dict.fromkeys([written_in or "", str(shard_dir.resolve())]):
        if where:
            text = text.replace(where, str(out_dir.resolve()))
    (target / "report.json").unlink()
    (target / "report.json").write_text(text)
    return Report.read(target / "report.json")


def link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed: a copy
        shutil.copy2(source, target)
