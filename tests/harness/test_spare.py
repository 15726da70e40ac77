"""Launchers held ready (torchchaos.harness.spare, torchchaos.rank.launcher_server): a
launcher forked from the server is, from outside, the run's own process (its marks in
/proc/PID/environ, its ranks' too), ends with torchrun's exit code, and the server
ends with the harness that started it. A server one process lends (`spare.share`) forks
the launchers of the harnesses it starts, for the environment it was started with only,
and ends with its owner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    stat = Path(f"/proc/{os.getppid()}/stat").read_text()
    Path("launchers-parent.txt").write_text(stat[stat.rindex(")") + 2:].split()[1])
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
""")


def _job(tmp_path, extra: dict[str, str]) -> tuple[list[str], dict[str, str], str]:
    """A probe job's launcher command, environment and run id."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    run_id = uuid.uuid4().hex[:12]
    # as a harness does before its run starts: a harness starting in another pytest
    # worker sweeps (SIGKILL) the processes of runs that no live harness owns
    lifeline.own(run_id, tmp_path)
    environ = {**os.environ, "PYTHONHASHSEED": "0", env.RUN_ID: run_id,
               "TMPDIR": str(tmp_path), **extra}  # torchrun's torchelastic_* in the test's
    command = [*spare.LAUNCHER, "--nproc-per-node", "2", "--standalone", str(script)]
    return command, environ, run_id


def _launch(tmp_path, extra: dict[str, str]) -> tuple[spare.ServedLauncher, str]:
    command, environ, run_id = _job(tmp_path, extra)
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
    print(server.pid, flush=True)
    os._exit(0)  # no clean-up: as a harness that is killed
""")


