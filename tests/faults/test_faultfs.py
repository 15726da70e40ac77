"""The fault filesystem on small files: what survives a power loss, torn writes,
errno faults, slow I/O, bit rot, and that no mount ever outlives its owner.

Every test mounts a real FUSE filesystem (libfuse 3); CI installs fuse3.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO, signal_and_wait

from torchchaos.explore.crash.states import plan_states, replayable
from torchchaos.faults.faultfs.mount import Mount, unavailable_reason
from torchchaos.host.mounts import mounts_under

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())


@pytest.fixture
def fs(tmp_path: Path):
    mount = Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl").start()
    try:
        yield mount
    finally:
        mount.close()
        assert mounts_under(tmp_path) == []


def power_loss(mount: Mount) -> dict:
    reply = mount.request({"cmd": "crash", "lose_unsynced": True, "pids": []})
    assert reply["ok"], reply
    return reply


def write(path: Path, data: bytes, sync: bool) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- power loss ----------------------------------------------------------------
@pytest.mark.parametrize("file_sync,dir_sync,survives", [
    (False, False, None),  # neither: the name is gone
    (True, False, None),  # data durable, name not: gone all the same
    (False, True, b""),  # name durable, data not: an empty file
    (True, True, b"payload"),  # the atomic-publish recipe: intact
])
def test_power_loss_keeps_only_what_fsync_made_durable(fs, file_sync, dir_sync, survives):
    write(fs.mountpoint / "f", b"payload", sync=file_sync)
    if dir_sync:
        sync_dir(fs.mountpoint)
    power_loss(fs)
    path = fs.mountpoint / "f"
    assert (path.read_bytes() if path.exists() else None) == survives


def test_rename_without_directory_fsync_is_undone(fs):
    """Temp file + fsync + rename, but no fsync of the folder: the old version is back."""
    write(fs.mountpoint / "ckpt", b"old", sync=True)
    sync_dir(fs.mountpoint)
    write(fs.mountpoint / "ckpt.tmp", b"new", sync=True)
    os.replace(fs.mountpoint / "ckpt.tmp", fs.mountpoint / "ckpt")
    assert (fs.mountpoint / "ckpt").read_bytes() == b"new"
    report = power_loss(fs)
    assert (fs.mountpoint / "ckpt").read_bytes() == b"old"
    assert sorted(os.listdir(fs.mountpoint)) == ["ckpt"]
    assert "ckpt" in report["restored"]


def test_rename_with_directory_fsync_survives(fs):
    write(fs.mountpoint / "ckpt", b"old", sync=True)
    sync_dir(fs.mountpoint)
    write(fs.mountpoint / "ckpt.tmp", b"new", sync=True)
    os.replace(fs.mountpoint / "ckpt.tmp", fs.mountpoint / "ckpt")
    sync_dir(fs.mountpoint)
    power_loss(fs)
    assert (fs.mountpoint / "ckpt").read_bytes() == b"new"


def test_overwrite_in_place_without_fsync_reverts_to_synced_data(fs):
    write(fs.mountpoint / "f", b"version-1", sync=True)
    sync_dir(fs.mountpoint)
    with open(fs.mountpoint / "f", "r+b") as f:
        f.write(b"VERSION-2-longer")
    report = power_loss(fs)
    assert (fs.mountpoint / "f").read_bytes() == b"version-1"
    assert report["reverted_files"] == ["f"]


def durable_checkpoint_folder(fs) -> Path:
    """step-5/shard-0, with the file and both folders synced."""
    old = fs.mountpoint / "step-5"
    old.mkdir()
    write(old / "shard-0", b"zero", sync=True)
    sync_dir(old)
    sync_dir(fs.mountpoint)
    return old


def remove_tree(folder: Path) -> None:
    (folder / "shard-0").unlink()
    folder.rmdir()


def test_removals_made_durable_by_a_folder_fsync_stay_removed(fs):
    old = durable_checkpoint_folder(fs)
    write(fs.mountpoint / "keep", b"k", sync=True)
    sync_dir(fs.mountpoint)
    remove_tree(old)  # shard-0's removal is never synced, step-5's is (below)
    (fs.mountpoint / "keep").unlink()
    sync_dir(fs.mountpoint)  # this removal of "keep" (and of step-5) is now durable...
    assert not old.exists()
    power_loss(fs)
    assert not old.exists() and not (fs.mountpoint / "keep").exists()


def test_unsynced_removal_of_a_folder_is_undone(fs):
    old = durable_checkpoint_folder(fs)
    remove_tree(old)
    power_loss(fs)
    assert (old / "shard-0").read_bytes() == b"zero"


# -- every kind of entry a folder holds survives as its own name -----------------
def _durable_entry(fs, kind: str) -> Path:
    """One entry of `kind` beside a durable step-5/ folder, the root synced."""
    write(durable_checkpoint_folder(fs) / "model.pt", b"weights", sync=True)
    sync_dir(fs.mountpoint / "step-5")
    entry = fs.mountpoint / "entry"
    if kind == "symlink to a folder":
        os.symlink("step-5", entry)
    elif kind == "symlink to a file":
        os.symlink("step-5/model.pt", entry)
    elif kind == "hard link":
        os.link(fs.mountpoint / "step-5" / "model.pt", entry)
    else:
        entry.mkdir()
    sync_dir(fs.mountpoint)
    return entry


def _entry_state(entry: Path) -> tuple[str, object]:
    if entry.is_symlink():
        return "link", os.readlink(entry)
    if entry.is_dir():
        return "folder", os.listdir(entry)
    return "file", (entry.read_bytes(), os.stat(entry).st_nlink) if entry.exists() else None


KINDS = ["symlink to a folder", "symlink to a file", "hard link", "empty folder"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_durable_entry_of_each_kind_survives_a_power_loss(fs, kind):
    entry = _durable_entry(fs, kind)
    before = _entry_state(entry)
    report = power_loss(fs)
    assert _entry_state(entry) == before
    assert sorted(os.listdir(fs.mountpoint)) == ["entry", "step-5"]
    assert report["removed"] == [] and report["restored"] == []


@pytest.mark.parametrize("kind", KINDS)
def test_an_entry_of_each_kind_whose_folder_was_not_synced_is_gone(fs, kind):
    durable_checkpoint_folder(fs)
    entry = fs.mountpoint / "entry"
    {"symlink to a folder": lambda: os.symlink("step-5", entry),
     "symlink to a file": lambda: os.symlink("step-5/shard-0", entry),
     "hard link": lambda: os.link(fs.mountpoint / "step-5" / "shard-0", entry),
     "empty folder": entry.mkdir}[kind]()
    report = power_loss(fs)
    assert not os.path.lexists(entry)
    assert report["removed"] == ["entry"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_durable_entry_of_each_kind_removed_unsynced_comes_back(fs, kind):
    entry = _durable_entry(fs, kind)
    before = _entry_state(entry)
    os.rmdir(entry) if kind == "empty folder" else os.unlink(entry)
    report = power_loss(fs)
    assert _entry_state(entry) == before
    assert report["restored"] == ["entry"]


@pytest.mark.parametrize("dir_synced", [True, False])
def test_a_latest_symlink_swapped_by_rename_is_durable_as_of_its_folders_fsync(fs, dir_synced):
    """The `latest -> step_N` protocol: a new link made beside, renamed over the old."""
    for step in ("step_10", "step_20"):
        (fs.mountpoint / step).mkdir()
        write(fs.mountpoint / step / "model.pt", step.encode(), sync=True)
        sync_dir(fs.mountpoint / step)
    os.symlink("step_10", fs.mountpoint / "latest")
    sync_dir(fs.mountpoint)
    os.symlink("step_20", fs.mountpoint / "latest.tmp")
    os.replace(fs.mountpoint / "latest.tmp", fs.mountpoint / "latest")
    if dir_synced:
        sync_dir(fs.mountpoint)
    power_loss(fs)
    latest = fs.mountpoint / "latest"
    assert os.readlink(latest) == ("step_20" if dir_synced else "step_10")
    assert (latest / "model.pt").read_bytes() == os.readlink(latest).encode()
    assert sorted(os.listdir(fs.mountpoint)) == ["latest", "step_10", "step_20"]


def test_files_present_at_mount_time_count_as_durable(tmp_path):
    (tmp_path / "mnt").mkdir()
    (tmp_path / "mnt" / "resume.pt").write_bytes(b"from before")
    with Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl") as mount:
        write(mount.mountpoint / "new", b"x", sync=False)
        power_loss(mount)
        assert os.listdir(mount.mountpoint) == ["resume.pt"]
        assert (mount.mountpoint / "resume.pt").read_bytes() == b"from before"
    assert mounts_under(tmp_path) == []


def test_power_loss_kills_the_given_processes_first(fs):
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        with open({str(fs.mountpoint / "log")!r}, "wb") as f:
            while True:
                f.write(b"x" * 100); f.flush(); time.sleep(0.01)
    """)])
    time.sleep(1.0)
    reply = fs.request({"cmd": "crash", "lose_unsynced": True, "pids": [writer.pid]})
    assert writer.wait(timeout=10) == -signal.SIGKILL
    assert reply["killed"] == [writer.pid]
    assert not (fs.mountpoint / "log").exists()  # never synced


