"""The run directory every process shares: its layout, the history files, heartbeats."""
