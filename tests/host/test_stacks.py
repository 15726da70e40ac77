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


WARM_RANK = """Process 4242: /usr/bin/python -m torchchaos.rank.warmrun --standalone train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    all_reduce (/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252)
    train_step (/work/job/train.py:40)
    main (/work/job/train.py:80)
    <module> (/work/job/train.py:99)
    _run_code (<frozen runpy>:88)
    _run_module_code (<frozen runpy>:98)
    run_path (<frozen runpy>:291)
    run_script_path (/venv/lib/python3.11/site-packages/torch/distributed/run.py:982)
    _rank (/venv/lib/python3.11/site-packages/torchchaos/rank/warmrun.py:77)
    wrapper (/venv/lib/python3.11/site-packages/torch/distributed/elastic/{ERRORS}:367)
    _wrap (/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py:706)
    run (/usr/lib/python3.11/multiprocessing/process.py:108)
    <module> (/venv/lib/python3.11/site-packages/torchchaos/rank/warmrun.py:122)
""".replace("{ERRORS}", "multiprocessing/errors/__init__.py")


def test_a_warm_ranks_stack_ends_at_its_script_as_an_execd_ranks_does():
    """Past the script's `<module>` a forked rank's stack runs on into runpy and the
    launcher (torchrun's run_script_path): the hang is said where the script waits,
    and the script's own frame is its outermost."""
    assert stacks.summarize(WARM_RANK) == \
        "all_reduce (distributed_c10d.py:3252) <- train_step (train.py:40)"
    assert stacks.main_thread(WARM_RANK)[-1] == stacks.Frame("<module>", "/work/job/train.py", 99)
