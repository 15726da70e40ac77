"""Fault kinds; importing this package registers every kind."""

from faults import bitflip, kill, storage  # noqa: F401
