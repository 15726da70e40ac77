"""Crash states of one recorded save: every folder image a crash in it can leave.

The fault filesystem, in recording mode, writes each operation on the checkpoint
folder into the run's history (`fs` events, in the order they happened, every
write's bytes kept in a blob file). Replaying that record on an in-memory model
of the folder gives the folder as it was after any prefix of the operations,
without running the job again (ALICE's idea, for checkpoints):

- `kill`: the job dies after operation i; the page cache survives, so the
  folder is the prefix up to i;
- `torn`: write i reaches the disk only in part (`keep` of its bytes, at
  seeded fractions), then the job dies;
- `lose_unsynced`: a power loss after operation i. Under the pessimistic POSIX
  model a file's data is durable as of its last fsync and a directory's
  entries as of the directory's last fsync. Which of the pending changes the
  disk had written anyway is open: each file with unsynced data and each
  directory with unsynced entries independently keeps or loses them. All lost
  (what `storage:mode=lose_unsynced` does in a chaos run) is always among the
  states; other combinations are enumerated up to `combos` per point, a seeded
  sample beyond.

An image is the folder as the restarted job finds it: names and contents.
Two states whose images agree on everything a recovery looked at (the paths it
stat'ed, the folders it listed, the files it read: `fs_read` events) recover
the same way, so one recovery run serves all of them (`view_key`).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import os
import random
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos.rundir.history import Event

# what a restarted job finds at a relative path: ("dir",), ("file", bytes), ("link", target)
ImageEntry = tuple
Image = dict[str, ImageEntry]

MUTATIONS = ("create", "open", "write", "truncate", "fsync", "fsyncdir", "mkdir", "unlink",
             "rmdir", "rename", "link", "symlink")
MODES = ("kill", "torn", "lose_unsynced")


class Unsupported(Exception):
    """The record holds something the model cannot replay (an operation on a path it
    never saw created, say): states from it would not be the job's."""


@dataclass
class Node:
    kind: str  # "file", "dir" or "link"
    data: bytearray = field(default_factory=bytearray)
    entries: dict[str, int] = field(default_factory=dict)
    target: str = ""