def test_files_written_while_mounted_are_at_their_paths_after_unmount(tmp_path):
    """No backing store: the mount serves the folder itself, so nothing moves."""
    with Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl") as mount:
        (mount.mountpoint / "sub").mkdir()
        write(mount.mountpoint / "sub" / "ckpt.pt", b"saved", sync=True)
        write(mount.mountpoint / "scratch", b"unsynced", sync=False)
    assert mounts_under(tmp_path) == []
    assert (tmp_path / "mnt" / "sub" / "ckpt.pt").read_bytes() == b"saved"
    assert (tmp_path / "mnt" / "scratch").read_bytes() == b"unsynced"


@pytest.mark.parametrize("recording", [False, True], ids=["faults", "recording"])
def test_a_file_unlinked_while_open_is_read_written_and_synced_as_on_a_disk(tmp_path,
                                                                            recording):
    """libfuse gives no path for a file unlinked while open (hard_remove): a rotation
    that deletes a checkpoint another rank still has open, or a TemporaryFile, must
    go on working (it failed with EINVAL). Its writes are logged `unlinked`: no folder
    holds the file any more, and the crash-state replay leaves them out."""
    record = {"record": tmp_path / "blobs"} if recording else {}
    with Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl", **record) as mount:
        path = mount.mountpoint / "old-step.pt"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"a" * 100)
            os.unlink(path)
            os.pwrite(fd, b"b" * 50, 100)
            os.fsync(fd)
            os.ftruncate(fd, 120)
            assert os.pread(fd, 200, 0) == b"a" * 100 + b"b" * 20
            assert os.lseek(fd, 0, os.SEEK_END) == 120  # the size, from its descriptor
        finally:
            os.close(fd)
        assert not path.exists()
    logged = [json.loads(line) for line in (tmp_path / "fs.jsonl").read_text().splitlines()]
    after = [e for e in logged if e.get("op") in ("write", "fsync", "truncate")][1:]
    assert after and all(e["unlinked"] and e["path"] == "old-step.pt" for e in after), after
    ops = replayable(e for e in logged if e["ev"] == "fs")
    assert [e["op"] for e in ops] == ["create", "write", "unlink"]
    if recording:  # its crash states replay (the write after the unlink named no file
        # the model knew: it refused the record before)
        assert plan_states(ops, 0, ["kill", "lose_unsynced"], seed=0).specs


