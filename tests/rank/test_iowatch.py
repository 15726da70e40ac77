"""The in-process file-event watcher, run in a child process (it patches builtins)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SAVE = textwrap.dedent("""
    import json, os, sys, torch
    from torchchaos.rank.iowatch import IOWatch
    root, die_at = sys.argv[1], int(sys.argv[2])
    seen = []
    def listener(op, path):
        seen.append([op, os.path.relpath(path, root)])
        if len(seen) == die_at:
            os._exit(9)
    IOWatch(root, os.path.join(root, "_chaos"), listener).install()
    os.chdir(root)
    os.makedirs("ckpt", exist_ok=True)
    os.makedirs("ckpt", exist_ok=True)   # the loser of a race between ranks: an event too
    with open("_chaos_ignored.txt", "w") as f:
        f.write("x")
    os.makedirs("_chaos", exist_ok=True)
    with open("_chaos/own.txt", "w") as f:   # the harness's folder: never reported
        f.write("x")
    with open("ckpt/tmp", "wb") as f:
        torch.save({"w": torch.arange(100000.0)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace("ckpt/tmp", "ckpt/step-1.pt")
    fd = os.open("ckpt", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    torch.save({"a": 1}, "ckpt/meta.pt")
    torch.load("ckpt/step-1.pt")
    os.remove("ckpt/meta.pt")
    import tempfile
    fd, name = tempfile.mkstemp(dir="ckpt", prefix="manifest-")
    with os.fdopen(fd, "w") as f:   # a descriptor from os.open, written through Python
        f.write("{}")
    # The file object closed that descriptor, not os.close: its number comes back
    # for an unwatched file (the heartbeat's), whose writes are not events.
    fd = os.open("_chaos/beat", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"beat")
    os.close(fd)
    with os.fdopen(os.open("_chaos/beat", os.O_WRONLY), "w") as f:
        f.write("beat")
    print(json.dumps(seen))
""")


def _run(root: Path, die_at: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SAVE, str(root), str(die_at)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_events_of_an_atomic_save_in_order(tmp_path):
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    events = [[op, path.split("manifest-")[0] + "manifest-" if "manifest-" in path else path]
              for op, path in json.loads(result.stdout)]
    assert events == [
        ["mkdir", "ckpt"], ["mkdir", "ckpt"],
        ["open", "_chaos_ignored.txt"], ["write", "_chaos_ignored.txt"],
        ["open", "ckpt/tmp"], ["write", "ckpt/tmp"], ["fsync", "ckpt/tmp"],
        ["rename", "ckpt/step-1.pt"], ["fsync", "ckpt"],
        ["open", "ckpt/meta.pt"], ["write", "ckpt/meta.pt"],
        ["read", "ckpt/step-1.pt"], ["remove", "ckpt/meta.pt"],
        ["open", "ckpt/manifest-"], ["write", "ckpt/manifest-"],
    ]


def test_a_root_reached_through_a_symlink_sees_the_same_events(tmp_path):
    """A run folder under a linked home or scratch folder: the rank's cwd is the real
    folder, so its relative paths resolve there; each is still an event, named under
    the root as given (before, the reference of such a run saw no save at all)."""
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    seen = {}
    for root in (real, link):
        result = _run(root)
        assert result.returncode == 0, result.stderr
        seen[root] = [[op, path.split("manifest-")[0]] for op, path in json.loads(result.stdout)]
        shutil.rmtree(real)
        real.mkdir()
    assert seen[link] == seen[real] and ["rename", "ckpt/step-1.pt"] in seen[link]


def test_a_kill_at_the_write_event_leaves_a_torn_file(tmp_path):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    killed.mkdir()
    whole.mkdir()
    assert _run(killed, die_at=6).returncode == 9  # after the first chunk of ckpt/tmp
    assert _run(whole).returncode == 0
    torn = (killed / "ckpt" / "tmp").stat().st_size
    assert 0 < torn < (whole / "ckpt" / "step-1.pt").stat().st_size
    assert not (killed / "ckpt" / "step-1.pt").exists()


def test_a_kill_after_the_rename_leaves_the_published_file(tmp_path):
    assert _run(tmp_path, die_at=8).returncode == 9
    assert (tmp_path / "ckpt" / "step-1.pt").exists()
    assert not (tmp_path / "ckpt" / "tmp").exists()


DCP = textwrap.dedent("""
    import json, os, sys, warnings, torch
    from torchchaos.rank.iowatch import IOWatch
    root = sys.argv[1]
    seen = []
    IOWatch(root, os.path.join(root, "_chaos"),
            lambda op, path: seen.append([op, os.path.relpath(path, root)])).install()
    import torch.distributed.checkpoint as dcp
    warnings.simplefilter("ignore")
    dcp.save({"w": torch.arange(10.0)}, checkpoint_id=os.path.join(root, "ckpt"), no_dist=True)
    state = {"w": torch.zeros(10)}
    dcp.load(state, checkpoint_id=os.path.join(root, "ckpt"), no_dist=True)
    assert torch.equal(state["w"], torch.arange(10.0))
    print(json.dumps(seen))
""")


def test_torch_distributed_checkpoint_saves_and_loads_are_seen(tmp_path):
    result = subprocess.run([sys.executable, "-c", DCP, str(tmp_path)], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        ["mkdir", "ckpt"],
        ["open", "ckpt/__0_0.distcp"], ["write", "ckpt/__0_0.distcp"],
        ["fsync", "ckpt/__0_0.distcp"],
        ["open", "ckpt/.metadata.tmp"], ["write", "ckpt/.metadata.tmp"],
        ["fsync", "ckpt/.metadata.tmp"], ["rename", "ckpt/.metadata"],
        ["read", "ckpt/.metadata"], ["read", "ckpt/__0_0.distcp"],
    ]


SAFETENSORS = textwrap.dedent("""
    import json, os, sys, torch
    from torchchaos.rank.iowatch import IOWatch
    root = sys.argv[1]
    seen = []
    IOWatch(root, os.path.join(root, "_chaos"),
            lambda op, path: seen.append([op, os.path.relpath(path, root)])).install()
    from safetensors.torch import load_file, save_file   # imported after the agent
    save_file({"w": torch.ones(4)}, os.path.join(root, "model.safetensors"))
    load_file(os.path.join(root, "model.safetensors"))
    print(json.dumps(seen))
""")


def test_safetensors_saves_and_loads_are_seen(tmp_path):
    result = subprocess.run([sys.executable, "-c", SAFETENSORS, str(tmp_path)],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [["open", "model.safetensors"],
                                         ["write", "model.safetensors"],
                                         ["read", "model.safetensors"]]


COPY = textwrap.dedent("""
    import json, os, shutil, sys
    from torchchaos.rank.iowatch import IOWatch
    root = sys.argv[1]
    seen = []
    IOWatch(root, os.path.join(root, "_chaos"),
            lambda op, path: seen.append([op, os.path.relpath(path, root)])).install()
    os.makedirs(os.path.join(root, "_chaos"))
    staged = os.path.join(root, "_chaos", "staged.ckpt")   # written outside the watch
    with open(staged, "wb") as f:
        f.write(b"x" * 100000)
    shutil.copyfile(staged, os.path.join(root, "step-1.ckpt"))   # os.sendfile on Linux
    print(json.dumps(seen))
""")


def test_a_copy_onto_a_checkpoint_name_is_an_open_and_a_write(tmp_path):
    # Lightning Fabric stages a save in $TMPDIR and moves it over: across filesystems
    # the move is shutil.copyfile, whose bytes go through os.sendfile.
    result = subprocess.run([sys.executable, "-c", COPY, str(tmp_path)], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [["open", "step-1.ckpt"], ["write", "step-1.ckpt"]]
