"""Which thread holds the GIL of a frozen rank, from its native stacks (py-spy --native)."""

from __future__ import annotations

from pathlib import Path

from torchchaos.host import stacks

DUMP = Path(__file__).resolve().parents[1] / "data" / "stacks" / "gil_held_loader_ddp.native.txt"


def test_the_thread_in_ctypes_holds_the_gil_not_those_waiting_in_the_interpreter():
    """A real dump (hang:mode=gil in tests/scripts/loader_ddp.py): the main thread sleeps
    in libc under ctypes; the heartbeat waits in time.sleep and two queue feeders in a
    lock, each inside the interpreter, which released the GIL around the wait."""
    text = DUMP.read_text()
    assert stacks.gil_holder(text) == "_hold_gil (hang.py:212) in clock_nanosleep"


def test_no_holder_is_named_where_every_thread_waits_in_the_interpreter():
    text = DUMP.read_text()
    main, rest = text.split('Thread 14742 (idle): "torchchaos-heartbeat"', 1)
    # the main thread now waits in time.sleep, as the heartbeat does
    waiting = main.split("    clock_nanosleep")[0] + (
        "    pthread_cond_timedwait (/usr/lib/x86_64-linux-gnu/libc.so.6)\n"
        "    time_sleep (/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0)\n"
        "    main (/work/main/tests/scripts/loader_ddp.py:81)\n")
    assert stacks.gil_holder(waiting + 'Thread 14742 (idle): "torchchaos-heartbeat"' + rest) \
        is None


def test_two_threads_in_native_code_name_no_holder():
    """Either could hold it: none is named rather than a guess."""
    text = DUMP.read_text()
    main = text.split('Thread 14742')[0].split("\n", 3)[3]  # the main thread's block
    assert stacks.gil_holder(text + main.replace("Thread 14739", "Thread 14999")) is None


def test_a_dump_without_native_frames_names_no_holder():
    plain = "".join(line + "\n" for line in DUMP.read_text().splitlines()
                    if ".py:" in line or line.startswith(("Thread", "Process", "Python")))
    assert stacks.gil_holder(plain) is None