class Folder:
    """The checkpoint folder as operations change it, and what of it is durable."""

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {0: Node("dir")}
        self.durable_data: dict[int, bytes] = {}
        self.durable_entries: dict[int, dict[str, int]] = {0: {}}
        self.changed: dict[int, int] = {}  # inode -> number of the operation that last changed it
        self._next = 1
        self._ops = 0

    @classmethod
    def scan(cls, root: Path, private: frozenset[str] = frozenset()) -> Folder:
        """The folder as it is on disk, all of it durable."""
        folder = cls()
        for dirpath, dirs, files in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            if rel == ".":
                dirs[:] = [d for d in dirs if d not in private]
                files = [f for f in files if f not in private]
            for name in sorted(dirs):
                folder._add(_join(rel, name), Node("dir"))
            for name in sorted(files):
                path = Path(dirpath, name)
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode):
                    folder._add(_join(rel, name), Node("link", target=os.readlink(path)))
                elif stat.S_ISREG(mode):
                    folder._add(_join(rel, name), Node("file", bytearray(path.read_bytes())))
        folder.sync_everything()
        return folder

    def sync_everything(self) -> None:
        for ino, node in self.nodes.items():
            if node.kind == "dir":
                self.durable_entries[ino] = dict(node.entries)
            else:
                self.durable_data[ino] = bytes(node.data)

    # -- names ----------------------------------------------------------------
    def _lookup(self, path: str) -> int | None:
        ino = 0
        for part in _parts(path):
            node = self.nodes[ino]
            if node.kind != "dir" or part not in node.entries:
                return None
            ino = node.entries[part]
        return ino

    def _parent(self, path: str) -> tuple[Node, str]:
        parts = _parts(path)
        if not parts:
            raise Unsupported("an operation on the folder's root itself")
        ino = self._lookup("/".join(parts[:-1]))
        if ino is None or self.nodes[ino].kind != "dir":
            raise Unsupported(f"no folder holds {path}")
        return self.nodes[ino], parts[-1]

    def _node(self, path: str) -> tuple[int, Node]:
        ino = self._lookup(path)
        if ino is None:
            raise Unsupported(f"{path} was never created")
        return ino, self.nodes[ino]

    def _add(self, path: str, node: Node) -> int:
        parent, name = self._parent(path)
        ino = self._next
        self._next += 1
        self.nodes[ino] = node
        parent.entries[name] = ino
        if node.kind == "dir":
            self.durable_entries[ino] = {}
        else:
            self.durable_data[ino] = b""  # created, never synced: empty after a power loss
        return ino

    # -- operations ----------------------------------------------------------
    def apply(self, op: Event, data: bytes = b"") -> None:
        """One recorded operation (`data`: a write's bytes)."""
        self._apply(op, data)
        self._ops += 1
        if op["op"] not in ("fsync", "fsyncdir"):
            path = op.get("path", "")
            for changed in (path, os.path.dirname(path), op.get("to")):
                ino = self._lookup(changed) if changed is not None else None
                if ino is not None:
                    self.changed[ino] = self._ops

    def _apply(self, op: Event, data: bytes) -> None:
        kind, path = op["op"], op.get("path", "")
        if kind in ("create", "open"):
            ino = self._lookup(path)
            if ino is None:
                self._add(path, Node("file"))
            elif op.get("trunc"):
                del self.nodes[ino].data[:]
        elif kind == "write":
            node = self._node(path)[1]
            start = op["offset"]
            if len(node.data) < start:
                node.data.extend(bytes(start - len(node.data)))
            node.data[start:start + len(data)] = data
        elif kind == "truncate":
            node = self._node(path)[1]
            del node.data[op["length"]:]
            node.data.extend(bytes(op["length"] - len(node.data)))
        elif kind == "fsync":
            ino, node = self._node(path)
            self.durable_data[ino] = bytes(node.data)
        elif kind == "fsyncdir":
            ino, node = self._node(path)
            self.durable_entries[ino] = dict(node.entries)
        elif kind == "mkdir":
            self._add(path, Node("dir"))
        elif kind in ("unlink", "rmdir"):
            parent, name = self._parent(path)
            if parent.entries.pop(name, None) is None:
                raise Unsupported(f"{path} was never created")
        elif kind == "rename":
            ino = self._node(path)[0]
            parent, name = self._parent(path)
            new_parent, new_name = self._parent(op["to"])
            del parent.entries[name]
            new_parent.entries[new_name] = ino
        elif kind == "link":
            ino = self._node(op["source"])[0]
            parent, name = self._parent(path)
            parent.entries[name] = ino
        elif kind == "symlink":
            if "source" not in op:
                raise Unsupported(f"symlink {path} without its target")
            self._add(path, Node("link", target=op["source"]))

    # -- images --------------------------------------------------------------
    def image(self, kept: frozenset[tuple[str, int]] | None = None) -> Image:
        """The folder a restart finds: as it is now (`kept` None), or after a power loss
        that kept only the pending changes named in `kept` (("data", ino) or
        ("entries", ino)) and lost the rest."""
        found: Image = {}
        self._into(found, 0, "", kept, set())
        return found

    def _into(self, found: Image, ino: int, rel: str, kept: frozenset | None,
              seen: set[int]) -> None:
        entries = self.nodes[ino].entries
        if kept is not None and ("entries", ino) not in kept:
            entries = self.durable_entries.get(ino, {})
        for name, child in sorted(entries.items()):
            node, path = self.nodes[child], _join(rel, name)
            if node.kind == "dir":
                found[path] = ("dir",)
                if child not in seen:  # a directory reached twice: hard links cannot
                    self._into(found, child, path, kept, seen | {child})
            elif node.kind == "link":
                found[path] = ("link", node.target)
            else:
                data = bytes(node.data)
                if kept is not None and ("data", child) not in kept:
                    data = self.durable_data.get(child, b"")
                found[path] = ("file", data)

    def order(self) -> dict[str, int]:
        """Each path's last change, as an operation number (its mtime's order), for
        paths changed since the record began."""
        found: dict[str, int] = {}
        stack = [(0, "")]
        while stack:
            ino, rel = stack.pop()
            for name, child in self.nodes[ino].entries.items():
                path = _join(rel, name)
                if child in self.changed:
                    found[path] = self.changed[child]
                if self.nodes[child].kind == "dir":
                    stack.append((child, path))
        return found

    def pending(self) -> list[tuple[str, int]]:
        """The changes a power loss may drop: unsynced data and unsynced entries."""
        found = []
        for ino, node in sorted(self.nodes.items()):
            if node.kind == "dir" and node.entries != self.durable_entries.get(ino, {}):
                found.append(("entries", ino))
            elif node.kind == "file" and bytes(node.data) != self.durable_data.get(ino, b""):
                found.append(("data", ino))
        return found