def _wait_until_ended(pid: int, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie":
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_the_server_ends_with_its_harness(tmp_path):
    done = subprocess.run([sys.executable, "-c", HARNESS, str(REPO / "tests")],
                          capture_output=True, text=True, timeout=120)
    server = int(done.stdout.split()[0])
    # it reads its stdin once its imports are done
    _wait_until_ended(server, 120, "the server outlived its harness")


OWNER = textwrap.dedent("""\
    import json, os, sys
    from torchchaos.harness import spare
    environ = json.loads(sys.argv[2])
    print(spare.share(environ, sys.argv[1]), flush=True)
    sys.stdin.read()  # lends its server until the test closes this
""")


@contextmanager
def _lending_owner(tmp_path, environ: dict[str, str], folder: Path | None = None
                   ) -> Iterator[tuple[subprocess.Popen, str]]:
    """A process that lends its launcher server for `environ` in `folder` (default:
    tmp_path/owner), and the server's socket; ended (its stdin closed) when the block
    is left."""
    folder = folder or tmp_path / "owner"
    folder.mkdir(parents=True)
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(folder), json.dumps(environ)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert owner.stdin is not None and owner.stdout is not None
    try:
        yield owner, owner.stdout.readline().strip()
    finally:
        owner.stdin.close()
        owner.wait(timeout=60)


def test_a_harness_forks_its_launchers_from_the_server_lent_to_it(tmp_path, monkeypatch):
    command, environ, _ = _job(tmp_path, {"PROBE_EXIT": "3"})
    with _lending_owner(tmp_path, environ) as (owner, path):
        # a harness started by the owner: the variable set, no server of its own yet
        monkeypatch.setenv(env.LAUNCHER_SOCKET, path)
        monkeypatch.setattr(spare, "_servers", {})
        monkeypatch.setattr(spare, "_refused", set())
        served = spare.launch(command, environ, str(tmp_path), str(tmp_path / "launch.log"))
        assert served is not None
        assert served.wait(timeout=300) == 1, "torchrun's code, as the lent server saw it"
        launchers_parent = int((tmp_path / "launchers-parent.txt").read_text())
        assert launchers_parent == served.server.pid != os.getpid()
        assert psutil.Process(launchers_parent).ppid() == owner.pid


def test_a_lent_server_serves_the_environment_it_was_started_with_only(tmp_path):
    _, environ, _ = _job(tmp_path, {})
    with _lending_owner(tmp_path, environ) as (_, path):
        _, base = spare._key(environ)  # what a harness sends: less the run's own marks
        other = spare.LauncherServer.connect(path, {**base, "OMP_NUM_THREADS": "7"})
        assert other is None, "a launcher would import with the owner's environment"
        same = spare.LauncherServer.connect(path, base)
        assert same is not None and same.usable()
        same.close()


def test_a_harness_that_hangs_up_takes_its_launchers_along(tmp_path):
    """A harness interrupted while its launch request waits in the server's socket
    (a battery stopped by SIGTERM on a busy machine): the server forks that launcher
    after the harness's reap, and the launcher carried the run's marks and ran on."""
    command, environ, _ = _job(tmp_path, {})
    (tmp_path / "probe.py").write_text("import time\ntime.sleep(120)\n")
    with _lending_owner(tmp_path, environ) as (_, path):
        _, base = spare._key(environ)
        server = spare.LauncherServer.connect(path, base)
        assert server is not None
        served = server.launch(command[len(spare.LAUNCHER):], environ, str(tmp_path),
                               str(tmp_path / "launch.log"))
        assert served is not None
        server.close()  # gone, as far as the server can tell
        _wait_until_ended(served.pid, 30, "the launcher outlived the harness that asked")


def test_a_lent_server_ends_with_its_owner_and_takes_its_socket_along(tmp_path):
    _, environ, _ = _job(tmp_path, {})
    with _lending_owner(tmp_path, environ) as (owner, path):
        _, base = spare._key(environ)
        server = spare.LauncherServer.connect(path, base)
        assert server is not None
        owner.kill()  # no clean-up: its server reads the end of its stdin
        owner.wait()
        _wait_until_ended(server.pid, 60, "the lent server outlived its owner")
        assert not Path(path).exists()
        assert spare.LauncherServer.connect(path, base) is None


def test_a_server_lent_from_a_deep_folder_listens_through_a_short_link(tmp_path):
    """A cluster job's TMPDIR one folder below /tmp made pytest's basetemp too deep for
    a socket: lending was turned off without a word and every launch started cold."""
    command, environ, _ = _job(tmp_path, {"PROBE_EXIT": "3"})
    deep = tmp_path / ("a-cluster-jobs-own-temporary-folder-" * 3)
    assert len(str(deep / spare.SOCKET_NAME)) > spare.MAX_SOCKET_PATH
    with _lending_owner(tmp_path, environ, deep) as (owner, path):
        assert path != "None" and len(path) <= spare.MAX_SOCKET_PATH, path
        link = Path(path).parent
        assert link.is_symlink() and link.resolve() == deep.resolve()
        _, base = spare._key(environ)
        server = spare.LauncherServer.connect(path, base)
        assert server is not None and server.usable()
        server.close()
        assert (deep / spare.SOCKET_NAME).exists(), "the socket itself lies in the folder"
    assert not os.path.lexists(link), "the link goes with the process that lent it"



class _Said:
    """A server's side of the channel that has said `lines` and then stays open."""

    def __init__(self, lines: list[dict]) -> None:
        self.lines, self.ready, self.pid = lines, True, 0

    def messages(self):
        yield from self.lines

    def alive(self) -> bool:
        return True


def test_a_launcher_with_the_pid_of_one_that_ended_is_running_not_ended():
    """Pids wrap (pid_max 32768 on this machine kind: a CI session forks past it): a new
    launcher given the pid of one this server saw end is running. Taken for ended, its job
    was judged over at once, before its ranks booted (a false alarm seen in CI)."""
    said = [{"started": 4242, "id": 0}, {"exited": 4242, "code": 0},
            {"started": 4242, "id": 1}]
    server = spare.LauncherServer({}, channel=_Said(said))  # type: ignore[arg-type]
    server._reader.join(timeout=10)
    assert server.exit_code(4242) is None
    assert not server.idle()