# -- over a whole run directory, with the harness's _chaos/ inside ---------------
@pytest.fixture
def rundir(tmp_path: Path):
    """A mount over a run dir, its state and history in the run's own `_chaos/` (as
    `storage:dir=.` does); `_chaos/early.log` was opened by the "harness" before."""
    run = tmp_path / "run"
    (run / "_chaos" / "history").mkdir(parents=True)
    (run / "snapshot.pt").write_bytes(b"from before")
    early = open(run / "_chaos" / "early.log", "ab")  # noqa: SIM115
    mount = Mount(run, run / "_chaos" / "faultfs" / "0-rundir",
                  run / "_chaos" / "history" / "faultfs-0-rundir.jsonl",
                  private=("_chaos",)).start()
    try:
        yield mount, early
    finally:
        mount.close()
        early.close()
        assert mounts_under(tmp_path) == []


def test_power_loss_over_a_run_dir_spares_the_harness_folder(rundir):
    mount, early = rundir
    run = mount.mountpoint
    write(run / "snapshot.tmp", b"new", sync=False)
    (run / "_chaos" / "logs").mkdir()
    write(run / "_chaos" / "logs" / "launch-0.log", b"never synced", sync=False)
    early.write(b"written through the old descriptor\n")
    early.flush()
    reply = power_loss(mount)
    assert "snapshot.tmp" in reply["removed"]
    assert not any(p.startswith("_chaos") for key in ("removed", "restored") for p in reply[key])
    assert sorted(os.listdir(run)) == ["_chaos", "snapshot.pt"]
    assert (run / "_chaos" / "logs" / "launch-0.log").read_bytes() == b"never synced"
    assert (run / "_chaos" / "early.log").read_bytes().endswith(b"old descriptor\n")


