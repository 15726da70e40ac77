"""Fault kinds; importing this package registers every kind."""

from faults import bitflip, hang, kill, partition, storage, straggler  # noqa: F401
