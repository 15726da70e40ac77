"""Sharded sweeps: one plan, run on N machines, merged into one report.

`--shard I/N` on `battery`, `crashpoints --per-point` and `campaign`: every
shard makes (or, through the reference cache, reuses) the same fault-free
reference, derives the same plan from it, and runs the plan's runs numbered
I, I+N, I+2N, ... (round robin: a plan's costly runs tend to sit together),
each in OUT/NN with NN its number in the whole plan. Beside them it writes
OUT/shard.json: the command, the whole plan, which shard this is and what
became of each of its runs. `torchchaos merge DIR... --out M` checks the
shards are of one plan and cover it exactly once, brings their run folders
into M (hard links where the filesystem allows, else copies) and writes what
the unsharded command writes: the table, index.html, campaign.json, JUnit.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chaos.errors import UsageError
from chaos.explore.battery import Entry
from chaos.report.model import Report

MANIFEST = "shard.json"
PLAN_FIELDS = ("name", "fault", "seed", "start_from")
# (index variable, count variable, first index): what each engine sets in a shard
ENGINES = (("TORCHCHAOS_SHARD_INDEX", "TORCHCHAOS_SHARD_COUNT", 1),
           ("JOB_COMPLETION_INDEX", "TORCHCHAOS_SHARD_COUNT", 0),  # Kubernetes Indexed Job
           ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", None))  # Slurm job array


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
                   entries: list[Entry], extra: dict[str, object] | None = None) -> Path:
    """OUT/shard.json: the whole plan and what became of this shard's runs."""
    ran = {str(n): {"error": entries[n - 1].error,
                    "report": entries[n - 1].report is not None}
           for n in shard.numbers(len(entries))}
    manifest = {"command": command, "title": title, "shard": [shard.index, shard.count],
                "plan": [{k: asdict(e)[k] for k in PLAN_FIELDS} for e in entries],
                "runs": ran, "extra": extra or {},
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


def merge(dirs: list[Path], out_dir: Path) -> Merged:
    """Join the shards in `dirs` into `out_dir` (which the caller created empty). A
    search's shards are not one plan cut in pieces but searches with their own seeds:
    their results are listed, and the smallest failing schedule is the answer."""
    manifests = _whole_plan(dirs)
    first = manifests[0][1]
    if first["command"] == "search":
        return Merged("search", first["title"], [], {}, manifests)
    entries = [Entry(**{k: p[k] for k in PLAN_FIELDS}) for p in first["plan"]]
    for directory, manifest in manifests:
        for number, ran in manifest["runs"].items():
            entry = entries[int(number) - 1]
            entry.error = ran["error"]
            entry.report = (_bring(directory, manifest.get("out"), out_dir, int(number))
                            if ran["report"] else None)
    return Merged(first["command"], first["title"], entries, first["extra"])


def _whole_plan(dirs: list[Path]) -> list[tuple[Path, dict]]:
    """Each shard's manifest, in shard order, once it is certain they are all the shards
    of one plan."""
    manifests = [_read_manifest(d) for d in dirs]
    first = manifests[0]
    for directory, manifest in zip(dirs, manifests):
        for key in ("command", "plan", "extra"):
            if manifest[key] != first[key]:
                raise UsageError(f"{directory} is a shard of another {key} than {dirs[0]}:"
                                 " shards to merge come from one command with the same"
                                 " script, arguments, options and reference")
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


def _read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not path.is_file():
        raise UsageError(f"{directory} has no {MANIFEST}: not the --out of a run with --shard")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise UsageError(f"{path}: not a shard manifest ({exc})") from None


def _bring(shard_dir: Path, written_in: str | None, out_dir: Path, number: int) -> Report:
    """Run NN of a shard into the merged folder; its report.json rewritten to name the
    merged folder instead of where the shard wrote it (`written_in`: on another machine,
    maybe), the other files shared with the shard, not rewritten."""
    name = f"{number:02d}"
    source, target = shard_dir / name, out_dir / name
    shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)
    text = (source / "report.json").read_text()
    for where in dict.fromkeys([written_in or "", str(shard_dir.resolve())]):
        if where:
            text = text.replace(where, str(out_dir.resolve()))
    (target / "report.json").unlink()
    (target / "report.json").write_text(text)
    return Report.read(target / "report.json")


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed: a copy
        shutil.copy2(source, target)
