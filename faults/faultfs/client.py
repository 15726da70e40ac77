"""Send one command to a fault filesystem daemon (from the harness or a rank)."""

from __future__ import annotations

import json
import os
import socket
from typing import Any


def short_address(path: str, use: Any) -> None:
    """Call `use(address)` with an address for the unix socket at `path` that fits in
    the 108 bytes a socket address holds, however deep the run directory is: the path
    through a descriptor of its folder. (An abstract socket would need no file, but
    abstract names are private to a network namespace, and simulated nodes each
    have their own.)"""
    folder, name = os.path.split(path)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        use(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


def request(socket_path: str, command: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """One JSON line out, one JSON line back; raises OSError if the daemon is gone."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        short_address(socket_path, conn.connect)
        conn.sendall(json.dumps(command).encode() + b"\n")
        reply = conn.makefile("rb").readline()
    if not reply:
        raise OSError("the fault filesystem closed the connection")
    return json.loads(reply)
