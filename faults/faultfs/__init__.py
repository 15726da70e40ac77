"""The fault filesystem: a FUSE pass-through that can lose unsynced data.

Mounted by the harness over a run's checkpoint directory (`mount.Mount`), or
over the whole run directory, it passes every operation to the folder under
the mount (through a descriptor opened before mounting: no file ever moves),
records the mutations in the run's history, and on command simulates what
storage does to a checkpoint protocol: a power loss that drops all data and
directory entries not made durable by fsync (`durability`), a torn write,
ENOSPC / EIO on the next matching operation, slow I/O (`armed`), and bit rot
in a committed file (`daemon`).

Binding: mfusepy (ctypes over libfuse 3, maintained fork of fusepy). It
needs no compiler or headers, only Debian's `fuse3`; pyfuse3 would need
libfuse3-dev and a build, and its speed matters little next to the cost of
serialising a checkpoint (see bench/README.md).
"""
