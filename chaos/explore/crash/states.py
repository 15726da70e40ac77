"""Crash states of one recorded save: every folder image a crash in it can leave.

The fault filesystem, in recording mode, writes each operation on the checkpoint
folder into the run's history (`fs` events, in the order they happened, every
write's bytes kept in a blob file). Replaying that record on a model of the
folder gives the folder as it was after any prefix of the operations, without
running the job again (ALICE's idea, for checkpoints):

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

Sizes: a file's content is a list of extents of the blob file
(`torchchaos.explore.crash.extents`), never its bytes. States are planned first
(`plan_states`: a `StateSpec` says which crash, nothing of the folder), sampled
(`sample_specs`), and only then built, one at a time as the record is replayed
again (`build_states`, a generator): memory holds the folder model and one
state, whatever the size of the checkpoints or the number of states.

An image is the folder as the restarted job finds it: names and contents.
Two states whose images agree on everything a recovery looked at (the paths it
stat'ed, the folders it listed, the files it read: `fs_read` events) recover
the same way, so one recovery run serves all of them (`view_key`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from torchchaos.explore.crash.extents import ZERO, Blobs, Content
from torchchaos.rundir.history import Event

if TYPE_CHECKING:
    from torchchaos.faults.faultfs.mount import Mount

# what a restarted job finds at a relative path: ("dir",), ("file", Content), ("link", target)
ImageEntry = tuple
Image = dict[str, ImageEntry]
Kept = frozenset  # of ("data", inode) / ("entries", inode): pending changes a power loss kept

MUTATIONS = ("create", "open", "write", "truncate", "fsync", "fsyncdir", "mkdir", "unlink",
             "rmdir", "rename", "link", "symlink")
MODES = ("kill", "torn", "lose_unsynced")


def replayable(events: Iterable[Event]) -> list[Event]:
    """The recorded operations that change the folder, in order: a file unlinked while
    open is in no folder any more, so what is done to it after (`unlinked`) is in no
    crash state's image."""
    return [e for e in events if e.get("op") in MUTATIONS and not e.get("unlinked")]


class Unsupported(Exception):
    """The record holds something the model cannot replay (an operation on a path it
    never saw created, say): states from it would not be the job's."""


@dataclass
class FileNode:
    kind: str  # "file", "dir" or "link"
    content: Content | None = None  # a file's
    entries: dict[str, int] = field(default_factory=dict)  # a directory's
    target: str = ""  # a link's

    def copy(self) -> FileNode:
        return FileNode(self.kind, self.content, dict(self.entries), self.target)


