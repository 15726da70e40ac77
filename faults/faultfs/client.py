"""Send one command to a fault filesystem daemon (from the harness or a rank)."""

from __future__ import annotations

import json
import socket
from typing import Any


def request(socket_name: str, command: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """One JSON line out, one JSON line back; raises OSError if the daemon is gone."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect("\0" + socket_name)  # abstract namespace: no path length limit, no file
        conn.sendall(json.dumps(command).encode() + b"\n")
        reply = conn.makefile("rb").readline()
    if not reply:
        raise OSError("the fault filesystem closed the connection")
    return json.loads(reply)
