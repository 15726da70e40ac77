"""Fault kinds; importing this package registers every kind."""

from faults import bitflip, hang, kill, partition, storage, straggler, toxic  # noqa: F401