@dataclass(frozen=True)
class CrashState:
    mode: str  # an entry of MODES
    cut: int  # operations fully applied (a prefix of the record)
    image: Image
    detail: str  # for people: which operation, what was torn or lost
    keep: float | None = None  # torn: the fraction of the write that reached the disk
    order: dict[str, int] = field(default_factory=dict, compare=False)  # Folder.order()

    @property
    def digest(self) -> str:
        return image_digest(self.image)


@dataclass
class Ranks:
    """Which rank made each operation, and when each rank entered its collectives (the
    recording's `sync` events; chaos.rank.syncwatch): how far the other ranks get after
    one of them died."""

    of_op: list[int | None]  # per operation of the record; None: no rank's process
    syncs: dict[int, list[float]]  # rank -> the times it entered a collective, in order

    def run_on(self, ops: list[Event], cut: int) -> list[int]:
        """The operations after `cut` that the other ranks still make when the rank of
        operation `cut` - 1 dies right after it: each runs on until the first collective
        the dead rank never entered (there it waits until the job is torn down)."""
        dead, t = self.of_op[cut - 1], ops[cut - 1]["t"]
        if dead is None:
            return []
        entered = sum(1 for when in self.syncs.get(dead, []) if when <= t)
        found = []
        for number in range(cut, len(ops)):
            rank = self.of_op[number]
            if rank is None or rank == dead:
                continue
            entries = self.syncs.get(rank, [])
            if entered >= len(entries) or ops[number]["t"] < entries[entered]:
                found.append(number)
        return found


@dataclass
class Enumeration:
    states: list[CrashState]  # explored
    total: int  # states that exist (more than explored where combinations were sampled)


def enumerate_states(start: Folder, ops: list[Event], blobs: bytes, first: int,
                     modes: list[str], seed: int, combos: int = 16,
                     torn_fractions: int = 2, inner_writes: int = 2,
                     ranks: Ranks | None = None) -> Enumeration:
    """The crash states of `modes` after operations `first` .. len(ops) (the save under
    test; the ones before it are applied first). `start` is changed in place.

    A kill stops every rank at once; with `ranks`, also one rank alone, the others
    running on to their next collective (`Ranks.run_on`), as when one process dies.

    A file written in many calls (a 100 kB `torch.save` is ~50 writes through the
    filesystem) gives as many prefixes of one file; states are taken at every operation
    that is not a write, at the first and last write of each run of writes to one file,
    and at `inner_writes` seeded writes between (`total` counts them all)."""
    rng = random.Random(seed)
    pristine = copy.deepcopy(start)
    chosen = _chosen_cuts(ops, first, rng, inner_writes)
    states: list[CrashState] = []
    total = 0
    for op in ops[:first]:
        start.apply(op, op_bytes(op, blobs))
    for cut in range(first, len(ops) + 1):
        if cut > first:
            op = ops[cut - 1]
            if "torn" in modes and op["op"] == "write" and op["size"] > 1:
                total += torn_fractions
                if cut in chosen:
                    for keep in _fractions(rng, torn_fractions):
                        data = op_bytes(op, blobs)
                        start.apply(op, data[: int(len(data) * keep)])
                        states.append(CrashState("torn", cut, start.image(), _torn(op, keep),
                                                 keep, start.order()))
            start.apply(op, op_bytes(op, blobs))
        where = _after(ops, cut, first)
        if "kill" in modes:
            total += 1
            if cut in chosen:
                states.append(CrashState("kill", cut, start.image(), f"kill {where}",
                                         order=start.order()))
            if ranks is not None and cut > first and (extra := ranks.run_on(ops, cut)):
                total += 1
                if cut in chosen:
                    states.append(_run_on_state(pristine, ops, blobs, cut, extra, where,
                                                ranks.of_op[cut - 1]))
        if "lose_unsynced" in modes:
            if cut in chosen:
                found, count = _power_losses(start, where, cut, rng, combos)
                states.extend(found)
            else:
                count = 2 ** len(start.pending())
            total += count
    return Enumeration(states, total)