def test_the_harness_folder_is_never_faulted_recorded_or_crossed(rundir):
    mount, _early = rundir
    run = mount.mountpoint
    mount.request({"cmd": "arm", "mode": "eio", "op": "any", "count": 1})
    write(run / "_chaos" / "marker", b"harness", sync=True)  # untouched by the armed fault
    with pytest.raises(OSError) as raised:
        write(run / "model.pt", b"target", sync=False)  # the first target operation is hit
    assert raised.value.errno == errno.EIO
    write(run / "model.pt", b"target", sync=True)
    with pytest.raises(OSError) as crossing:
        os.rename(run / "model.pt", run / "_chaos" / "model.pt")
    assert crossing.value.errno == errno.EXDEV  # as between two filesystems
    from torchchaos.rundir.history import read_stream

    history = run / "_chaos" / "history" / "faultfs-0-rundir.jsonl"
    paths = {e.get("path", "") for e in read_stream(history) if e["ev"] == "fs"}
    assert "model.pt" in paths and not any(p.startswith("_chaos") for p in paths)


def test_bitrot_over_a_run_dir_never_picks_a_harness_file(rundir):
    mount, _early = rundir
    run = mount.mountpoint
    write(run / "_chaos" / "weights.pt", b"w" * 100000, sync=True)  # big, synced: no target
    write(run / "snapshot.pt", b"s" * 1000, sync=True)
    sync_dir(run)
    reply = mount.request({"cmd": "bitrot", "seed": 1, "bits": 1, "crash": False})
    assert reply["file"] == "snapshot.pt"
    assert (run / "_chaos" / "weights.pt").read_bytes() == b"w" * 100000


def test_nothing_of_a_run_dir_is_lost_at_unmount(tmp_path, rundir):
    mount, _early = rundir
    run = mount.mountpoint
    write(run / "snapshot.pt", b"step 20", sync=True)
    write(run / "_chaos" / "fired", b"f0", sync=False)
    mount.close()
    assert mounts_under(tmp_path) == []
    assert (run / "snapshot.pt").read_bytes() == b"step 20"
    assert (run / "_chaos" / "fired").read_bytes() == b"f0"
    state = run / "_chaos" / "faultfs" / "0-rundir"
    assert (state / "daemon.log").exists() and (state / "control.sock").exists()
    assert (run / "_chaos" / "history" / "faultfs-0-rundir.jsonl").stat().st_size > 0


def test_state_inside_the_mount_must_be_private(tmp_path):
    from torchchaos.faults.faultfs.mount import FaultFSError

    with pytest.raises(FaultFSError, match="outside its private folders"):
        Mount(tmp_path, tmp_path / "state", tmp_path / "h").start()
    assert mounts_under(tmp_path) == []


# -- armed faults --------------------------------------------------------------
@pytest.mark.parametrize("mode,code", [("enospc", errno.ENOSPC), ("eio", errno.EIO)])
def test_errno_fault_hits_the_next_matching_operation_once(fs, mode, code):
    fs.request({"cmd": "arm", "mode": mode, "op": "write"})
    with pytest.raises(OSError) as raised:
        write(fs.mountpoint / "a", b"data", sync=False)
    assert raised.value.errno == code
    write(fs.mountpoint / "b", b"data", sync=False)  # used up: the next write works
    assert (fs.mountpoint / "b").read_bytes() == b"data"


@pytest.mark.parametrize("op", ["fsync", "rename"])
def test_errno_fault_on_fsync_and_rename(fs, op):
    write(fs.mountpoint / "a", b"data", sync=False)
    fs.request({"cmd": "arm", "mode": "eio", "op": op, "count": 2})
    for _ in range(2):
        with pytest.raises(OSError) as raised:
            if op == "fsync":
                write(fs.mountpoint / "a", b"data", sync=True)
            else:
                os.rename(fs.mountpoint / "a", fs.mountpoint / "b")
        assert raised.value.errno == errno.EIO
    os.rename(fs.mountpoint / "a", fs.mountpoint / "c")
    assert os.listdir(fs.mountpoint) == ["c"]


