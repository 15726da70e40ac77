"""Reaping by process tree and by environment marker, including escaped daemons."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil

from torchchaos import env

# A parent in its own session that starts a child and a double-forked daemon.
from torchchaos.host import lifeline, procs

FAMILY = textwrap.dedent("""
    import os, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    print("ready", flush=True)
    time.sleep(600)
""")


def test_reap_kills_the_tree_and_escaped_daemons():
    run_id = f"test{os.getpid()}"
    lifeline.own(run_id)  # another pytest worker's harness sweeps runs no harness owns
    environ = {**os.environ, env.RUN_ID: run_id}
    parent = subprocess.Popen([sys.executable, "-c", FAMILY], env=environ,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        marked = procs.marked_pids(run_id)
        assert len(marked) == 3  # parent, child, daemon (reparented away from the tree)
        assert len(procs.tree([parent.pid])) == 2
        killed = procs.reap(run_id, [parent.pid])
        parent.wait(timeout=10)
        assert set(marked) <= set(killed)
        assert procs.marked_pids(run_id) == []
        assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == "zombie"
                   for p in marked)
    finally:
        procs.reap(run_id, [parent.pid])
        parent.wait(timeout=10)