def _run_on_state(pristine: Folder, ops: list[Event], blobs: bytes, cut: int,
                  extra: list[int], where: str, dead: int | None) -> CrashState:
    folder = copy.deepcopy(pristine)
    for number in [*range(cut), *extra]:
        folder.apply(ops[number], op_bytes(ops[number], blobs))
    return CrashState("kill", cut, folder.image(),
                      f"kill rank {dead} {where}; the others ran on {len(extra)} operation(s)",
                      order=folder.order())


def _chosen_cuts(ops: list[Event], first: int, rng: random.Random, inner: int) -> set[int]:
    """The cuts (operations applied) states are taken at; see enumerate_states."""
    chosen = {first}
    run: list[int] = []  # cuts after consecutive writes to one file
    for cut in range(first + 1, len(ops) + 1):
        op = ops[cut - 1]
        if op["op"] != "write":
            chosen.add(cut)
            continue
        run.append(cut)
        after = ops[cut] if cut < len(ops) else None
        if after is None or after["op"] != "write" or after.get("path") != op.get("path"):
            middle = run[1:-1]
            chosen.update({run[0], run[-1], *rng.sample(middle, min(inner, len(middle)))})
            run = []
    return chosen


def _power_losses(folder: Folder, where: str, cut: int, rng: random.Random,
                  combos: int) -> tuple[list[CrashState], int]:
    pending = folder.pending()
    count = 2 ** len(pending)
    if count <= combos:
        chosen = [frozenset(c) for n in range(len(pending) + 1)
                  for c in itertools.combinations(pending, n)]
    else:  # all lost first, then a seeded sample of the rest
        chosen = [frozenset()] + [frozenset(p for p in pending if rng.random() < 0.5)
                                  for _ in range(combos - 1)]
    states = []
    for kept in dict.fromkeys(chosen):
        lost = len(pending) - len(kept)
        what = "nothing pending" if not pending else f"{lost} of {len(pending)} pending lost"
        states.append(CrashState("lose_unsynced", cut, folder.image(kept),
                                 f"power loss {where} ({what})", order=folder.order()))
    return states, count


def _fractions(rng: random.Random, n: int) -> list[float]:
    """Where a torn write stops: half way (the chaos run's default), then seeded."""
    return [0.5, *(round(rng.uniform(0.05, 0.95), 3) for _ in range(n - 1))]


def _torn(op: Event, keep: float) -> str:
    return (f"torn write of {op['path']} at offset {op['offset']}: {int(op['size'] * keep)}"
            f" of {op['size']} bytes")


def _after(ops: list[Event], cut: int, first: int) -> str:
    if cut == first:
        return "before the save's first operation"
    op = ops[cut - 1]
    to = f" -> {op['to']}" if op["op"] == "rename" else ""
    return f"after #{cut - first} {op['op']} {op.get('path') or '.'}{to}"


def op_bytes(op: Event, blobs: bytes) -> bytes:
    """A recorded write's bytes (nothing for any other operation)."""
    if op["op"] != "write":
        return b""
    if "blob" not in op:
        raise Unsupported(f"write to {op['path']} without its bytes (not a recording)")
    offset, size = op["blob"]
    return blobs[offset:offset + size]


