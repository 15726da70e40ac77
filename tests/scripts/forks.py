"""A worker that leaves processes behind and then hangs: two forked helpers that
ignore SIGTERM, one daemon that escaped into its own session (double fork), and
the worker itself stuck in a loop with SIGTERM ignored."""

import os
import signal
import time


def ignore_sigterm_and_sleep() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.1)


for _ in range(2):
    if os.fork() == 0:
        ignore_sigterm_and_sleep()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ignore_sigterm_and_sleep()
    os._exit(0)
ignore_sigterm_and_sleep()
