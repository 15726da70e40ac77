"""Fault kinds. Importing this package registers every kind with the engine."""

from faults import kill  # noqa: F401  (registers itself)
