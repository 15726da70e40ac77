"""The collectives a rank enters, and who entered them (torchchaos.rank.syncwatch)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

PROGRAM = """
import json, os, shutil, sys, tempfile, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed import distributed_c10d
from torchchaos.rank import syncwatch
seen = []
syncwatch.install(lambda op, group, by_torch: seen.append(
    {"op": op, "group": group, "by_torch": by_torch}))
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
dist.barrier()
dist.all_gather_object([None], {"a": 1})  # calls all_gather inside: one collective
dist.all_reduce(torch.ones(2))
distributed_c10d.broadcast(torch.ones(2), 0)  # imported from where it lives
scripts = len(seen)
folder = tempfile.mkdtemp()
dcp.save({"w": torch.ones(4)}, checkpoint_id=folder)  # gathers its plan inside
shutil.rmtree(folder)
dist.destroy_process_group()
print(scripts, file=sys.stderr)
print(json.dumps(seen))
"""


def test_each_collective_a_rank_enters_is_seen_once_with_who_called_it():
    from torchchaos.host.netns import free_port

    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=120, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PORT": str(free_port()),
                               "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    scripts = int(done.stderr.strip().splitlines()[-1])
    assert [s["op"] for s in seen[:scripts]] == ["barrier", "all_gather_object", "all_reduce",
                                                "broadcast"]
    assert {s["group"] for s in seen} == {"world"}
    # the script's own, then the save's: a collective inside a torch API is torch's
    assert not any(s["by_torch"] for s in seen[:scripts])
    assert seen[scripts:] and all(s["by_torch"] for s in seen[scripts:])
