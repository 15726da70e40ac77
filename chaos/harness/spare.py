"""Launchers held ready: a warm job's torchrun forked from a process that has torch
imported already (`torchchaos.rank.launcher_server`), instead of a new interpreter that
imports it again for every launch (6-8 s of CPU each on 2 cores).

`launch(command, env, cwd, log)` returns a process handle with the parts of
`subprocess.Popen` a `Job` uses (pid, poll, wait), or None where a launcher cannot be
served (the command is not a plain warm launcher, the user turned it off with
TORCHCHAOS_SPARE_LAUNCHER=0, the server failed): the caller then starts it as before.

One server per harness process and per environment a launcher imports with (the job's
environment less the run's own marks, which differ every run): what torch reads at
import, PYTHONPATH and the str-hash seed among it. The first job of each pays the
imports once, as before; every later launch and relaunch is a fork. A server ends when
its harness does (its stdin closes).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torchchaos import env
from torchchaos.host import shortcuts

LAUNCHER = [sys.executable, "-m", "torchchaos.rank.warmrun"]
# set for each run besides the TORCHCHAOS_ marks, or for each test by pytest: no import
# reads them, and a server for each value would import torch again for every job
PER_RUN = ("TMPDIR", "PYTEST_CURRENT_TEST")
START_SECONDS = 300.0  # a server's imports, on a machine loaded many times over
MAX_SERVERS = 2  # idle ones kept: the usual job's environment and one other
SOCKET_NAME = "launchers.sock"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes

Key = frozenset[tuple[str, str]]
_servers: dict[Key, LauncherServer] = {}
_shared: dict[Key, LauncherServer] = {}  # this process's lent server: never closed early
_refused: set[Key] = set()  # environments the lent server we were given does not serve
_servers_lock = threading.Lock()


def launch(command: list[str], environ: dict[str, str], cwd: str,
           log: str) -> ServedLauncher | None:
    """The launcher `command` would start, forked from a server; None: start it yourself."""
    if command[:3] != LAUNCHER or os.environ.get(env.SPARE_LAUNCHER) == "0":
        return None
    server = _server_for(environ)
    return server.launch(command[3:], environ, cwd, log) if server is not None else None


def prepare(environ: dict[str, str]) -> None:
    """Have the server a launch with this environment will use ready now: its imports are
    the harness's overhead, not the job's time (a `time=` trigger counts from the job's
    start, which comes after this)."""
    if os.environ.get(env.SPARE_LAUNCHER) == "0":
        return
    server = _server_for(environ)
    if server is not None:
        server.wait_ready()


def share(environ: dict[str, str], folder: Path | str) -> str | None:
    """Lend the harnesses this process starts from now on its server for `environ` (a
    job's environment): start it listening in `folder` and set TORCHCHAOS_LAUNCHER_SOCKET
    for them. Returns the socket's path, or None where nothing is lent (turned off, the
    path too long for a socket)."""
    # a deep folder (a cluster job's TMPDIR) is reached through a short link
    room = len(SOCKET_NAME) + 1  # "/launchers.sock"
    path = str(shortcuts.short_folder(Path(folder).resolve(), room, MAX_SOCKET_PATH)
               / SOCKET_NAME)
    if os.environ.get(env.SPARE_LAUNCHER) == "0" or len(path.encode()) > MAX_SOCKET_PATH:
        return None
    key, base = _key(environ)
    with _servers_lock:
        if key not in _shared or not _shared[key].usable():
            Path(path).unlink(missing_ok=True)  # a server that was killed left it
            _shared[key] = LauncherServer(base, listen=path)
        server = _shared[key]
    # it binds before its imports: a harness started after this finds it listening
    deadline = time.monotonic() + START_SECONDS
    while not os.path.exists(path):
        if not server.usable() or time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    os.environ[env.LAUNCHER_SOCKET] = path
    return path


def _key(environ: dict[str, str]) -> tuple[Key, dict[str, str]]:
    """What a launcher imports with: the job's environment less what differs every run."""
    base = {k: v for k, v in environ.items()
            if not k.startswith("TORCHCHAOS_") and k not in PER_RUN}
    return frozenset(base.items()), base


def _server_for(environ: dict[str, str]) -> LauncherServer | None:
    key, base = _key(environ)
    with _servers_lock:
        if key in _shared and _shared[key].usable():
            return _shared[key]
        server = _servers.get(key)
        if server is not None and server.usable():
            return server
        if server is not None:
            del _servers[key]
        idle = [k for k, s in _servers.items() if s.idle()]  # oldest first
        for old in idle[:max(0, len(_servers) - MAX_SERVERS + 1)]:
            _servers.pop(old).close()  # one with launchers running stays
        server = _lent(key, base) or LauncherServer(base)
        _servers[key] = server
        return server


def _lent(key: Key, base: dict[str, str]) -> LauncherServer | None:
    """The server another process lent us (TORCHCHAOS_LAUNCHER_SOCKET), if it serves this
    environment; None: start one of our own."""
    path = os.environ.get(env.LAUNCHER_SOCKET)
    if not path or key in _refused:
        return None
    server = LauncherServer.connect(path, base)
    if server is None:
        _refused.add(key)
    return server


