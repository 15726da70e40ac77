"""Soak: the harness (or a pytest running the plugin) dies at a random moment of a run,
and after a bounded time nothing of the run is left.

Each case starts a real run of one fault family on the bundled target (a kill,
a power loss under the fault filesystem, a SIGSTOPped rank, a partition
between two simulated nodes in their namespaces, a rank filling its own memory
cgroup, a rank holding the GIL, a stopped DataLoader worker), waits for a moment drawn
from a seeded generator, signals the harness (SIGINT, SIGTERM, SIGKILL) or
SIGKILLs a pytest process running the run through the plugin, and then
checks within BOUND seconds that no process of the run is alive, nothing is
mounted under it, no namespace, link or bridge of it exists, the dead
harness's lock file is gone, no memory cgroup of it is left, and `torchchaos
clean` finds nothing.

The default run has one case per family and victim; `-m slow` adds a
100-case soak (every moment random, some during the reference run) whose
figures the README quotes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from conftest import REPO, TARGET, chaos_processes

from torchchaos.faults.faultfs.mount import unavailable_reason as fuse_unavailable
from torchchaos.host import leftovers, owners
from torchchaos.host.mounts import mounts_under
from torchchaos.host.netns import unavailable_reason as netns_unavailable

# it orphans runs and lists what is left: alone on the host under pytest -n, all such
# tests on one worker one after the other (conftest)
pytestmark = [pytest.mark.host_exclusive, pytest.mark.xdist_group("host_exclusive")]

BOUND = 10.0  # seconds after the victim's death by which nothing may be left
STEPS = ["--steps", "20", "--ckpt-every", "5"]
# Steps slowed down where a moment is drawn after a fault the job survives: on a fast
# machine a warm run of the bare target ends 1.3 s after its mount, before the moment.
FAMILIES = {  # fault family: (torchchaos run options, script arguments)
    "kill": (["--fault", "kill:rank=1,step=8"],
             ["--steps", "40", "--ckpt-every", "5", "--step-sleep", "0.05"]),
    "storage": (["--fault", "storage:mode=lose_unsynced,rank=0,phase=checkpoint_save,"
                            "save=2,event=2"], [*STEPS, "--step-sleep", "0.1"]),
    # torch's default collective timeout: the stopped rank stays stopped
    "hang": (["--fault", "hang:rank=1,step=6", "--hang-timeout", "60"],
             [*STEPS, "--default-timeouts"]),
    "partition": (["--nodes", "2", "--nproc", "1", "--fault", "partition:node=1,step=4"],
                  ["--steps", "16", "--ckpt-every", "4", "--default-timeouts"]),
    # a rank in a memory cgroup of its own, filling 2 GiB of it (a second or so)
    "oom": (["--fault", "oom:rank=1,step=6,limit=2048"], [*STEPS, "--step-sleep", "0.05"]),
    # a rank holding the GIL: no Python of it runs, not even a signal handler
    "gil": (["--fault", "hang:rank=1,step=6,mode=gil", "--hang-timeout", "60"],
            [*STEPS, "--default-timeouts"]),
    # a stopped DataLoader worker, its rank waiting for its batch
    "dataloader": (["--fault", "dataloader:rank=1,step=6,mode=stop", "--hang-timeout", "60"],
                   [*STEPS, "--default-timeouts", "--loader-workers", "2"]),
}
WHEN = {  # the event after which a "mid-fault" moment is drawn
    "kill": '"fault"', "storage": '"fs_mount"', "hang": '"hang_begin"',
    "partition": '"nemesis_begin"', "oom": '"oom"', "gil": '"hang_begin"',
    "dataloader": '"dataloader_worker"',
}
VICTIMS = ("SIGINT", "SIGTERM", "SIGKILL", "pytest SIGKILL")


@dataclass(frozen=True)
class Case:
    family: str
    victim: str
    after: str | None  # wait for this event in the chaos run first (None: from the start)
    delay: float  # then this many seconds

    def __str__(self) -> str:
        moment = f"{self.after or 'start'}+{self.delay:.1f}s"
        return f"{self.family}-{self.victim.replace(' ', '-')}-{moment}"


def unavailable(family: str) -> str:
    if family == "storage":
        return fuse_unavailable()
    if family == "partition":
        return netns_unavailable()
    return ""


def _command(case: Case, tmp: Path, cache: Path) -> list[str]:
    options, args = FAMILIES[case.family]
    if case.victim != "pytest SIGKILL":
        return [sys.executable, "-m", "torchchaos.cli", "run", "--quiet", "--out", str(tmp / "out"),
                "--cache-dir", str(cache), *options, "--", str(TARGET), *args]
    test = tmp / "test_victim.py"  # the same run, through the plugin's fixture
    test.write_text(
        "def test_victim(chaos_run):\n"
        f"    chaos_run({str(TARGET)!r}, faults=[{_fault(options)!r}], args={args!r},"
        f" {_scenario_kwargs(options)})\n")
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test),
            "--chaos-dir", str(tmp / "out"), "--chaos-cache-dir", str(cache)]


def _fault(options: list[str]) -> str:
    return options[options.index("--fault") + 1]


def _scenario_kwargs(options: list[str]) -> str:
    words = {"--nodes": "nodes", "--nproc": "nproc", "--hang-timeout": "hang_timeout"}
    return ", ".join(f"{words[o]}={options[i + 1]}" for i, o in enumerate(options)
                     if o in words)


def _histories_text(tmp: Path) -> str:
    """Every event stream of the chaos runs under tmp/out (not the cached references)."""
    text = []
    for path in (tmp / "out").rglob("_chaos/history/*.jsonl"):
        try:
            text.append(path.read_text(errors="replace"))
        except OSError:
            pass
    return "".join(text)


def _wait_for_moment(case: Case, tmp: Path, proc: subprocess.Popen[str]) -> str:
    """Sleep until the case's moment; returns what happened ("" if it came)."""
    if case.after is not None:
        deadline = time.monotonic() + 120
        while case.after not in _histories_text(tmp):
            if proc.poll() is not None:
                return f"the run ended before {case.after}"
            if time.monotonic() > deadline:
                return f"no {case.after} within 120 s"
            time.sleep(0.1)
    time.sleep(case.delay)
    return "" if proc.poll() is None else "the run ended before the moment"