class Folder:
    """The checkpoint folder as operations change it, and what of it is durable. Holds
    extents, not bytes: a copy (`fork`) costs the number of paths."""

    def __init__(self, blobs: Blobs) -> None:
        self.blobs = blobs
        self.nodes: dict[int, FileNode] = {0: FileNode("dir")}
        self.durable_data: dict[int, Content] = {}
        self.durable_entries: dict[int, dict[str, int]] = {0: {}}
        self.changed: dict[int, int] = {}  # inode -> number of the operation that last changed it
        self._next = 1
        self._ops = 0

    def fork(self) -> Folder:
        """An independent copy (contents are never changed, only replaced: shared)."""
        other = Folder(self.blobs)
        other.nodes = {ino: node.copy() for ino, node in self.nodes.items()}
        other.durable_data = dict(self.durable_data)
        other.durable_entries = {ino: dict(e) for ino, e in self.durable_entries.items()}
        other.changed = dict(self.changed)
        other._next, other._ops = self._next, self._ops
        return other

    # -- names ----------------------------------------------------------------
    def _lookup(self, path: str) -> int | None:
        ino = 0
        for part in _parts(path):
            node = self.nodes[ino]
            if node.kind != "dir" or part not in node.entries:
                return None
            ino = node.entries[part]
        return ino

    def _parent(self, path: str) -> tuple[FileNode, str]:
        parts = _parts(path)
        if not parts:
            raise Unsupported("an operation on the folder's root itself")
        ino = self._lookup("/".join(parts[:-1]))
        if ino is None or self.nodes[ino].kind != "dir":
            raise Unsupported(f"no folder holds {path}")
        return self.nodes[ino], parts[-1]

    def _node(self, path: str) -> tuple[int, FileNode]:
        ino = self._lookup(path)
        if ino is None:
            raise Unsupported(f"{path} was never created")
        return ino, self.nodes[ino]

    def _add(self, path: str, node: FileNode) -> int:
        parent, name = self._parent(path)
        ino = self._next
        self._next += 1
        self.nodes[ino] = node
        parent.entries[name] = ino
        if node.kind == "dir":
            self.durable_entries[ino] = {}
        else:  # created, never synced: empty after a power loss
            self.durable_data[ino] = Content.empty(self.blobs)
        return ino

    # -- operations ----------------------------------------------------------
    def apply(self, op: Event) -> None:
        """One recorded operation."""
        self._apply(op)
        self._ops += 1
        if op["op"] not in ("fsync", "fsyncdir"):
            path = op.get("path", "")
            for changed in (path, os.path.dirname(path), op.get("to")):
                ino = self._lookup(changed) if changed is not None else None
                if ino is not None:
                    self.changed[ino] = self._ops

    def torn(self, op: Event, keep: float) -> tuple[int, Content]:
        """Write `op` cut to `keep` of its bytes: the file's inode and content then (the
        folder itself is not changed)."""
        ino, node = self._node(op["path"])
        blob, size = _blob(op)
        return ino, node.content.write(op["offset"], blob, int(size * keep))

    def _apply(self, op: Event) -> None:
        kind, path = op["op"], op.get("path", "")
        if kind in ("create", "open"):
            ino = self._lookup(path)
            if ino is None:
                self._add(path, FileNode("file", Content.empty(self.blobs)))
            elif op.get("trunc"):
                self.nodes[ino].content = self.nodes[ino].content.truncate(0)
        elif kind == "write":
            node = self._node(path)[1]
            node.content = node.content.write(op["offset"], *_blob(op))
        elif kind == "truncate":
            node = self._node(path)[1]
            node.content = node.content.truncate(op["length"])
        elif kind == "fsync":
            ino, node = self._node(path)
            self.durable_data[ino] = node.content
        elif kind == "fsyncdir":
            ino, node = self._node(path)
            self.durable_entries[ino] = dict(node.entries)
        elif kind == "mkdir":
            self._add(path, FileNode("dir"))
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
            self._add(path, FileNode("link", target=op["source"]))

    # -- images --------------------------------------------------------------
    def image(self, kept: Kept | None = None,
              override: tuple[int, Content] | None = None) -> Image:
        """The folder a restart finds: as it is now (`kept` None), or after a power loss
        that kept only the pending changes named in `kept` and lost the rest;
        `override`: one file's content instead of its own (a torn write)."""
        found: Image = {}
        self._into(found, 0, "", kept, dict([override]) if override else {}, set())
        return found

    def _into(self, found: Image, ino: int, rel: str, kept: Kept | None,
              override: dict[int, Content], seen: set[int]) -> None:
        entries = self.nodes[ino].entries
        if kept is not None and ("entries", ino) not in kept:
            entries = self.durable_entries.get(ino, {})
        for name, child in sorted(entries.items()):
            node, path = self.nodes[child], _join(rel, name)
            if node.kind == "dir":
                found[path] = ("dir",)
                if child not in seen:  # a directory reached twice: hard links cannot
                    self._into(found, child, path, kept, override, seen | {child})
            elif node.kind == "link":
                found[path] = ("link", node.target)
            else:
                content = override.get(child, node.content)
                if kept is not None and ("data", child) not in kept:
                    content = self.durable_data.get(child) or Content.empty(self.blobs)
                found[path] = ("file", content)

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
        """The changes a power loss may drop: unsynced data and unsynced entries
        (versions compared by their extents, never by bytes)."""
        found = []
        for ino, node in sorted(self.nodes.items()):
            if node.kind == "dir" and node.entries != self.durable_entries.get(ino, {}):
                found.append(("entries", ino))
            elif node.kind == "file" and not node.content.same(self.durable_data.get(ino)):
                found.append(("data", ino))
        return found


