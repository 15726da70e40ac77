"""A worker stuck while importing its modules (a deadlock at import time): it never
reaches init_process_group, and it ignores SIGTERM."""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)

import stuck_module  # noqa: E402,F401  (never returns)
