"""Crash states of a checkpoint save, and the crash points before them.

`points` (`--per-point`): one chaos run per crash point, the older way. The
rest is the crash-state sweep: one recording run of the save (`record`: read
back, each state's crash placed in it), the states planned, sampled and built
one at a time from it (`states`, files as extents of the recording's blob file:
`extents`), each judged by a recovery that starts warm while the one before
runs (`warm`, `sweep`).
"""