def test_torn_write_crashes_every_process_of_the_run(tmp_path):
    """With a run id, the crash kills the processes carrying the run's marker."""
    with Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl",
               run_id="testrun") as mount:
        target = mount.mountpoint / "model.pt"
        mount.request({"cmd": "arm", "mode": "torn", "keep": 0.5})
        env = {**os.environ, "TORCHCHAOS_RUN_ID": "testrun"}
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                     env=env)
        writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import os, time
            fd = os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)
            try:
                os.write(fd, b"z" * 1000)
            except OSError:
                pass
            time.sleep(60)
        """)], env=env)
        assert writer.wait(timeout=20) == -signal.SIGKILL
        assert bystander.wait(timeout=20) == -signal.SIGKILL
        mount.settle()  # the crash is over: the "machine" is back up
        assert target.read_bytes() == b"z" * 500


def test_a_process_the_crash_kills_never_sees_the_disk_refuse(tmp_path):
    """A crash leaves no word: the torn write's EIO reaches its writer, and a peer's
    next operation its EIO, only once the crash has sent its SIGKILLs, so both die in
    the call. An adamw_trainer.py rank met the refusal first and printed "OSError:
    [Errno 5] Input/output error" from a rename, which the incident import read as an
    exception mid-save."""
    with Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl",
               run_id="testrun-quiet") as mount:
        env = {**os.environ, "TORCHCHAOS_RUN_ID": "testrun-quiet"}
        started = tmp_path / "the peer runs"

        def process(lines: list[str], said: Path) -> subprocess.Popen:
            body = "".join(f"    {line}\n" for line in lines)
            script = (f"import os, time\ntry:\n{body}except OSError as exc:\n"
                      f"    open({str(said)!r}, 'w').write(str(exc))\ntime.sleep(60)\n")
            return subprocess.Popen([sys.executable, "-c", script], env=env)

        peer = process([f"open({str(started)!r}, 'w').close()",
                        f"while True: os.stat({str(mount.mountpoint)!r})"],
                       tmp_path / "the peer saw EIO")
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert peer.poll() is None, "the peer did not start"
        mount.request({"cmd": "arm", "mode": "torn", "keep": 0.5})
        writer = process([f"fd = os.open({str(mount.mountpoint / 'model.pt')!r},"
                          " os.O_CREAT | os.O_WRONLY)", "os.write(fd, b'z' * 1000)"],
                         tmp_path / "the writer saw EIO")
        assert writer.wait(timeout=20) == -signal.SIGKILL
        assert peer.wait(timeout=20) == -signal.SIGKILL
        mount.settle()
        assert sorted(p.name for p in tmp_path.glob("*saw EIO")) == []


def test_slow_mode_delays_operations(fs):
    fs.request({"cmd": "arm", "mode": "slow", "delay": 0.2, "duration": 30})
    start = time.monotonic()
    write(fs.mountpoint / "a", b"data", sync=True)  # create, write, fsync: >= 3 delays
    assert time.monotonic() - start >= 0.6


# -- bit rot -------------------------------------------------------------------
def test_bitrot_flips_bits_in_the_newest_big_committed_file_only(fs):
    data = bytes(range(256)) * 8
    write(fs.mountpoint / "older.pt", data, sync=True)
    time.sleep(0.01)
    write(fs.mountpoint / "big.pt", data[:-100], sync=True)
    write(fs.mountpoint / "small.pt", b"s" * 10, sync=True)
    sync_dir(fs.mountpoint)
    write(fs.mountpoint / "unsynced.pt", b"u" * 100000, sync=False)  # larger, not committed
    reply = fs.request({"cmd": "bitrot", "seed": 7, "bits": 3, "crash": False})
    assert reply["file"] == "big.pt" and len(reply["bits"]) == 3
    after = (fs.mountpoint / "big.pt").read_bytes()
    flipped = sum(bin(a ^ b).count("1") for a, b in zip(data, after))
    assert flipped == 3 and len(after) == len(data) - 100
    assert (fs.mountpoint / "older.pt").read_bytes() == data
    assert (fs.mountpoint / "small.pt").read_bytes() == b"s" * 10


def test_bitrot_with_no_committed_file_rots_what_the_kernel_wrote_back(fs):
    """A job that never fsyncs: its files reach the disk all the same, and rot there
    (issue 17: bit rot on such a job used to hit nothing and pass)."""
    write(fs.mountpoint / "a", b"x" * 100, sync=False)
    reply = fs.request({"cmd": "bitrot", "seed": 3, "bits": 1, "crash": False})
    assert reply["ok"] and reply["file"] == "a"
    assert (fs.mountpoint / "a").read_bytes() != b"x" * 100


def test_bitrot_with_no_file_says_so(fs):
    reply = fs.request({"cmd": "bitrot", "crash": False})
    assert not reply["ok"] and "no committed file" in reply["error"]


# -- history and teardown ------------------------------------------------------
def test_every_mutation_is_recorded(fs, tmp_path):
    write(fs.mountpoint / "a.tmp", b"data", sync=True)
    os.rename(fs.mountpoint / "a.tmp", fs.mountpoint / "a")
    sync_dir(fs.mountpoint)
    (fs.mountpoint / "a").unlink()
    from torchchaos.rundir.history import read_stream

    ops = [(e["op"], e["path"]) for e in read_stream(tmp_path / "fs.jsonl") if e["ev"] == "fs"]
    assert ops == [("create", "a.tmp"), ("write", "a.tmp"), ("fsync", "a.tmp"),
                   ("rename", "a.tmp"), ("fsyncdir", ""), ("unlink", "a")]


def test_unmounts_when_the_with_block_raises(tmp_path):
    with pytest.raises(RuntimeError), Mount(tmp_path / "m", tmp_path / "s", tmp_path / "h"):
        assert mounts_under(tmp_path)
        raise RuntimeError("boom")
    assert mounts_under(tmp_path) == []


def test_unmounts_even_when_a_process_still_holds_a_file_open(tmp_path):
    mount = Mount(tmp_path / "m", tmp_path / "s", tmp_path / "h").start()
    holder = open(mount.mountpoint / "open-file", "wb")  # noqa: SIM115
    try:
        mount.close()
        assert mounts_under(tmp_path) == []
    finally:
        with contextlib.suppress(OSError):  # its filesystem is gone: ENOTCONN
            holder.close()


HOLDER = """
import sys, time
from pathlib import Path
from torchchaos.faults.faultfs.mount import Mount
base = Path(sys.argv[1])
if sys.argv[2] == "rundir":  # state inside the mount, as for storage:dir=.
    mount = Mount(base, base / "_chaos" / "s", base / "_chaos" / "h", private=("_chaos",))
