"""Fault kinds: `contract.py` says what a kind is, `registry.py` finds one by name, and
every module it names is one built-in kind; the rest are what kinds share (`params`,
`bits`, `filebits`, `shape`), a kind's helpers (`toxiproxy_api`, `stop_healer`) and
the fault filesystem (`faultfs/`). Importing this package loads none of them."""