def _left(tmp: Path, killed_pid: int) -> list[str]:
    """What of the case's runs exists now (must become nothing)."""
    found = [f"process {pid}" for pid in chaos_processes(tmp)]
    found += [f"mount {m}" for m in mounts_under(tmp)]
    mine = {f.path for f in owners.owners().live if f.pid == os.getpid()}
    others = [x for x in leftovers.inventory()
              if not any(leftovers.of_lock([x], owners.LockFile.read(p)) for p in mine)]
    # networks are all ours; Slurm clusters and their jobs are other tests' (a module's
    # cluster lives between its tests, while this one holds the host): no case starts one
    found += [x.describe() for x in others if x.kind not in ("process", "cluster", "slurmjob")]
    found += [f"lock {p}" for p in owners.lock_files() if p.name.startswith(f"{killed_pid}-")]
    found += [f"watcher {p.pid}" for p in psutil.process_iter(["cmdline"])
              if "torchchaos.host.lifeline" in (p.info["cmdline"] or [])
              and f"/{killed_pid}-" in " ".join(p.info["cmdline"])]
    return found


def soak(case: Case, tmp: Path, cache: Path,
         extra_env: dict[str, str] | None = None) -> dict[str, object]:
    """Run the case; returns what happened and how long the cleanup took."""
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(extra_env or {})}
    proc = subprocess.Popen(_command(case, tmp, cache), cwd=tmp, env=environ, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        missed = _wait_for_moment(case, tmp, proc)
        signum = signal.SIGKILL if "SIGKILL" in case.victim else getattr(signal, case.victim)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=90)  # SIGINT/SIGTERM: the harness cleans up
        died = time.monotonic()
        left = _left(tmp, proc.pid)
        while left and time.monotonic() - died < BOUND:
            time.sleep(0.1)
            left = _left(tmp, proc.pid)
        return {"missed": missed, "left": left, "seconds": round(time.monotonic() - died, 2),
                "exit": proc.returncode, "output": output[-2000:]}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _clean_finds_nothing(tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchchaos.cli", "clean"], capture_output=True,
                          text=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=60)


