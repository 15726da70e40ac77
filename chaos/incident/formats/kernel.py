"""The kernel's OOM killer as dmesg or the journal print it.

    [12345.678901] Out of memory: Killed process 3197 (python3.11) total-vm:...
    Memory cgroup out of memory: Killed process 3197 (python3.11) total-vm:...
    oom-kill:constraint=CONSTRAINT_MEMCG,...,task=python3.11,pid=3197,uid=0

The pid is matched to a rank by what the launcher's log says of that pid.
"""

from __future__ import annotations

import re

from torchchaos.incident.formats import text
from torchchaos.incident.observations import Observation, Source
from torchchaos.incident.readers import Reader

KILLED = re.compile(r"(Memory cgroup out of memory|Out of memory): "
                    r"Killed process (\d+) \(([^)]*)\)")
OOM_KILL = re.compile(r"oom-kill:.*?task=([^,]+),pid=(\d+)")


class KernelLog(Reader):
    name = "kernel"
    summary = "the kernel's OOM-killer lines (dmesg, journalctl -k)"

    def sniff(self, data: bytes, name: str) -> bool:
        return text.says_any(data, KILLED, OOM_KILL)

    def read(self, data: bytes, name: str) -> list[Observation]:
        found, pids = [], set()
        for number, line in enumerate(text.decode(data).splitlines(), 1):
            m = KILLED.search(line)
            pid = int(m.group(2)) if m else None
            if m is None and (k := OOM_KILL.search(line)):
                pid = int(k.group(2))
            if pid is None or pid in pids:
                continue
            pids.add(pid)
            cgroup = "cgroup" if m and m.group(1).startswith("Memory cgroup") \
                or "CONSTRAINT_MEMCG" in line else "machine"
            found.append(Observation("oom_kill", Source(name, number), pid=pid,
                                     signal="SIGKILL", reason="OOM killer",
                                     detail=line.strip()[-200:], extra={"scope": cgroup}))
        return found
