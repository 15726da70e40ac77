"""Fault kinds; importing this package registers every kind."""

from faults import bitflip, hang, kill, storage, straggler  # noqa: F401