def _blob(op: Event) -> tuple[int, int]:
    """Where a recorded write's bytes are in the blob file: (offset, size)."""
    if "blob" not in op:
        raise Unsupported(f"write to {op['path']} without its bytes (not a recording)")
    offset, size = op["blob"]
    return offset, size


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
        return list(self._running_on(ops, cut, every=True))

    def runs_on(self, ops: list[Event], cut: int) -> bool:
        """Whether `run_on` finds any operation: each other rank's next one decides
        (its later ones come later still), so this stops early."""
        return next(self._running_on(ops, cut, every=False), None) is not None

    def _running_on(self, ops: list[Event], cut: int, every: bool) -> Iterator[int]:
        dead, t = self.of_op[cut - 1], ops[cut - 1]["t"]
        if dead is None:
            return
        entered = sum(1 for when in self.syncs.get(dead, []) if when <= t)
        others = {r for r in self.of_op if r is not None and r != dead}
        for number in range(cut, len(ops)):
            rank = self.of_op[number]
            if rank is None or rank == dead or (not every and rank not in others):
                continue
            entries = self.syncs.get(rank, [])
            if entered >= len(entries) or ops[number]["t"] < entries[entered]:
                yield number
            elif not every:
                others.discard(rank)
                if not others:
                    return


@dataclass(frozen=True)
class StateSpec:
    """Which crash a state is, and nothing of the folder it leaves (`build_states`
    makes that): a save's thousands of specs cost kilobytes."""

    mode: str  # an entry of MODES
    cut: int  # operations fully applied (a prefix of the record)
    detail: str  # for people: which operation, what was torn or lost
    keep: float | None = None  # torn: the fraction of the write that reached the disk
    kept: Kept | None = None  # lose_unsynced: the pending changes the disk had written
    run_on: tuple[int, ...] | None = None  # one rank killed: the others' later operations
    tier: int = 0  # sampling order under a cap: 0 first (see sample_specs)


@dataclass
class CrashState:
    """A crash state built: the folder image a restart finds (extents, not bytes)."""

    mode: str
    cut: int
    image: Image
    detail: str
    keep: float | None = None
    order: dict[str, int] = field(default_factory=dict)  # Folder.order()
    # not a kill: what the crash took from the folder as the page cache had it
    # ("removed", "reverted_files", "restored": paths, as a chaos run's fs_crash says)
    dropped: dict[str, list[str]] | None = None

    @property
    def digest(self) -> str:
        return image_digest(self.image)


@dataclass
class Enumeration:
    specs: list[StateSpec]  # the candidates: at the chosen cuts, combinations up to `combos`
    total: int  # states that exist (more than the candidates where cuts and combinations
    # were chosen)


def plan_states(ops: list[Event], first: int, modes: list[str], seed: int, combos: int = 16,
                torn_fractions: int = 2, inner_writes: int = 2,
                ranks: Ranks | None = None) -> Enumeration:
    """The crash states of `modes` after operations `first` .. len(ops) (the save under
    test; the ones before it are replayed first), as specs: no image is built and no
    byte read.

    A kill stops every rank at once; with `ranks`, also one rank alone, the others
    running on to their next collective (`Ranks.run_on`), as when one process dies.

    A file written in many calls (torch.save of 1 GB is thousands of writes through the
    filesystem, other ranks' writes between them) gives as many prefixes of one file;
    states are taken at every operation that is not a write and, of each file's own
    run of writes, at the first, the last and `inner_writes` seeded ones between,
    whatever the other files got meanwhile (`total` counts every cut)."""
    rng = random.Random(seed)
    folder = Folder(Blobs.of_bytes(b""))  # planning compares extents, reads nothing
    chosen = _chosen_cuts(ops, first, rng, inner_writes)
    specs: list[StateSpec] = []
    total = 0
    for op in ops[:first]:
        folder.apply(op)
    for cut in range(first, len(ops) + 1):
        if cut > first:
            op = ops[cut - 1]
            if "torn" in modes and op["op"] == "write" and op["size"] > 1:
                total += torn_fractions
                if cut in chosen:
                    specs += [StateSpec("torn", cut, _torn(op, keep), keep=keep, tier=min(n, 1))
                              for n, keep in enumerate(_fractions(rng, torn_fractions))]
            folder.apply(op)
        where = _after(ops, cut, first)
        if "kill" in modes:
            total += 1
            if cut in chosen:
                specs.append(StateSpec("kill", cut, f"kill {where}"))
            if ranks is not None and cut > first:
                if cut not in chosen:
                    total += ranks.runs_on(ops, cut)
                elif extra := ranks.run_on(ops, cut):
                    total += 1
                    specs.append(StateSpec(
                        "kill", cut, f"kill rank {ranks.of_op[cut - 1]} {where}; the others"
                        f" ran on {len(extra)} operation(s)", run_on=tuple(extra), tier=1))
        if "lose_unsynced" in modes:
            pending = folder.pending()
            total += 2 ** len(pending)
            if cut in chosen:
                specs += _power_losses(pending, where, cut, rng, combos)
    return Enumeration(specs, total)