class LauncherServer:
    """The harness's side of one `torchchaos.rank.launcher_server`: one it started (and
    lends, given `listen`), or, through `connect`, one another process lent it."""

    def __init__(self, base: dict[str, str], listen: str | None = None,
                 channel: _Channel | None = None) -> None:
        if channel is None:
            channel = _Channel.started(base, listen)
        self._channel = channel
        self._ids = itertools.count()
        self._lock = threading.Lock()  # one request at a time on the pipe
        self._changed = threading.Condition()
        self._ready = channel.ready
        self._answers: dict[int, dict[str, Any]] = {}
        self._codes: dict[int, int] = {}
        self._started: set[int] = set()
        self._reader = threading.Thread(target=self._read, name="torchchaos-spare",
                                        daemon=True)
        self._reader.start()

    @classmethod
    def connect(cls, path: str, base: dict[str, str]) -> LauncherServer | None:
        """The server listening at `path`, if it serves launchers with this environment."""
        channel = _Channel.connected(path, base)
        return cls(base, channel=channel) if channel is not None else None

    @property
    def pid(self) -> int:
        return self._channel.pid

    def usable(self) -> bool:
        return self._channel.alive()

    def idle(self) -> bool:
        """No launcher of this server is running."""
        with self._changed:
            return self._started <= set(self._codes)

    def wait_ready(self) -> bool:
        return self._wait_for(lambda: self._ready, START_SECONDS)

    def launch(self, argv: list[str], environ: dict[str, str], cwd: str,
               log: str) -> ServedLauncher | None:
        with self._lock:
            if not self._wait_for(lambda: self._ready, START_SECONDS):
                return None
            ident = next(self._ids)
            request = {"id": ident, "argv": argv, "env": environ, "cwd": cwd, "log": log}
            try:
                self._channel.send(request)
            except OSError:
                return None
            if not self._wait_for(lambda: ident in self._answers, START_SECONDS):
                return None
            answer = self._answers.pop(ident)
        if "started" not in answer:
            return None
        return ServedLauncher(self, answer["started"])

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            code = self._codes.get(pid)
        if code is None and not self.usable() and not _alive(pid):
            return -signal.SIGKILL  # ended after its server, which could not say how
        return code

    def wait_for_exit(self, pid: int, timeout: float | None) -> int | None:
        self._wait_for(lambda: pid in self._codes, timeout)
        return self.exit_code(pid)

    def close(self) -> None:
        """Let it end (it reads the end of its stdin once its imports are done), or hang
        up on a lent one; not waited for: the next job need not wait on it."""
        self._channel.close()

    def _wait_for(self, condition: Any, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not condition():
                if not self._channel.alive() and not self._reader.is_alive():
                    return bool(condition())
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(0.5 if left is None else min(left, 0.5))
            return True

    def _read(self) -> None:
        for message in self._channel.messages():
            with self._changed:
                if "ready" in message:
                    self._ready = True
                elif "exited" in message:
                    self._codes[message["exited"]] = message["code"]
                else:
                    self._answers[message["id"]] = message
                    if "started" in message:  # a new process: a code its pid had is old
                        self._codes.pop(message["started"], None)  # (pids wrap: 32768 here)
                        self._started.add(message["started"])
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()


class _Channel:
    """The lines between a harness and a server: the pipes of one it started, or a
    connection to one lent to it."""

    def __init__(self, send: Callable[[bytes], None], lines: Iterator[bytes],
                 alive: Callable[[], bool], close: Callable[[], None],
                 pid: int, ready: bool) -> None:
        self._send, self._lines, self.alive, self.close = send, lines, alive, close
        self.pid = pid  # the server's
        self.ready = ready  # a lent server said it was, in answer to hello

    @classmethod
    def started(cls, base: dict[str, str], listen: str | None) -> _Channel:
        from torchchaos.rank import launcher_server as served

        room = {served.ROOM_VARIABLE: "x" * served.ROOM_BYTES}
        proc = subprocess.Popen(
            [sys.executable, "-m", "torchchaos.rank.launcher_server",
             *(["--listen", listen] if listen else [])], env={**base, **room},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd="/", start_new_session=True)
        assert proc.stdin is not None and proc.stdout is not None
        stdin = proc.stdin

        def send(data: bytes) -> None:
            stdin.write(data)
            stdin.flush()

        return cls(send, iter(proc.stdout), lambda: proc.poll() is None, stdin.close,
                   proc.pid, ready=False)

    @classmethod
    def connected(cls, path: str, base: dict[str, str]) -> _Channel | None:
        """Say hello to the server at `path`; None if it is gone or serves another
        environment."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(START_SECONDS)  # a lent server answers once its imports are done
            conn.connect(path)
            conn.sendall(json.dumps({"hello": base}).encode() + b"\n")
            reader = conn.makefile("rb")
            answer = json.loads(reader.readline() or b"{}")
            conn.settimeout(None)
        except (OSError, ValueError):
            conn.close()
            return None
        if "ready" not in answer:
            conn.close()
            return None
        closed = threading.Event()

        def lines() -> Iterator[bytes]:
            try:
                yield from reader
            except OSError:
                pass
            closed.set()

        def close() -> None:
            closed.set()
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes the reader; close alone would not
            except OSError:
                pass
            conn.close()

        return cls(conn.sendall, lines(), lambda: not closed.is_set(), close,
                   int(answer["ready"]), ready=True)

    def send(self, request: dict[str, Any]) -> None:
        self._send(json.dumps(request).encode() + b"\n")

    def messages(self) -> Iterator[dict[str, Any]]:
        for line in self._lines:
            yield json.loads(line)


class ServedLauncher:
    """A launcher the server forked, as much of `subprocess.Popen` as a Job uses."""

    def __init__(self, server: LauncherServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            self.returncode = self.server.wait_for_exit(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"launcher {self.pid}", timeout or 0)
        return self.returncode

    def __repr__(self) -> str:
        return f"<served launcher {self.pid} returncode={self.returncode}>"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