else:
    mount = Mount(base / "m", base / "s", base / "h")
with mount:
    (mount.mountpoint / "kept").write_bytes(b"written while mounted")
    print("mounted", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("where", ["folder", "rundir"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_no_mount_survives_its_owner_interrupted_or_killed(tmp_path, sig, where):
    """Ctrl-C unwinds through close(); after a SIGKILL the daemon sees its parent die
    and unmounts (and auto_unmount would, were the daemon killed too). Either way the
    files are at their paths."""
    owner = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), where],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert owner.stdout is not None and owner.stdout.readline().strip() == "mounted"
    signal_and_wait(owner, sig, "the mount's owner")  # killed, its mount ends with it
    deadline = time.monotonic() + 10
    while (mounts_under(tmp_path) or daemons(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mounts_under(tmp_path) == []
    assert daemons(tmp_path) == []
    folder = tmp_path if where == "rundir" else tmp_path / "m"
    assert (folder / "kept").read_bytes() == b"written while mounted"


def daemons(under: Path) -> list[str]:
    return subprocess.run(["pgrep", "-f", f"torchchaos.faults.faultfs {under}"],
                          capture_output=True, text=True).stdout.split()


def _read_ahead_kb(mountpoint: Path) -> int:
    dev = os.stat(mountpoint).st_dev
    return int(Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
               .read_text())


def _sys_read_only() -> bool:
    """/sys mounted read-only, as in a container that is not privileged."""
    return any(line.split()[1] == "/sys" and "ro" in line.split()[3].split(",")
               for line in Path("/proc/self/mounts").read_text().splitlines())


def test_a_recording_mount_reads_in_large_requests_and_takes_no_faults(tmp_path):
    """A recovery loads GBs through a recording mount: its readahead is 1 MiB (where /sys
    can be written: in a container it stays the kernel's, and reads are just smaller),
    and as the kernel keeps its file contents cached, a fault that would change files
    behind the kernel's back is refused. A fault mount keeps the kernel's defaults."""
    with Mount(tmp_path / "rec", tmp_path / "rs", tmp_path / "rh",
               record=tmp_path / "blobs") as recording:
        widened = _read_ahead_kb(recording.mountpoint)
        assert widened == (128 if _sys_read_only() else 1024)
        for command in ({"cmd": "arm", "mode": "eio", "op": "write"},
                        {"cmd": "crash", "lose_unsynced": True}):
            answer = recording.request(command)
            assert answer["ok"] is False and "takes no faults" in answer["error"], answer
    with Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl") as mount:
        assert _read_ahead_kb(mount.mountpoint) < 1024
        assert mount.request({"cmd": "arm", "mode": "eio", "op": "write"})["ok"] is True
