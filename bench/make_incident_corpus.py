"""Regenerate tests/data/incidents/: real failing torchrun jobs and what they left.

    python bench/make_incident_corpus.py [--out tests/data/incidents] [--only NAME]

Each case runs tests/scripts/incident_probe.py under plain torchrun (2 ranks, gloo,
--max-restarts 1, no harness) with one failure on its first attempt, and keeps what
an engineer would hold afterwards:

- `launcher.log`: torchrun's stdout and stderr together, as a job log has them;
- `torchrun/attempt_*/*/error.json`: torchelastic's error files (torchrun --log-dir);
- `fr/rank*`: the flight-recorder dumps the script writes on an exception;
- `stacks/rank-*.txt`: `py-spy dump` of every rank while a hang is under way (the
  generator takes them as an on-call engineer would);
- `kernel.log`: the kernel's lines for the run (dmesg), where the OOM killer acted;
- `ckpt/`: the checkpoint folder as the job left it.

`expected.json` says what was done, for tests/incident/test_corpus.py. The OOM case
needs root and a cgroup v1 memory controller (/sys/fs/cgroup/memory); it is skipped
where there is none. Kubernetes, Slurm and NCCL artefacts cannot be produced here:
tests/data/incidents/from_schemas/ holds those, written from their documented
formats (the pod JSON is checked against the Kubernetes OpenAPI schema by the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "tests" / "scripts" / "incident_probe.py"
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")

# name: (mode, rank, step, what the import should find: kind, rank, phase, recovery)
CASES = {
    "raise": ("raise", 1, 6, ("exception", 1, "between_saves", "resumed")),
    "segv": ("segv", 1, 6, ("crash", 1, "between_saves", "resumed")),
    "abort": ("abort", 0, 6, ("crash", 0, "between_saves", "resumed")),
    "oom": ("oom", 1, 6, ("oom", 1, "between_saves", "resumed")),
    "hang": ("hang", 1, 6, ("hang", 1, "between_saves", "resumed")),
    "kill": ("kill", 1, 6, ("kill", 1, "between_saves", "resumed")),
    "term": ("term", 0, 6, ("preempt", 0, "between_saves", "resumed")),
    "save": ("save", 0, 8, ("kill", 0, "mid_save", "resumed")),
    "load": ("load", 0, 8, ("kill", 0, "mid_save", "failed while loading")),
}


def run_case(name: str, out: Path) -> None:
    """Run one case and keep what it left in out/name."""
    mode, rank, step, (kind, want_rank, phase, recovery) = CASES[name]
    cgroup = None
    if mode == "oom":
        if not (CGROUP_ROOT / "cgroup.procs").exists() or os.geteuid() != 0:
            print(f"{name}: skipped (no cgroup v1 memory controller, or not root)")
            return
        cgroup = CGROUP_ROOT / f"torchchaos-corpus-{os.getpid()}"
        cgroup.mkdir()
        (cgroup / "memory.limit_in_bytes").write_text(str(400 << 20))
    dest = out / name
    shutil.rmtree(dest, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "fr").mkdir()
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "FR_DUMP": str(run / "fr" / "rank"),
               "OMP_NUM_THREADS": "1", **({"OOM_CGROUP": str(cgroup)} if cgroup else {}),
               # restarts work with torch 2.13 only with the store not shared (the known
               # limit pytorch/pytorch#135712, docs/explanation/known-limits.md)
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        dmesg_before = _dmesg()
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", "--max-restarts", "1",
                   "--log-dir", str(run / "torchrun"), str(PROBE),
                   "--fail", mode, "--rank", str(rank), "--step", str(step)]
        with open(run / "launcher.log", "wb") as log:
            job = subprocess.Popen(command, cwd=run, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
            if mode == "hang":
                _stacks_while_hung(job.pid, run / "launcher.log", step, run / "stacks")
            try:
                job.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        kernel = [line for line in _dmesg() if line not in set(dmesg_before)]
        if cgroup:
            cgroup.rmdir()
        if b"connectFullMesh failed" in (run / "launcher.log").read_bytes():
            raise SystemExit(f"{name}: the restarted ranks could not connect; is"
                             " TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 honoured?")
        dest.mkdir(parents=True)
        shutil.copy2(run / "launcher.log", dest / "launcher.log")
        for error in (run / "torchrun").rglob("error.json"):
            target = dest / "torchrun" / error.relative_to(run / "torchrun").parts[-3] / \
                error.parent.name / "error.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(error, target)
        for folder in ("fr", "stacks", "ckpt"):
            if (run / folder).is_dir() and any((run / folder).iterdir()):
                shutil.copytree(run / folder, dest / folder)
        if any("Killed process" in line for line in kernel):
            (dest / "kernel.log").write_text("\n".join(kernel) + "\n")
    (dest / "expected.json").write_text(json.dumps(
        {"injected": f"incident_probe.py --fail {mode} --rank {rank} --step {step}",
         "kind": kind, "rank": want_rank, "phase": phase, "recovery": recovery,
         "exit_status": job.returncode}, indent=1) + "\n")
    print(f"{name}: torchrun exited {job.returncode}; kept"
          f" {sorted(p.name for p in dest.iterdir())}")


def _stacks_while_hung(launcher: int, log: Path, step: int, dest: Path) -> None:
    """py-spy dump of each worker a second after the log shows the step the hang follows
    (the hung rank asleep, the others waiting in their next collective)."""
    dest.mkdir()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and f"[step {step}]".encode() not in log.read_bytes():
        time.sleep(0.2)
    time.sleep(1.0)
    for pid, rank in _workers(launcher).items():
        dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True,
                              text=True, timeout=30)
        (dest / f"rank-{rank}.txt").write_text(dump.stdout)


def _workers(launcher: int) -> dict[int, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().split()
        except OSError:
            continue
        if int(stat[3]) == launcher:
            ranks = [v for v in environ if v.startswith(b"RANK=")]
            if ranks:
                found[int(entry.name)] = int(ranks[0][5:])
    return found


def _dmesg() -> list[str]:
    try:
        return subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "incidents")
    parser.add_argument("--only", action="append", choices=sorted(CASES))
    ns = parser.parse_args()
    for name in ns.only or CASES:
        run_case(name, ns.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