def _check(case: Case, tmp: Path, cache: Path) -> dict[str, object]:
    reason = unavailable(case.family)
    if reason:
        pytest.skip(reason)
    result = soak(case, tmp, cache)
    assert result["left"] == [], (f"{case}: left {BOUND:g} s after the victim died:"
                                  f" {result['left']}\n{result['output']}")
    clean = _clean_finds_nothing(tmp)
    assert clean.returncode == 0 and "nothing left behind" in clean.stdout, clean.stdout
    if case.victim in ("SIGINT", "SIGTERM") and not result["missed"]:
        assert result["exit"] == 130, result["output"]
    return result


# One case per family and victim, each mid-fault: the default run's soak (about a minute).
SHORT = [Case("kill", "SIGKILL", WHEN["kill"], 0.3),
         Case("storage", "SIGKILL", WHEN["storage"], 2.0),
         Case("hang", "SIGKILL", WHEN["hang"], 0.5),
         Case("partition", "SIGKILL", WHEN["partition"], 0.5),
         Case("kill", "SIGTERM", WHEN["kill"], 0.1),
         Case("hang", "SIGINT", WHEN["hang"], 0.2),
         Case("storage", "pytest SIGKILL", WHEN["storage"], 1.0),
         Case("oom", "SIGKILL", WHEN["oom"], 0.2),
         Case("gil", "SIGKILL", WHEN["gil"], 0.5),
         Case("dataloader", "SIGTERM", WHEN["dataloader"], 0.5)]


@pytest.mark.parametrize("case", SHORT, ids=str)
def test_nothing_outlives_a_dead_harness(case, tmp_path, shared_cache):
    result = _check(case, tmp_path, shared_cache)
    assert result["missed"] == "", f"{case}: {result['missed']}\n{result['output']}"


def random_cases(count: int, seed: int, victims: tuple[str, ...] = VICTIMS) -> list[Case]:
    """Seeded cases: a family, a victim, and a moment that is either after the family's
    fault event or measured from the start (then often inside the reference run)."""
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        family = rng.choice(sorted(FAMILIES))
        if rng.random() < 0.5:
            found.append(Case(family, rng.choice(victims), WHEN[family],
                              round(rng.uniform(0, 1.5), 1)))
        else:  # a run with its reference cached takes 6-12 s
            found.append(Case(family, rng.choice(victims), None, round(rng.uniform(0.5, 6), 1)))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("case", random_cases(100, seed=20), ids=str)
def test_soak_100_random_moments(case, tmp_path, shared_cache):
    _check(case, tmp_path, shared_cache)


def main() -> None:
    """python tests/e2e/test_soak.py [COUNT [SEED [VICTIM...]]]: a soak with one line per
    case and the totals (the README's figures)."""
    import tempfile

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    victims = tuple(v.replace("-", " ") for v in sys.argv[3:]) or VICTIMS
    base = Path(tempfile.mkdtemp(prefix="soak-"))
    tally: dict[str, int] = {}
    slowest = 0.0
    for n, case in enumerate(random_cases(count, seed, victims)):
        if unavailable(case.family):
            continue
        tmp = base / f"case-{n}"
        tmp.mkdir()
        result = soak(case, tmp, base / "cache")
        clean = _clean_finds_nothing(tmp)
        verdict = "LEFT " + ", ".join(result["left"]) if result["left"] else "nothing left"
        if clean.returncode != 0:
            verdict += "; clean found: " + clean.stdout.replace("\n", " ")
        moment = f" ({result['missed']})" if result["missed"] else ""
        print(f"{n:3} {case}{moment}: {verdict} after {result['seconds']} s", flush=True)
        key = "left something" if result["left"] or clean.returncode else "nothing left"
        tally[key] = tally.get(key, 0) + 1
        tally[case.victim] = tally.get(case.victim, 0) + 1
        tally["ended before the moment"] = tally.get("ended before the moment", 0) + bool(
            result["missed"])
        slowest = max(slowest, float(result["seconds"]))  # type: ignore[arg-type]
    print(f"{sum(tally.get(v, 0) for v in VICTIMS)} cases: " + ", ".join(
        f"{k}: {v}" for k, v in sorted(tally.items())) + f"; slowest cleanup {slowest} s")


if __name__ == "__main__":
    main()