def build_states(ops: list[Event], blobs: Blobs, first: int,
                 specs: list[StateSpec]) -> Iterator[CrashState]:
    """The states of `specs` (in `plan_states`'s order), built one at a time as the
    record is replayed: each shares the folder model's extents and is dropped by the
    caller once judged."""
    folder = Folder(blobs)
    at: dict[int, list[StateSpec]] = {}
    for spec in specs:
        at.setdefault(spec.cut, []).append(spec)
    for op in ops[:first]:
        folder.apply(op)
    for cut in range(first, max(at, default=first - 1) + 1):
        torn: dict[float, tuple[int, Content]] = {}
        if cut > first:
            op = ops[cut - 1]
            torn = {s.keep: folder.torn(op, s.keep) for s in at.get(cut, ())
                    if s.mode == "torn"}
            folder.apply(op)
        if cut not in at:
            continue
        before, order = folder.image(), folder.order()
        for spec in at[cut]:
            if spec.mode == "kill" and spec.run_on is None:
                yield CrashState("kill", cut, before, spec.detail, order=order)
            elif spec.mode == "kill":
                ran_on = _ran_on(folder.fork(), [ops[number] for number in spec.run_on])
                yield CrashState("kill", cut, ran_on.image(), spec.detail,
                                 order=ran_on.order())
            else:
                image = (folder.image(override=torn[spec.keep]) if spec.mode == "torn" else
                         folder.image(spec.kept))
                yield CrashState(spec.mode, cut, image, spec.detail, spec.keep, order,
                                 _dropped(before, image))


def _ran_on(folder: Folder, ops: list[Event]) -> Folder:
    """`folder` with the other ranks' operations after a death applied. A rank stops at
    the first that needs what the dead rank had not made yet: ranks that all make one
    folder (`makedirs(exist_ok=True)`) race for it, the recording shows only the winner's
    mkdir, and with the winner dead the others would have made it themselves; the state
    where they had not got that far yet is the one built."""
    stuck: set[object] = set()
    for op in ops:
        if op.get("pid") in stuck:
            continue
        try:
            folder.apply(op)
        except Unsupported:
            stuck.add(op.get("pid"))
    return folder


def _dropped(before: Image, after: Image) -> dict[str, list[str]]:
    def differs(old: ImageEntry, new: ImageEntry) -> bool:
        return old[0] != new[0] or (old[0] == "file" and not old[1].same(new[1])) or (
            old[0] == "link" and old != new)

    return {"removed": sorted(p for p in before if p not in after),
            "reverted_files": sorted(p for p, e in before.items() if e[0] == "file"
                                     and p in after and differs(e, after[p])),
            "restored": sorted(p for p in after if p not in before)}