def image_digest(image: Image) -> str:
    h = hashlib.sha256()
    for path, entry in sorted(image.items()):
        h.update(f"{path}\0{entry[0]}\0".encode())
        if entry[0] == "file":
            h.update(hashlib.sha256(entry[1]).digest())
        elif entry[0] == "link":
            h.update(entry[1].encode())
    return h.hexdigest()


# -- what a recovery looked at ----------------------------------------------
View = list[tuple[str, str]]  # (stat | list | read, relative path), in the order seen


def recovery_view(events: list[Event]) -> View:
    """The paths a recovery looked at, in order: the folder it found decides its course
    only through these. Left out: a path once the recovery set it itself (created,
    truncated, renamed onto or removed: what it sees there is its own doing), and the
    kernel's lookup just before `open(path, "wb")` (a create or truncating open without
    O_EXCL goes on the same way whatever the lookup found; an explicit `exists()`
    before it is a lookup of its own, and stays)."""
    ordered = sorted(events, key=lambda e: e["t"])
    following: dict[int, Event] = {}  # event number -> the same process's next event
    last: dict[object, int] = {}
    for number, e in enumerate(ordered):
        if e.get("pid") in last:
            following[last[e.get("pid")]] = e
        last[e.get("pid")] = number
    owned: set[str] = set()
    view: View = []
    for number, e in enumerate(ordered):
        path = e.get("path", "")
        if e["ev"] == "fs" and e.get("op") in MUTATIONS:
            if e["op"] in ("create", "mkdir", "symlink", "unlink", "rmdir", "rename") or (
                    e["op"] == "open" and e.get("trunc")):
                owned.update({path, e.get("to", path)})
        elif e["ev"] == "fs_read" and path not in owned:
            if e["op"] == "stat" and _truncating_create(following.get(number), path):
                continue
            view.append((e["op"], path))
    return view


def _truncating_create(then: Event | None, path: str) -> bool:
    return (then is not None and then["ev"] == "fs" and then.get("path") == path
            and not then.get("excl")
            and (then.get("op") == "create" or (then.get("op") == "open" and then.get("trunc"))))


def view_key(image: Image, view: View) -> str:
    """What `image` shows a recovery that looks at `view`: equal keys, equal recovery."""
    h = hashlib.sha256()
    for op, path in view:
        entry = image.get(path, ("dir",) if path == "" else None)
        if op == "list":
            names = sorted(p.rsplit("/", 1)[-1] for p in image
                           if os.path.dirname(p) == path) if entry == ("dir",) else None
            shown = repr(names)
        elif entry is None:
            shown = "missing"
        elif op == "read" and entry[0] == "file":
            shown = hashlib.sha256(entry[1]).hexdigest()
        elif entry[0] == "file":
            shown = f"file {len(entry[1])}"
        else:
            shown = repr(entry)
        h.update(f"{op}\0{path}\0{shown}\n".encode())
    return h.hexdigest()


def materialise(image: Image, into: Path, order: dict[str, int] | None = None) -> None:
    """Write the image under `into` (created). Paths in `order` get modification times
    in that order, 1 ms apart and in the past (a resume that takes the newest file by
    mtime finds what it would after the crash); the others are older still."""
    into.mkdir(parents=True, exist_ok=True)
    for path, entry in sorted(image.items()):
        target = into / path
        if entry[0] == "dir":
            target.mkdir(exist_ok=True)
        elif entry[0] == "link":
            os.symlink(entry[1], target)
        else:
            target.write_bytes(entry[1])
    order = order or {}
    now = time.time_ns()
    last = max(order.values(), default=0)
    for path in sorted(image, key=lambda p: -p.count("/")):  # a folder after its entries
        stamp = now - (last + 1 - order.get(path, 0)) * 1_000_000
        os.utime(into / path, ns=(stamp, stamp), follow_symlinks=False)


def _parts(path: str) -> list[str]:
    return [p for p in path.strip("/").split("/") if p and p != "."]


def _join(rel: str, name: str) -> str:
    return name if rel in ("", ".") else f"{rel}/{name}"
