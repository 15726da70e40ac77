"""A warm launcher held ready: one process per harness that has imported what a job's
launcher needs, and forks a `torchchaos.rank.warmrun` launcher for each job it is asked.

A warm job's launcher spends 6-8 s of CPU importing torch, torch.distributed.run and
torch._dynamo before torchrun starts (on 2 cores; 59 of the battery's 75 s). This
process pays that once: `python -m torchchaos.rank.launcher_server` imports them, then
reads one request a line on stdin (JSON: argv, env, cwd, log) and forks a launcher that
becomes `python -m torchchaos.rank.warmrun ARGV` in that folder, with that environment
and its output in that log, in a session of its own. It answers on stdout, one JSON line
each: `{"ready": ...}` once, `{"started": pid, "id": ...}` per request (or
`{"failed": why, "id": ...}`), and `{"exited": pid, "code": ...}` when a launcher ends,
the code as `subprocess.Popen.returncode` has it. It ends when its stdin closes: the
harness that started it is gone (`torchchaos.harness.spare` is that side).

What a launcher forked here must look like from outside is the run's own process: the
harness finds, reaps and watches a run's processes by the marks in their initial
environment (/proc/PID/environ, `torchchaos.host.procs`), which a forked process shares
with its parent. So this server starts with room in its environment (ROOM_VARIABLE,
ROOM_BYTES of padding) and each launcher writes its job's environment over that memory
(`_rewrite_environ`): its ranks, forked from it, show it too. No capability is needed,
as setproctitle rewrites argv. Single-threaded on purpose: a fork copies only the
forking thread, and a lock another thread held would stay held in the launcher.

Shared (`--listen PATH`): it also serves other harnesses on that Unix socket, each on a
connection of its own with the same lines, opened by `{"hello": ENV}`, the environment
the client's launchers import with. It answers `{"ready": pid}` if that is the one it
started with, else `{"refused": why}` (the client starts a server of its own). Each
launcher's `exited` goes to the connection that asked for it. It still ends with its
owner's stdin, and removes the socket then.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOM_VARIABLE = "TORCHCHAOS_ENVIRON_ROOM"
ROOM_BYTES = 1 << 16  # a job's environment is a few KB; more is refused, not cut
POLL_SECONDS = 0.05  # how often ended launchers are looked for between requests


Reply = Callable[[dict[str, Any]], None]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    started_with = {k: v for k, v in os.environ.items() if k != ROOM_VARIABLE}
    # bound before the imports: a client that comes meanwhile waits in the backlog
    listener = _listen(args[1]) if args[:1] == ["--listen"] else None
    try:
        _serve_until_owner_leaves(listener, started_with)
    finally:
        if listener is not None:
            Path(args[1]).unlink(missing_ok=True)


def _serve_until_owner_leaves(listener: socket.socket | None,
                              started_with: dict[str, str]) -> None:
    from torchchaos.rank import agent, warmrun

    for name in agent.WARM_IMPORTS:
        importlib.import_module(name)
    del warmrun  # imported for what it imports (torch.distributed.run)
    _say({"ready": os.getpid()})
    clients: dict[int, _Client] = {0: _Client(None, _say)}  # by fd; 0: the owner
    asked_by: dict[int, _Client] = {}  # launcher pid -> the harness its "exited" goes to
    listening = [listener] if listener is not None else []
    while True:
        waiting = [*clients, *(sock.fileno() for sock in listening)]
        readable, _, _ = select.select(waiting, [], [], POLL_SECONDS)
        for fd in readable:
            if listener is not None and fd == listener.fileno():
                conn, _ = listener.accept()
                clients[conn.fileno()] = _Client(conn, _replier(conn))
                continue
            client = clients[fd]
            chunk = client.read()
            if not chunk:
                # that harness is gone (a harness hangs up on a server with no launcher
                # running, or at its end), and so are the launchers it asked for: one
                # forked from a request it sent just before it died carries its run's
                # marks only once it runs, after the harness's reap, and would run on
                _end_launchers_of(client, asked_by)
                if fd == 0:
                    return  # its lifeline reaps what else its runs left
                client.close()
                del clients[fd]
                continue
            for request in client.requests(chunk):
                if "hello" in request:
                    client.hello(request["hello"] == started_with, os.getpid())
                elif client.welcome:
                    sockets = [c.conn for c in clients.values() if c.conn is not None]
                    pid = _serve(request, client.reply, [*sockets, *listening])
                    if pid is not None:
                        asked_by[pid] = client
        _report_ended(asked_by)


def _listen(path: str) -> socket.socket:
    """A socket listening at `path`. It is bound under another name and moved there once
    it listens: a client that found the path between the bind and the listen had its
    connect refused, and went without the server (a lent server's test, 1 in a CI run)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = path + "~"  # within sun_path: spare.MAX_SOCKET_PATH leaves room for it
    Path(staging).unlink(missing_ok=True)
    listener.bind(staging)
    os.chmod(staging, 0o600)  # the harnesses of the user that started it, no one else's
    listener.listen(64)
    os.replace(staging, path)
    return listener


def _replier(conn: socket.socket) -> Reply:
    def reply(message: dict[str, Any]) -> None:
        try:
            conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # that harness is gone: what it started is its lifeline's
    return reply


class _Client:
    """One harness on the other end: the owner (stdin, stdout) or a connection."""

    def __init__(self, conn: socket.socket | None, reply: Reply) -> None:
        self.conn, self.reply = conn, reply
        self.welcome = conn is None  # a connection says hello first
        self._pending = b""

    def read(self) -> bytes:
        try:
            return self.conn.recv(1 << 16) if self.conn is not None else os.read(0, 1 << 16)
        except OSError:
            return b""

    def requests(self, chunk: bytes) -> list[dict[str, Any]]:
        self._pending += chunk
        lines = self._pending.split(b"\n")
        self._pending = lines.pop()
        return [json.loads(line) for line in lines if line]

    def hello(self, same_environment: bool, pid: int) -> None:
        self.welcome = same_environment
        self.reply({"ready": pid} if same_environment else
                   {"refused": "its launchers import with another environment"})

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _say(message: dict[str, Any]) -> None:
    os.write(1, json.dumps(message).encode() + b"\n")


def _serve(request: dict[str, Any], reply: Reply,
           not_for_launcher: list[socket.socket]) -> int | None:
    """Fork the asked launcher; its pid, or None where it could not be."""
    block = b"".join(f"{k}={v}".encode() + b"\0" for k, v in request["env"].items())
    start, end = _environ_region()
    if len(block) > end - start:
        reply({"failed": f"the job's environment ({len(block)} bytes) does not fit the"
                         f" {end - start} bytes held for it", "id": request["id"]})
        return None
    pid = os.fork()
    if pid == 0:
        for sock in not_for_launcher:  # its ranks, forked from it, would hold them open
            os.close(sock.detach())
        _become_launcher(request, block.ljust(end - start, b"\0"), start)
    reply({"started": pid, "id": request["id"]})
    return pid


def _report_ended(asked_by: dict[int, _Client]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        client = asked_by.pop(pid, None)
        (client.reply if client is not None else _say)(
            {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _end_launchers_of(client: _Client, asked_by: dict[int, _Client]) -> None:
    """SIGKILL the launchers `client` asked for that still run, with their ranks."""
    for pid in [pid for pid, asker in asked_by.items() if asker is client]:
        try:
            if os.getpgid(pid) == pid:  # it leads its own group (setsid): ranks and all
                os.killpg(pid, signal.SIGKILL)
            else:  # forked a moment ago, still in this one's group: no ranks yet
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _environ_region() -> tuple[int, int]:
    """Where this process's initial environment lies (/proc/self/stat, fields 50-51)."""
    with open("/proc/self/stat") as stat:
        text = stat.read()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[50 - 3]), int(fields[51 - 3])


def _become_launcher(request: dict[str, Any], block: bytes, start: int) -> None:
    """In the forked child: become `python -m torchchaos.rank.warmrun ARGV` started fresh
    in the job's folder, then end as that interpreter would (never returns)."""
    from torchchaos.rank import warmrun  # main() imported it: no import in the child

    code: Any = 1
    try:
        os.setsid()  # as the harness starts every launcher: a session of its own
        # the C library's environment points into the memory rewritten next: empty it
        # first (unsetenv reads those strings), then give it the job's own copies
        os.environ.clear()
        ctypes.memmove(start, block, len(block))  # /proc/PID/environ now says the job's
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        tempfile.tempdir = None  # TMPDIR is the run's own
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = [warmrun.__file__, *request["argv"]]
        sys.path[0] = request["cwd"]  # what `python -m` puts first
        code = 0
        warmrun.main(request["argv"])
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it
        sys.excepthook(*sys.exc_info())
        code = 1
    warmrun.shut_down()  # as the interpreter it stands for would end
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    os._exit(code)


if __name__ == "__main__":
    main()