def sample_specs(specs: list[StateSpec], cap: int | None, seed: int) -> list[StateSpec]:
    """At most `cap` of `specs`, in their order: the modes take turns, and each mode
    gives its tier 0 first (every kill of all ranks, every torn write at the default
    fraction, the power loss that loses everything pending, at each cut), in seeded
    order across the cuts, before its other states (one rank killed, other fractions,
    other combinations of pending changes kept)."""
    if cap is None or len(specs) <= cap:
        return specs
    rng = random.Random(seed)
    queues: dict[str, list[int]] = {}
    for number, spec in enumerate(specs):
        queues.setdefault(spec.mode, []).append(number)
    for queue in queues.values():
        rng.shuffle(queue)
        queue.sort(key=lambda n: specs[n].tier)
    turns = [iter(queues[mode]) for mode in MODES if mode in queues]
    chosen: list[int] = []
    while len(chosen) < cap:
        chosen += [n for n in (next(turn, None) for turn in turns) if n is not None]
    return [specs[n] for n in sorted(chosen[:cap])]


def coverage(sampled: list[StateSpec], specs: list[StateSpec]) -> str:
    """What a sample covers, mode by mode ("kill 12/40, torn 10/80, ...")."""
    def count(mode: str, among: list[StateSpec]) -> int:
        return sum(1 for s in among if s.mode == mode)

    return ", ".join(f"{mode} {count(mode, sampled)}/{count(mode, specs)}"
                     for mode in MODES if count(mode, specs))


def _chosen_cuts(ops: list[Event], first: int, rng: random.Random, inner: int) -> set[int]:
    """The cuts (operations applied) states are taken at; see plan_states."""
    chosen = {first}
    runs: dict[str, list[int]] = {}  # path -> cuts after its writes since its last other op

    def close(path: str | None) -> None:
        run = runs.pop(path, None) if path is not None else None
        if run:
            middle = run[1:-1]
            chosen.update({run[0], run[-1], *rng.sample(middle, min(inner, len(middle)))})

    for cut in range(first + 1, len(ops) + 1):
        op = ops[cut - 1]
        if op["op"] == "write":
            runs.setdefault(op["path"], []).append(cut)
            continue
        chosen.add(cut)
        close(op.get("path"))
        close(op.get("to"))
    for path in list(runs):
        close(path)
    return chosen


def _power_losses(pending: list[tuple[str, int]], where: str, cut: int,
                  rng: random.Random, combos: int) -> list[StateSpec]:
    if 2 ** len(pending) <= combos:
        chosen = [frozenset(c) for n in range(len(pending) + 1)
                  for c in itertools.combinations(pending, n)]
    else:  # all lost first, then a seeded sample of the rest
        chosen = [frozenset()] + [frozenset(p for p in pending if rng.random() < 0.5)
                                  for _ in range(combos - 1)]
    specs = []
    for kept in dict.fromkeys(chosen):
        lost = len(pending) - len(kept)
        what = "nothing pending" if not pending else f"{lost} of {len(pending)} pending lost"
        specs.append(StateSpec("lose_unsynced", cut, f"power loss {where} ({what})",
                               kept=kept, tier=0 if not kept else 2))
    return specs


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


def image_digest(image: Image) -> str:
    h = hashlib.sha256()
    for path, entry in sorted(image.items()):
        h.update(f"{path}\0{entry[0]}\0".encode())
        if entry[0] == "file":
            h.update(entry[1].digest().encode())
        elif entry[0] == "link":
            h.update(entry[1].encode())
    return h.hexdigest()


def plain(image: Image) -> dict[str, tuple]:
    """The image with every file's bytes read: for tests and small folders only."""
    return {path: ("file", entry[1].read()) if entry[0] == "file" else entry
            for path, entry in image.items()}


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
            shown = entry[1].digest()
        elif entry[0] == "file":
            shown = f"file {entry[1].size}"
        else:
            shown = repr(entry)
        h.update(f"{op}\0{path}\0{shown}\n".encode())
    return h.hexdigest()


def materialise(image: Image, into: Path, order: dict[str, int] | None = None) -> None:
    """Write the image under `into` (created): each file copied from the blob file in
    the kernel, once. Paths in `order` get modification times in that order (`_stamp`)."""
    into.mkdir(parents=True, exist_ok=True)
    _tree(image, into, lambda target, content: content.write_to(target))
    _stamp(image, into, order or {})


