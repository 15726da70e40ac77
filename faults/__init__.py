"""Fault kinds; importing this package registers every kind."""

from faults import kill, storage  # noqa: F401
