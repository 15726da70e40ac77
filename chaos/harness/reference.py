"""The fault-free reference run, cached by what determines its outcome.

The cache key covers the bytes of the script and of the Python files beside
it (modules it may import), its arguments and the files they name (a config
file edited between two runs makes a new reference), the job's shape, the
extra environment and the torch / torchchaos versions. An entry is complete
only once its `meta.json` exists, so an interrupted reference run is never
reused. With two reference runs the entry also records whether the target is
deterministic without faults.

The cache is written the way a checkpoint should be: the runs' files synced,
then `meta.json` last, whole (a synced temporary file renamed over it, the
folder synced). It records the size and digest of every file the harness
wrote in each run (`_chaos/`: histories, weights, the snapshot), and an entry
is used only if they read back the same: a damaged one (a `meta.json` cut
short, a history truncated by a full disk or a careless copy) is said and run
again, never judged against.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from torchchaos import env
from torchchaos.errors import CannotJudge, UsageError
from torchchaos.harness.hangwatch import REFERENCE_TIMEOUT
from torchchaos.harness.runner import Job
from torchchaos.judge.components import same_state
from torchchaos.judge.hangs import describe_hang
from torchchaos.progress import Progress
from torchchaos.rundir.folders import unwritable, write_atomic
from torchchaos.rundir.history import Event, History
from torchchaos.rundir.layout import RunLayout
from torchchaos.rundir.written import files_differ, written_files
from torchchaos.scenario.model import Scenario
from torchchaos.version import __version__


@dataclass
class Reference:
    run_dir: Path
    wall_seconds: float
    deterministic: bool | None  # None: only one run, not proven either way
    detail: str

    _history: History | None = field(default=None, repr=False, compare=False)

    def history(self) -> History:
        """The reference run's history, read once (every planner and judge asks for it)."""
        if self._history is None:
            self._history = History.of_run(self.run_dir)
        return self._history



def default_cache_dir() -> Path:
    """Where cached reference runs live unless --cache-dir says otherwise."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "torchchaos"


def _sibling_sources(script: Path) -> list[Path]:
    """The Python files beside the script (the script among them), which it may import."""
    return sorted(script.resolve().parent.glob("*.py"))


def _source_digest(script: Path) -> str:
    """The script and the Python files beside it, which it may import as modules."""
    h = hashlib.sha256(script.read_bytes())
    for path in _sibling_sources(script):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


# Files above this size (a data set) are keyed by size and modification time, not read.
HASHED_BYTES = 64 << 20


def argument_files(args: list[str]) -> dict[str, str]:
    """Each argument, or the value of a `--key=value` / `key=value` argument, that names an
    existing file (relative paths from where torchchaos was started): its digest."""
    found: dict[str, str] = {}
    for arg in args:
        for text in (arg, arg.partition("=")[2]):
            if not text or "{run_dir}" in text or text in found:
                continue
            path = Path(text).expanduser()
            try:
                if not path.is_file():
                    continue
                found[text] = _file_digest(path)
            except (OSError, ValueError):  # unreadable, or not a path at all
                continue
    return found


def _file_digest(path: Path) -> str:
    size, mtime = path.stat().st_size, path.stat().st_mtime_ns
    return (f"size={size},mtime={mtime}" if size > HASHED_BYTES
            else hashlib.sha256(path.read_bytes()).hexdigest())


def linked_files(links: list[str]) -> dict[str, str]:
    """What each of Scenario.links holds, by the name the runs see it under (a cache handed
    to another machine still matches): a file's digest; for a folder (a data set can be
    large), every file's path, size and modification time."""
    found: dict[str, str] = {}
    for link in links:
        root = Path(link)
        if root.is_file():
            found[root.name] = _file_digest(root)
            continue
        listing = hashlib.sha256()
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = Path(folder, name)
                stat = path.lstat()
                listing.update(f"{path.relative_to(root)}\0{stat.st_size}\0"
                               f"{stat.st_mtime_ns}\n".encode())
        found[root.name] = listing.hexdigest()
    return found


# What a reference step's fingerprints hold; a change makes older cached runs unusable.
# 2: the loss joined them (light steps of a chaos run compare it).
# 3: the gradients of optimizer.step(closure) are taken after the closure ran.
# 4: an accelerator's tensors are summed down columns of 251 words (`_device_sums`).
# 5: a digest hashes the tensors' headers first, in one piece, then their bytes.
FINGERPRINT_FORMAT = 5