def lay(image: Image, mount: Mount, blobs: Path, order: dict[str, int] | None = None) -> None:
    """Lay the image out under a recording mount with no copy of its bytes: folders,
    links and files of the right size (holes) behind the mount, then the daemon lays
    each file's extents of the recording's blob file `blobs` over it
    (`torchchaos.faults.faultfs.recording`). A recovery from a state of a GB checkpoint
    reads it from the recording, as a copy would have been read."""
    into = mount.backing()
    files: dict[str, list[list[int]]] = {}

    def hole(target: Path, content: Content) -> None:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.truncate(target, content.size)
        files[str(target.relative_to(into))] = _pieces(content)

    _tree(image, into, hole)
    _stamp(image, into, order or {})
    answer = mount.request({"cmd": "lay", "blobs": str(blobs), "files": files})
    if not answer.get("ok"):
        raise OSError(f"the recovery's mount would not lay out the state: {answer}")


def _tree(image: Image, into: Path, write: Callable[[Path, Content], None]) -> None:
    """The image's folders and links under `into`, and each file as `write` makes it."""
    for path, entry in sorted(image.items()):
        target = into / path
        if entry[0] == "dir":
            target.mkdir(exist_ok=True)
        elif entry[0] == "link":
            os.symlink(entry[1], target)
        else:
            write(target, entry[1])


def _pieces(content: Content) -> list[list[int]]:
    """[offset in the file, length, offset in the blob file] of each extent with bytes."""
    pieces, at = [], 0
    for offset, length in content.extents():
        if offset != ZERO:
            pieces.append([at, length, offset])
        at += length
    return pieces


def _stamp(image: Image, into: Path, order: dict[str, int]) -> None:
    """Modification times: paths in `order` in that order, 1 ms apart and in the past (a
    resume that takes the newest file by mtime finds what it would after the crash);
    the others older still."""
    now = time.time_ns()
    last = max(order.values(), default=0)
    for path in sorted(image, key=lambda p: -p.count("/")):  # a folder after its entries
        stamp = now - (last + 1 - order.get(path, 0)) * 1_000_000
        os.utime(into / path, ns=(stamp, stamp), follow_symlinks=False)


# -- keeping a state to rebuild it later ---------------------------------------
def describe(state: CrashState, blobs: Path) -> dict:
    """What rebuilds the state's image (`rebuild`): its extents of the blob file, not a
    copy of its bytes."""
    paths = {}
    for path, entry in state.image.items():
        if entry[0] == "file":
            paths[path] = {"file": entry[1].extents(), "size": entry[1].size}
        else:
            paths[path] = {entry[0]: entry[1] if entry[0] == "link" else True}
    return {"state": state.detail, "blobs": str(blobs), "order": state.order,
            "paths": paths}


def rebuild(described: dict, into: Path) -> None:
    """Write the image `describe` described under `into`."""
    blobs = Blobs(Path(described["blobs"]))
    image: Image = {}
    for path, entry in described["paths"].items():
        if "file" in entry:
            pieces = [(offset, length) for offset, length in entry["file"]]
            image[path] = ("file", Content(blobs, pieces, len(pieces), entry["size"]))
        else:
            image[path] = ("link", entry["link"]) if "link" in entry else ("dir",)
    materialise(image, into, described["order"])
    blobs.close()


def _parts(path: str) -> list[str]:
    return [p for p in path.strip("/").split("/") if p and p != "."]


def _join(rel: str, name: str) -> str:
    return name if rel in ("", ".") else f"{rel}/{name}"


if __name__ == "__main__":  # python -m torchchaos.explore.crash.states IMAGE.json INTO
    if len(sys.argv) != 3 or Path(sys.argv[2]).exists():
        sys.exit("usage: python -m torchchaos.explore.crash.states IMAGE.json INTO  (INTO: a"
                 " folder that does not exist yet)")
    rebuild(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
