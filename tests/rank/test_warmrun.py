"""A rank forked by warmrun starts and ends as one torchrun starts with exec.

Each property a script could tell apart is printed by a probe under both launchers,
side by side: the script's arguments, name and folder on sys.path, signal handlers,
faulthandler (off unless asked for: a segfault prints no Python stack), its own seeds
of torch's and numpy's global generators, threads joined before the atexit handlers
run, and how it ends (the exit code, a traceback that starts in the script, the
exception kept in sys.last_value while the atexit handlers run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

PROBE = textwrap.dedent("""
    import atexit, faulthandler, json, os, signal, sys, threading, time
    import numpy, torch
    rank = int(os.environ["RANK"])
    seen = {"argv": sys.argv[2:], "script": sys.argv[0], "name": __name__, "path0": sys.path[0],
            "sigterm": str(signal.getsignal(signal.SIGTERM)),
            "sigint": str(signal.getsignal(signal.SIGINT)),
            "faulthandler": faulthandler.is_enabled(),
            "torch": torch.initial_seed(), "numpy": float(numpy.random.rand())}
    out = os.path.join(sys.argv[1], f"rank-{rank}.json")
    def write_and_wait_for_the_other():
        # torchrun stops the other rank once one fails: no rank ends before both wrote
        with open(out + ".tmp", "w") as f:
            json.dump(seen, f)
        os.rename(out + ".tmp", out)
        other = os.path.join(sys.argv[1], f"rank-{1 - rank}.json")
        while not os.path.exists(other):
            time.sleep(0.05)
    def late_thread():
        time.sleep(0.3)
        seen["thread_done"] = True
    threading.Thread(target=late_thread).start()   # not a daemon: joined before atexit
    def at_exit():
        seen["thread_joined_first"] = seen.get("thread_done", False)
        # the uncaught exception, and the frames it holds, live on to the end
        seen["last_value"] = repr(getattr(sys, "last_value", None))
        write_and_wait_for_the_other()
    atexit.register(at_exit)
    if sys.argv[2] == "raise" and rank == 1:
        raise FileNotFoundError("no checkpoint here")
    if sys.argv[2] == "exit3":
        sys.exit(3)
    if sys.argv[2] == "os_exit":  # skips the interpreter's end, as the bundled target does
        seen["thread_joined_first"] = True
        write_and_wait_for_the_other()
        os._exit(0)
""")

LAUNCHERS = {"torchrun": "torch.distributed.run", "warmrun": "torchchaos.rank.warmrun"}


def _run(tmp_path: Path, launcher: str, how: str) -> tuple[int, str, list[dict]]:
    folder = tmp_path / f"{launcher}-{how}"
    folder.mkdir()
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = subprocess.run(
        [sys.executable, "-m", LAUNCHERS[launcher], "--standalone", "--nproc-per-node", "2",
         "--max-restarts", "0", str(script), str(folder), how],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "TMPDIR": str(folder)})  # torchrun's torchelastic_* folders
    ranks = [json.loads((folder / f"rank-{r}.json").read_text()) for r in range(2)]
    return done.returncode, done.stderr, ranks


@pytest.mark.parametrize("how", ["end", "raise", "exit3", "os_exit"])
def test_a_forked_rank_starts_and_ends_as_an_execd_one(tmp_path: Path, how: str):
    code, log, ranks = _run(tmp_path, "torchrun", how)
    warm_code, warm_log, warm_ranks = _run(tmp_path, "warmrun", how)
    assert warm_code == code == (0 if how in ("end", "os_exit") else 1)
    for plain, warm in zip(ranks, warm_ranks):
        for key in ("argv", "name", "path0", "sigterm", "sigint", "faulthandler",
                    "thread_joined_first", "last_value"):
            assert warm.get(key) == plain.get(key), key
        assert warm["argv"] == [how] and warm["name"] == "__main__"
        assert warm["script"] == plain["script"] == str(tmp_path / "probe.py")
        assert warm["thread_joined_first"] is True
    # each rank draws its own seeds, as a fresh interpreter does
    assert warm_ranks[0]["torch"] != warm_ranks[1]["torch"]
    assert warm_ranks[0]["numpy"] != warm_ranks[1]["numpy"]
    if how == "raise":
        for text in (log, warm_log):
            lines = text.splitlines()
            first = lines.index("Traceback (most recent call last):") + 1
            assert lines[first].startswith(f'  File "{tmp_path / "probe.py"}"'), lines[first]
            assert "FileNotFoundError: no checkpoint here" in lines
    if how == "exit3":
        assert "exitcode: 3" in warm_log and "exitcode: 3" in log


FIRST_ENDS = textwrap.dedent("""
    import os, pathlib, signal, sys, time
    marker = pathlib.Path(sys.argv[1]) / "rank-1-ends"
    if os.environ["RANK"] == "1":
        time.sleep(1)  # a rank that trains a while first
        marker.touch()
        os.kill(os.getpid(), signal.SIGSEGV)
    while not marker.exists():
        time.sleep(0.005)
    time.sleep(0.02)  # gone well within torchrun's next poll
    raise RuntimeError("Connection reset by peer")  # the peer's echo
