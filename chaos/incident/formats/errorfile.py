"""torchelastic's error file: the JSON a rank writes where TORCHELASTIC_ERROR_FILE says.

    {"message": {"message": "RuntimeError: boom",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1764188793"},
                 "errorCode": -9}}

(`errorCode` is added by the launcher for a death by signal; an old format has
`message` as plain text and `timestamp` beside it.) torchrun keeps one per
worker at `.../attempt_<n>/<local rank>/error.json`: the path gives both.
"""

from __future__ import annotations

import json

from torchchaos.incident.formats import text
from torchchaos.incident.observations import (
    Observation,
    Source,
    phase_of_frames,
    signal_of_exitcode,
    worker_of,
)
from torchchaos.incident.readers import BadArtefact, Reader


class ErrorFile(Reader):
    name = "errorfile"
    summary = "torchelastic's error file (TORCHELASTIC_ERROR_FILE)"
    structured = True

    def sniff(self, data: bytes, name: str) -> bool:
        head = data.lstrip()[:200]
        return head.replace(b" ", b"").startswith(b'{"message"') or head.startswith(b"{") \
            and b'"message"' in data[:4096] and (b"extraInfo" in data or b'"timestamp"' in data)

    def read(self, data: bytes, name: str) -> list[Observation]:
        doc = load_json(data)
        message = doc.get("message") if isinstance(doc, dict) else None
        if isinstance(message, dict):
            info = message.get("extraInfo") or {}
            detail, stack = message.get("message"), info.get("py_callstack", "")
            stamp, code = info.get("timestamp"), message.get("errorCode")
            key = "message.message"
        elif isinstance(message, str):
            detail, stack, stamp, code = message, "", doc.get("timestamp"), None
            key = "message"
        else:
            raise BadArtefact("an error file without message")
        if not isinstance(detail, str) or not isinstance(stack, str):
            raise BadArtefact("an error file whose message is not text")
        found = text.tracebacks(list(enumerate(stack.splitlines(), 1))) \
            if stack.startswith("Traceback") else []
        frames = found[0][1] if found else ()
        attempt, local = worker_of(name) or (None, None)
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        return [Observation("error", Source(name, key=key), detail=detail.strip()[:500],
                            rank=local, attempt=attempt, frames=frames,
                            phase=phase_of_frames(frames), exitcode=code,
                            signal=signal_of_exitcode(code), time=_stamp(stamp),
                            extra={"local_rank": local} if local is not None else {})]


def load_json(data: bytes) -> object:
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadArtefact("not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        end = len(data.rstrip())
        cut = exc.pos >= end - 1 or exc.msg.startswith("Unterminated")
        why = "cut off" if cut else "not valid JSON"
        raise BadArtefact(f"{why} (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None


def _stamp(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