def _torch_version() -> str:
    """torch's version without importing torch: the harness process itself never needs
    torch (its jobs do), and importing it costs over a second per command."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # a build from source without metadata
        import torch

        return torch.__version__


def cache_key(scenario: Scenario) -> str:
    blob = {
        "script": _source_digest(Path(scenario.script)),
        "args": scenario.args, "files": argument_files(scenario.args),
        "links": linked_files(scenario.links),
        "nproc": scenario.nproc, "nodes": scenario.nodes,
        "env": scenario.env, "torch": _torch_version(), "torchchaos": __version__,
        "fingerprints": FINGERPRINT_FORMAT,
        # a set literal's order can differ between a forked rank and an exec'd one
        "start": "cold" if env.cold_start() else "warm",
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:20]


def _step_table(history: History) -> dict[tuple[int, int], dict[str, str]]:
    return {(e["rank"], e["step"]): e["fp"] for e in history.steps()}


def _compare(first: History, second: History) -> tuple[bool, str]:
    a, b = _step_table(first), _step_table(second)
    for key in sorted(set(a) | set(b), key=lambda k: (k[1], k[0])):
        if key not in a or key not in b or not same_state(a[key], b[key]):
            return False, f"two fault-free runs differ at step {key[1]} on rank {key[0]}"
    return True, f"two fault-free runs matched bitwise over {len(a)} rank-steps"


def relative_path_hint(output: str) -> str:
    """Where a job failed to open a relative path that exists where torchchaos was started:
    the job runs in its run directory, so say so (nanoGPT's `open('configurator.py')`)."""
    for name in re.findall(r"No such file or directory: '([^'/][^']*)'", output):
        if Path(name).exists():
            return (f" (the job runs in its run directory, not here: {name} exists here;"
                    f" pass it as an absolute path, {Path(name).resolve()}, or, where the"
                    f" script opens it by that name, --link {name.split('/')[0]})")
    return ""


# What torch says when a script asks for a GPU that this machine lacks (torch 2.13, CPU
# build): nanoGPT's torch.cuda.set_device, the DDP tutorial's model.to(local_rank).
_NO_GPU = re.compile(r"Torch not compiled with CUDA enabled|Cannot access accelerator device"
                     r"|no attribute '_cuda_setDevice'|No CUDA GPUs are available"
                     r"|Found no NVIDIA driver|ProcessGroupNCCL is only supported with GPUs"
                     r"|doesn't have NCCL built in")


def gpu_hint(output: str) -> str:
    """Where a job died asking for a GPU this machine does not have: say so, since the
    torch error alone reads like a bug in the job."""
    if not _NO_GPU.search(output):
        return ""
    return (" (the script needs a GPU and this machine has none: run it where it trains"
            " today, a GPU runner, or give it a CPU path with the gloo backend)")


def _torchft_hint(scenario: Scenario) -> str:
    """torchft's Manager reaches torchrun's rendezvous store as a client at MASTER_ADDR:
    MASTER_PORT; torchchaos turns that shared store off by default (runner.py), so a
    torchft job waits for a store nobody serves."""
    if "torchft" not in _imported(Path(scenario.script).resolve()):
        return ""
    return ("; it uses torchft, whose Manager connects to torchrun's store at"
            " MASTER_ADDR:MASTER_PORT, which torchchaos turns off unless told otherwise:"
            " run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0 in the environment")


_IMPORT = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", re.MULTILINE)


def _imported(script: Path, seen: set[Path] | None = None) -> set[str]:
    """The top-level modules the script imports, with those its sibling modules it
    imports do (a file beside it that merely mentions a module is no import of it)."""
    seen = set() if seen is None else seen
    seen.add(script)
    names = set(_IMPORT.findall(script.read_text(errors="replace")))
    for name in list(names):
        sibling = script.parent / f"{name}.py"
        if sibling.is_file() and sibling not in seen:
            names |= _imported(sibling, seen)
    return names


# The determinism proof's second run hashes strings with another seed than every other
# job (runner.HASH_SEED): a job whose steps follow the order of a set of strings, which
# its restarts would change in production, is then found not deterministic
OTHER_HASH_SEED = "1"


def _reseeds(scenario: Scenario) -> bool:
    """Whether the proof's second run hashes strings with OTHER_HASH_SEED (no seed of the
    user's own)."""
    return "PYTHONHASHSEED" not in {**os.environ, **scenario.env}


def _run_once(scenario: Scenario, run_dir: Path, progress: Progress,
              second: bool = False) -> float:
    if second and _reseeds(scenario):
        scenario = dataclasses.replace(scenario, env={**scenario.env,
                                                      "PYTHONHASHSEED": OTHER_HASH_SEED})
    bound = scenario.hang_timeout or REFERENCE_TIMEOUT  # a bound the user set holds here too
    outcome = Job(scenario, run_dir, faults=[], progress=progress, hang_timeout=bound).run()
    if outcome.hang is not None:
        raise CannotJudge(f"the target hangs without faults: no progress for"
                          f" {outcome.hang['seconds']:g} s: {describe_hang(outcome.hang)}"
                          f" (stacks in {RunLayout(run_dir).stacks_dir}){_torchft_hint(scenario)}")
    if outcome.deadline_hit:
        raise CannotJudge(f"the target did not finish without faults within {scenario.timeout:g}"
                          f" s (see {RunLayout(run_dir).logs_dir})")
    if not outcome.completed:
        tail = outcome.log_tail()
        how = "every attempt died so before its first step, and the harness stopped" \
            if outcome.gave_up else f"exit codes {outcome.exit_codes[-1]}"
        # what to do, where there is a hint, comes last: the line ends with it
        raise CannotJudge(f"the target fails without faults: {tail} ({how}; its whole"
                          f" output: {outcome.last_log() or RunLayout(run_dir).logs_dir})"
                          f"{relative_path_hint(tail)}{gpu_hint(tail)}")
    history = History.of_run(run_dir)
    if not history.steps():
        raise CannotJudge("the target ran without any optimizer step the agent could see"
                          " (is it a torch training script using torch.optim?)")
    restarted = restarted_and_trained(history)
    if restarted is not None:  # its steps would overwrite the first attempt's in every lookup
        raise CannotJudge(f"the target fails without faults: a worker died and was restarted"
                          f" (rank {restarted['rank']}, attempt"
                          f" {restarted.get('attempt', 0)}) although no fault was"
                          f" injected; last output: {outcome.log_tail()}")
    return outcome.wall_seconds


def restarted_and_trained(history: History) -> Event | None:
    """The boot of the first restarted worker (a relaunch or an elastic restart) that then
    ran a step, or None. A restart that runs no step leaves the reference sound: torch
    2.13's gloo can abort a worker in its teardown after the last step, torchrun restarts
    it, and the new worker finds nothing left to train (the Hugging Face Trainer's "at
    max_steps: nothing to resume") and exits."""
    trained = {e["pid"] for e in history.steps() if "pid" in e}
    return next((e for e in history.of("boot") if (e.get("launch") or e.get("attempt"))
                 and e.get("pid") in trained), None)


def check_cache_dir(cache_root: Path) -> None:
    """Refuse a cache folder that cannot be written (a file, read-only, full) before any
    run: a reference run that cannot be kept would be lost at its end."""
    why = unwritable(cache_root)
    if why:
        raise UsageError(f"reference cache {cache_root}: {why}; choose another"
                         " (--cache-dir)")


def get_reference(scenario: Scenario, cache_root: Path, progress: Progress) -> Reference:
    """The cached reference, made first if need be. One lock file per entry, so two
    harnesses asking for the same reference at once run it once."""
    check_cache_dir(cache_root)
    cache_root.mkdir(parents=True, exist_ok=True)
    entry = cache_root / f"ref-{cache_key(scenario)}"
    with open(entry.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        reference = _cached_or_new(scenario, entry, progress)
    refusal = unjudgeable(reference)
    if refusal:  # said before any run with faults: every verdict would rest on it
        raise Unjudgeable(refusal[0], f"{refusal[1]} (the reference is cached in {entry})")
    shared = written_into_links(reference, scenario.links)
    if shared:
        raise CannotJudge(f"the job saves its checkpoints into what --link shows every run"
                          f" ({shared}): the runs would share them, and a run with faults"
                          " would resume from the reference's; link only what the job reads,"
                          " and let it save in its run directory")
    return reference


def written_into_links(reference: Reference, links: list[str]) -> str:
    """The files (a few) the reference run's checkpoint saves wrote under a linked path, or
    "". Writes before training (a data set's cache) are left alone: shared, but no run
    resumes from them."""
    names = {Path(link).name for link in links}
    written = sorted({e["path"] for e in reference.history().of("file")
                      if e.get("save", 0) > 0 and Path(e["path"]).parts[:1]
                      and Path(e["path"]).parts[0] in names})
    return ", ".join(written[:3]) + (f" and {len(written) - 3} more" if len(written) > 3 else "")


class Unjudgeable(CannotJudge):
    """A reference no run with faults can be judged against; `topic` says what the
    target must fix: "seeded" (fault-free runs differ) or "trains" (weights never move)."""

    def __init__(self, topic: str, message: str) -> None:
        super().__init__(message)
        self.topic = topic


def unjudgeable(reference: Reference) -> tuple[str, str] | None:
    """(topic, why) when no run with faults could be judged against this reference, else
    None: two fault-free runs that differ ("seeded"), or parameters that never change
    ("trains": every step would look like every other, so no restore could be placed)."""
    if reference.deterministic is False:
        return ("seeded", f"the target is not deterministic without faults: {reference.detail};"
                " seed it (torch.manual_seed, the data order, dropout; and sort a set of"
                " strings before its order matters: the second run hashes them with another"
                " seed, as a restart does) so that two fault-free runs agree, and a resume"
                " can be compared with them")
    steps = sorted(reference.history().steps(0), key=lambda e: e["step"])
    if len(steps) >= 3 and len({e["fp"].get("params_start") for e in steps}) == 1:
        losses = {e.get("loss") for e in steps}
        loss = f" (its loss is {losses.pop()} at every step)" if len(losses) == 1 else ""
        return ("trains", f"the reference run's parameters never changed in {len(steps)} steps"
                f"{loss}: every step looks like every other, so no restore can be placed and"
                " no resume judged; give the job a loss that trains (a loss of exactly 0, or"
                " a learning rate of 0, leaves the weights as they are)")
    return None


def _cached_or_new(scenario: Scenario, entry: Path, progress: Progress) -> Reference:
    meta = _read_meta(entry, progress)
    if meta is not None and meta["runs"] >= scenario.reference_runs:
        progress(f"reference: reusing cached run {entry}")
        return Reference(entry / "run-0", meta["wall_seconds"], *_proven_for(scenario, meta))
    if meta is not None:  # whole, with too few runs: its run-0 may be another harness's
        # reference right now (pytest -n, a doctor beside a run), so it stays; the runs
        # it lacks are added beside it
        walls = [meta["wall_seconds"]]
        for extra in range(meta["runs"], scenario.reference_runs):
            shutil.rmtree(entry / f"run-{extra}", ignore_errors=True)
    else:
        if entry.is_dir():
            shutil.rmtree(entry)  # incomplete or damaged: no harness could use it
        elif entry.exists():
            entry.unlink()
        entry.mkdir()
        walls = []
    for number in range(len(walls), scenario.reference_runs):
        progress(f"reference run {number + 1}/{scenario.reference_runs} (fault-free) ...")
        walls.append(_run_once(scenario, entry / f"run-{number}", progress, second=number > 0))
        progress(f"reference run {number + 1} done in {walls[-1]:.1f} s")
    deterministic, detail = None, "one reference run; determinism not proven"
    if scenario.reference_runs == 2:
        deterministic, detail = _compare(History.of_run(entry / "run-0"),
                                         History.of_run(entry / "run-1"))
    meta = {"runs": scenario.reference_runs, "wall_seconds": walls[0],
            "deterministic": deterministic, "detail": detail,
            "other_hash_seed": scenario.reference_runs == 2 and _reseeds(scenario),
            "files": written_files(entry, _runs(entry, scenario.reference_runs),
                                   sync=True)}
    write_atomic(entry / META, json.dumps(meta))  # last: it says the entry is whole
    return Reference(entry / "run-0", walls[0], deterministic, detail)


def _proven_for(scenario: Scenario, meta: dict) -> tuple[bool | None, str]:
    """What a cached entry proves for a scenario that reuses it. Two runs that differ
    where the second hashed strings with another seed (doctor's proof) say nothing of a
    scenario whose every run has one seed: it sees determinism unproven, as it would had
    it made the entry itself, and its own runs show real non-determinism (a divergence
    before the fault). Its verdict does not depend on whether doctor ran first."""
    if scenario.reference_runs == 1 and meta["deterministic"] is False \
            and meta.get("other_hash_seed"):
        return None, "one reference run with the job's str-hash seed; determinism not proven"
    return meta["deterministic"], meta["detail"]


META = "meta.json"
# meta.json's keys and the types the reader relies on
META_KEYS = {"runs": int, "wall_seconds": (int, float), "deterministic": (bool, type(None)),
             "detail": str, "files": dict}


def _read_meta(entry: Path, progress: Progress) -> dict | None:
    """The entry's meta.json when the entry is whole, else None: never made (or made by
    a run cut short), or damaged, which is said, naming the file and what is wrong."""
    meta_file = entry / META
    if not meta_file.exists():
        return None
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as exc:
        return _damaged(progress, entry, f"{meta_file} does not parse ({exc})")
    wrong = [key for key, kind in META_KEYS.items()
             if not isinstance(meta, dict) or not isinstance(meta.get(key), kind)]
    if wrong:
        return _damaged(progress, entry, f"{meta_file} has no valid {', '.join(wrong)}")
    if meta["runs"] not in (1, 2):
        return _damaged(progress, entry, f"{meta_file} says runs={meta['runs']}")
    why = files_differ(entry, _runs(entry, meta["runs"]), meta["files"], meta_file)
    return _damaged(progress, entry, why) if why else meta


def _damaged(progress: Progress, entry: Path, why: str) -> None:
    progress(f"reference: cached run {entry} is damaged: {why}; running it again")


def _runs(entry: Path, runs: int) -> list[Path]:
    return [entry / f"run-{number}" for number in range(runs)]