""")


def test_torchrun_names_the_worker_a_signal_killed_first(tmp_path: Path):
    """Rank 1 dies of SIGSEGV and rank 0 fails 20 ms later on the broken connection.
    torchrun's fork mode named rank 0's exit 1, the first ended worker in rank order,
    and the log never showed the SIGSEGV (5 of 5 replays of a segfault incident read
    as a kill); a user's torchrun names the SIGSEGV, since an exec'd rank 0's exit
    path outlasts its poll."""
    script = tmp_path / "first_ends.py"
    script.write_text(FIRST_ENDS)
    for attempt in range(2):
        folder = tmp_path / f"run-{attempt}"
        folder.mkdir()
        done = subprocess.run(
            [sys.executable, "-m", LAUNCHERS["warmrun"], "--standalone", "--nproc-per-node",
             "2", "--max-restarts", "0", str(script), str(folder), "segv"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(folder)})
        assert done.returncode == 1
        assert "failed (exitcode: -11) local_rank: 1" in done.stderr, done.stderr[-3000:]


def test_workers_that_exit_stay_in_rank_order_after_those_a_signal_killed():
    """Of the workers gone by one poll, a signal's (in the order they ended) come first,
    then those that exited in rank order, as in torchrun's subprocess mode: a
    preemption whose ranks each exit 143 names rank 0, the writer, though rank 1 left
    first (it printed nothing)."""
    from torchchaos.rank import warmrun

    processes = [SimpleNamespace(exitcode=code) for code in (143, 143, -11, -9, None)]
    ended = {1: 1.00, 0: 1.01, 3: 1.02, 2: 1.03}
    pc = SimpleNamespace(processes=processes, _torchchaos_ended=ended,
                         sentinels={f"s{i}": i for i in range(5)})
    warmrun._signalled_first(pc)
    assert list(pc.sentinels.values()) == [3, 2, 0, 1, 4]


RETURNS_FIRST = textwrap.dedent("""
    import datetime, os, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        sys.exit(0)  # done first (Lightning's rank 0 after a SIGTERM: SystemExit, no code)
    time.sleep(0.5)
    try:
        dist.barrier()  # Lightning's: a barrier that may fail, "to prevent deadlocks"
        print("barrier passed", flush=True)
    except Exception as exc:
        print("peer gone:", str(exc).splitlines()[0], flush=True)
""")


@pytest.mark.parametrize("launcher", ["torchrun", "warmrun"])
def test_a_rank_that_returns_first_hangs_up_on_its_peers(tmp_path: Path, launcher: str):
    """A forked worker that returns waits in torchrun's wrapper for the others, its
    process group's sockets open: its peer's barrier waited for it (15 s here; gloo's
    default is 30 min) where an exec'd rank's exit ends it at once. A Lightning job
    preempted by SIGTERM hung that way under the harness, not under torchrun."""
    script = tmp_path / "returns_first.py"
    script.write_text(RETURNS_FIRST)
    done = subprocess.run(
        [sys.executable, "-m", LAUNCHERS[launcher], "--standalone", "--nproc-per-node", "2",
         "--max-restarts", "0", str(script)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    if launcher == "torchrun" and not done.stdout and "closing signal SIGTERM" in done.stderr:
        # an exec'd rank 0 that leaves with its group undestroyed while its peer waits in
        # a barrier is at times aborted by gloo's teardown (SIGABRT; 1 in about 7 here),
        # and torchrun stops rank 1 at once: its peer did not wait for it either
        return
    # the connection closed, as at an exit; not gloo's "Timed out waiting 15000ms"
    assert "peer gone:" in done.stdout and "Connection" in done.stdout, \
        done.stdout + done.stderr[-2000:]
