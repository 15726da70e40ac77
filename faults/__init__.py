"""Fault kinds: `contract.py` says what a kind is, `registry.py` finds one by name,
and each other module here is one built-in kind. Importing this package loads none."""
