"""A torn checkpoint a resume died on, made by plain torchrun, for `incident import`.

    python bench/torn_checkpoint_corpus.py [--out tests/data/incidents/torn]

Runs tests/scripts/pointer_trainer.py with `--pointer-first` (the pointer moved before
the file is written in place) under plain torchrun, SIGKILLs every process of the job
while rank 0's save of step 20 is under way (the file is there and shorter than the
save of step 10), as a node's loss does, then launches the same command again in the
same folder: the relaunch reads the pointer and dies loading the torn file. Each case
keeps what an engineer is handed:

- `pointer_first_resume_only`: the relaunch's log (`job-2.log`) and the checkpoint
  folder; the first launch's log went with its node;
- `pointer_first_both_logs`: both launches' logs and the checkpoint folder.

A kill that lands after the write finished is tried again (up to 40 times).
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
SCRIPT = REPO / "tests" / "scripts" / "pointer_trainer.py"
ARGS = ["--steps", "30", "--save-every", "10", "--size-mb", "0.5", "--pointer-first"]


def launch(out: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(["torchrun", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
                             str(out), *ARGS], stdout=log.open("wb"), stderr=subprocess.STDOUT)


def torn_once(out: Path) -> bool:
    """One try: the first launch killed inside its 2nd save, then the relaunch."""
    ckpt = out / "ckpt"
    first, second = ckpt / "model_000010.pt", ckpt / "model_000020.pt"
    job = launch(out, out / "job-1.log")
    while job.poll() is None and not first.exists():
        time.sleep(0.01)
    pids = [job.pid, *_processes_of(SCRIPT)]  # torchrun and its workers (own sessions)
    full = None
    while job.poll() is None:
        if full is None and "saved model_000010" in (out / "job-1.log").read_text():
            full = first.stat().st_size
        try:
            if full and second.stat().st_size < full:
                for pid in pids:  # the node is gone: every process of the job at once
                    os.kill(pid, signal.SIGKILL)
                break
        except (FileNotFoundError, ProcessLookupError):
            pass
    job.wait()
    subprocess.run(["pkill", "-KILL", "-f", str(SCRIPT)])
    if not second.exists() or second.stat().st_size >= first.stat().st_size:
        return False
    launch(out, out / "job-2.log").wait()
    return "PytorchStreamReader" in (out / "job-2.log").read_text()


def _processes_of(script: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(script).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def keep(out: Path, case: Path, logs: list[str], expected: dict) -> None:
    case.mkdir(parents=True, exist_ok=True)
    for name in logs:
        shutil.copy(out / name, case / name)
    shutil.copytree(out / "ckpt", case / "ckpt")
    (case / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    sizes = {p.name: p.stat().st_size for p in sorted((case / "ckpt").iterdir())}
    print(f"{case.name}: {sizes}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=REPO / "tests" / "data" / "incidents" / "torn")
    ns = parser.parse_args()
    for attempt in range(40):
        work = Path(tempfile.mkdtemp(prefix="torn-corpus-"))
        try:
            if torn_once(work):
                what = ("rank 0's save of step 20 cut short by a SIGKILL of the whole job"
                        " (the pointer already named it); the relaunch died loading it")
                script = str(SCRIPT.relative_to(REPO))
                keep(work, ns.out / "pointer_first_resume_only", ["job-2.log"],
                     {"injected": what, "kind": "torn_write", "rank": None, "node": None,
                      "phase": "mid_save", "recovery": "failed while loading",
                      "script": script})
                keep(work, ns.out / "pointer_first_both_logs", ["job-1.log", "job-2.log"],
                     {"injected": what, "kind": "torn_write", "told_as": "node",
                      "told_phase": "mid_save", "rank": None, "node": None,
                      "phase": "mid_save", "recovery": "failed while loading",
                      "script": script})
                return 0
            print(f"try {attempt + 1}: the kill came after the save; again", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print("no try tore the save", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
