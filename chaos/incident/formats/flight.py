"""Flight-recorder dumps, as torch's own recorder writes them (TORCH_FR_BUFFER_SIZE on).

NCCL writes one per rank on a watchdog timeout, to `$TORCH_FR_DUMP_TEMP_FILE<rank>`;
with gloo (which records entries in torch 2.13 but dumps on no timeout) a script
writes `torch._C._distributed_c10d._dump_fr_trace()` itself. The dump is a pickle of

    {"version": "2.x", "pg_config": {...}, "entries": [{"collective_seq_id": 3,
      "profiling_name": "gloo:all_reduce", "state": "scheduled" | "started" |
      "completed", "process_group": ("0", "default_pg"), ...}, ...]}

or the same as JSON (`_dump_fr_trace_json`). A pickle is read with an unpickler
that builds only plain containers, numbers and text: a dump never runs code.
What is kept per rank: its last collective's sequence number and name, and the
first one it did not see complete. The rank that is behind the others is the one
they wait for (torch.distributed.flight_recorder's own reading).
"""

from __future__ import annotations

import io
import json
import pickle
import re
from typing import Any

from torchchaos.incident.observations import Observation, Source
from torchchaos.incident.readers import BadArtefact, Reader

RANK_SUFFIX = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


class FlightRecorder(Reader):
    name = "flight"
    summary = "torch's flight-recorder dumps (pickle or JSON), one per rank"
    structured = True

    def sniff(self, data: bytes, name: str) -> bool:
        if data[:1] == b"\x80":  # a pickle's protocol mark
            return b"entries" in data[:65536] and b"pg_config" in data
        return data.lstrip()[:1] == b"{" and b'"entries"' in data[:65536] \
            and b'"pg_config"' in data

    def read(self, data: bytes, name: str) -> list[Observation]:
        dump = _load(data)
        entries = dump.get("entries")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise BadArtefact("a flight-recorder dump whose entries are not a list of records")
        m = RANK_SUFFIX.search(name.rsplit("/", 1)[-1])
        rank = dump.get("rank") if isinstance(dump.get("rank"), int) else \
            int(m.group(1)) if m else None
        collectives = [e for e in entries if not e.get("is_p2p")
                       and isinstance(e.get("collective_seq_id"), int)]
        if not collectives:
            return [Observation("flight", Source(name, key="entries"), rank=rank,
                                detail="no collective recorded")]
        last = max(collectives, key=lambda e: e["collective_seq_id"])
        pending = [e for e in collectives if e.get("state") in ("scheduled", "started")
                   and not e.get("retired", False)]
        op = str(last.get("profiling_name", "")).split(":")[-1] or None
        return [Observation(
            "flight", Source(name, key=f"entries[{entries.index(last)}]"), rank=rank,
            seq=last["collective_seq_id"], collective=op,
            detail=f"last collective #{last['collective_seq_id']} {op} ({last.get('state')})",
            extra={"pending_seq": min((e["collective_seq_id"] for e in pending), default=None),
                   "states_recorded": sorted({str(e.get("state")) for e in collectives}),
                   "entries": len(entries)})]


def _load(data: bytes) -> dict[str, Any]:
    if data[:1] == b"\x80":
        try:
            dump = _PlainUnpickler(io.BytesIO(data)).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
                KeyError, AttributeError, MemoryError) as exc:
            raise BadArtefact(f"a flight-recorder pickle that does not load: {exc}"[:200]) \
                from None
    else:
        try:
            dump = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadArtefact(f"a flight-recorder JSON dump that does not parse: {exc}"[:200]) \
                from None
    if not isinstance(dump, dict):
        raise BadArtefact("a flight-recorder dump that is not a mapping")
    return dump
