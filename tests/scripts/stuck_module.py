"""Imported by import_hang.py: its import never finishes."""

import time


def wait_for_a_lock_nobody_releases() -> None:
    while True:
        time.sleep(0.1)


wait_for_a_lock_nobody_releases()
