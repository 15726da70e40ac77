"""A worker that never finishes: it ignores SIGTERM and sleeps, as a hung job does."""

import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(1)
