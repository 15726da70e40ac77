"""Launchers held ready (torchchaos.harness.spare, torchchaos.rank.launcher_server): a
launcher forked from the server is, from outside, the run's own process (its marks in
/proc/PID/environ, its ranks' too), ends with torchrun's exit code, and the server
ends with the harness that started it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
from conftest import REPO

from torchchaos import env
from torchchaos.harness import spare
from torchchaos.host import lifeline

PROBE = textwrap.dedent("""\
    import os, sys
    from pathlib import Path
    marks = Path("/proc/self/environ").read_bytes().split(b"\\0")
    parent = Path(f"/proc/{os.getppid()}/environ").read_bytes().split(b"\\0")
    Path(f"environ-{os.environ['RANK']}.txt").write_bytes(b"\\n".join(marks))
    Path(f"launcher-{os.environ['RANK']}.txt").write_bytes(b"\\n".join(parent))
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
""")


def _launch(tmp_path, extra: dict[str, str]) -> tuple[spare.ServedLauncher, str]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    run_id = uuid.uuid4().hex[:12]
    # as a harness does before its run starts: a harness starting in another pytest
    # worker sweeps (SIGKILL) the processes of runs that no live harness owns
    lifeline.own(run_id, tmp_path)
    environ = {**os.environ, "PYTHONHASHSEED": "0", env.RUN_ID: run_id,
               "TMPDIR": str(tmp_path), **extra}  # torchrun's torchelastic_* in the test's
    command = [*spare.LAUNCHER, "--nproc-per-node", "2", "--standalone", str(script)]
    served = spare.launch(command, environ, str(tmp_path), str(tmp_path / "launch.log"))
    assert served is not None, "a plain warm launcher is served"
    return served, run_id


def test_a_served_launcher_and_its_ranks_carry_the_runs_marks(tmp_path):
    served, run_id = _launch(tmp_path, {})
    assert served.wait(timeout=300) == 0, (tmp_path / "launch.log").read_text()
    for rank in (0, 1):
        for name in (f"environ-{rank}.txt", f"launcher-{rank}.txt"):
            lines = (tmp_path / name).read_bytes().splitlines()
            assert f"{env.RUN_ID}={run_id}".encode() in lines, name
            assert not any(line.startswith(b"TORCHCHAOS_ENVIRON_ROOM") for line in lines)


def test_a_served_launcher_ends_with_torchruns_exit_code(tmp_path):
    served, _ = _launch(tmp_path, {"PROBE_EXIT": "3"})
    assert served.wait(timeout=300) == 1  # torchrun's: a worker failed
    assert "exitcode" in (tmp_path / "launch.log").read_text()


HARNESS = textwrap.dedent("""\
    import os, sys
    sys.path.insert(0, sys.argv[1])
    from torchchaos.harness import spare
    server = spare._server_for(dict(os.environ))
    print(server._proc.pid, flush=True)
    os._exit(0)  # no clean-up: as a harness that is killed
""")


def test_the_server_ends_with_its_harness(tmp_path):
    done = subprocess.run([sys.executable, "-c", HARNESS, str(REPO / "tests")],
                          capture_output=True, text=True, timeout=120)
    server = int(done.stdout.split()[0])
    deadline = time.monotonic() + 120  # it reads its stdin once its imports are done
    while psutil.pid_exists(server) and psutil.Process(server).status() != "zombie":
        assert time.monotonic() < deadline, "the server outlived its harness"
        time.sleep(0.1)
