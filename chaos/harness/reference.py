"""The fault-free reference run, cached by what determines its outcome.

The cache key covers the bytes of the script and of the Python files beside
it (modules it may import), its arguments, the job's shape, the
extra environment and the torch / torchchaos versions. An entry is complete
only once its `meta.json` exists, so an interrupted reference run is never
reused. With two reference runs the entry also records whether the target is
deterministic without faults.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import chaos
from chaos.errors import CannotJudge
from chaos.harness.hangwatch import REFERENCE_TIMEOUT
from chaos.harness.runner import Job, Progress
from chaos.judge.components import same_state
from chaos.judge.hangs import describe_hang
from chaos.rundir.history import History
from chaos.rundir.layout import RunLayout
from chaos.scenario.model import Scenario


@dataclass
class Reference:
    run_dir: Path
    wall_seconds: float
    deterministic: bool | None  # None: only one run, not proven either way
    detail: str

    def history(self) -> History:
        return History.of_run(self.run_dir)



def default_cache_dir() -> Path:
    """Where cached reference runs live unless --cache-dir says otherwise."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "torchchaos"


def _source_digest(script: Path) -> str:
    """The script and the Python files beside it, which it may import as modules."""
    h = hashlib.sha256(script.read_bytes())
    for path in sorted(script.resolve().parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


# What a reference step's fingerprints hold; a change makes older cached runs unusable.
# 2: the loss joined them (light steps of a chaos run compare it).
# 3: the gradients of optimizer.step(closure) are taken after the closure ran.
FINGERPRINT_FORMAT = 3


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
        "args": scenario.args, "nproc": scenario.nproc, "nodes": scenario.nodes,
        "env": scenario.env, "torch": _torch_version(), "torchchaos": chaos.__version__,
        "fingerprints": FINGERPRINT_FORMAT,
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


def _run_once(scenario: Scenario, run_dir: Path, progress: Progress) -> float:
    bound = scenario.hang_timeout or REFERENCE_TIMEOUT  # a bound the user set holds here too
    outcome = Job(scenario, run_dir, faults=[], progress=progress, hang_timeout=bound).run()
    if outcome.hang is not None:
        raise CannotJudge(f"the target hangs without faults: no progress for"
                          f" {outcome.hang['seconds']:g} s: {describe_hang(outcome.hang)}"
                          f" (stacks in {RunLayout(run_dir).stacks_dir})")
    if outcome.deadline_hit:
        raise CannotJudge(f"the target did not finish without faults within {scenario.timeout:g}"
                          f" s (see {RunLayout(run_dir).logs_dir})")
    if not outcome.completed:
        tail = outcome.log_tail()
        raise CannotJudge(f"the target fails without faults (exit codes"
                          f" {outcome.exit_codes[-1]}): {tail}")
    history = History.of_run(run_dir)
    if not history.steps():
        raise CannotJudge("the target ran without any optimizer step the agent could see"
                          " (is it a torch training script using torch.optim?)")
    restarted = [e for e in history.of("boot") if e.get("launch") or e.get("attempt")]
    if restarted:  # its steps would overwrite the first attempt's in every lookup
        raise CannotJudge(f"the target fails without faults: a worker died and was restarted"
                          f" (rank {restarted[0]['rank']}, attempt"
                          f" {restarted[0].get('attempt', 0)}) although no fault was"
                          f" injected; last output: {outcome.log_tail()}")
    return outcome.wall_seconds


def get_reference(scenario: Scenario, cache_root: Path, progress: Progress) -> Reference:
    """The cached reference, made first if need be. One lock file per entry, so two
    harnesses asking for the same reference at once run it once."""
    cache_root.mkdir(parents=True, exist_ok=True)
    entry = cache_root / f"ref-{cache_key(scenario)}"
    with open(entry.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _cached_or_new(scenario, entry, progress)


def _cached_or_new(scenario: Scenario, entry: Path, progress: Progress) -> Reference:
    meta_file = entry / "meta.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        if meta["runs"] >= scenario.reference_runs:
            progress(f"reference: reusing cached run {entry}")
            return Reference(entry / "run-0", meta["wall_seconds"], meta["deterministic"],
                             meta["detail"])
    if entry.exists():
        shutil.rmtree(entry)  # incomplete or too few runs: a directory this harness created
    entry.mkdir()
    walls = []
    for number in range(scenario.reference_runs):
        progress(f"reference run {number + 1}/{scenario.reference_runs} (fault-free) ...")
        walls.append(_run_once(scenario, entry / f"run-{number}", progress))
        progress(f"reference run {number + 1} done in {walls[-1]:.1f} s")
    deterministic, detail = None, "one reference run; determinism not proven"
    if scenario.reference_runs == 2:
        deterministic, detail = _compare(History.of_run(entry / "run-0"),
                                         History.of_run(entry / "run-1"))
    meta = {"runs": scenario.reference_runs, "wall_seconds": walls[0],
            "deterministic": deterministic, "detail": detail}
    meta_file.write_text(json.dumps(meta))
    return Reference(entry / "run-0", walls[0], deterministic, detail)
