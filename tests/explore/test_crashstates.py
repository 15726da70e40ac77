"""The crash states a recorded save allows (torchchaos.explore.crash.states): pure, no job."""

from __future__ import annotations

import hashlib
import json
import os
import time
import tracemalloc

import pytest

from torchchaos.explore.crash.extents import Blobs, Content
from torchchaos.explore.crash.states import (
    Ranks,
    Unsupported,
    build_states,
    coverage,
    describe,
    materialise,
    plain,
    plan_states,
    rebuild,
    recovery_view,
    sample_specs,
    view_key,
)


def _record(*ops: tuple) -> tuple[list[dict], bytes]:
    """Operations as the recording filesystem writes them: ("write", path, bytes) keeps
    the bytes in the blob file."""
    events, blobs = [], b""
    for t, (op, path, *rest) in enumerate(ops):
        event = {"ev": "fs", "t": float(t), "op": op, "path": path}
        if op == "write":
            data = rest[0]
            event.update(offset=rest[1] if len(rest) > 1 else 0, size=len(data),
                         blob=[len(blobs), len(data)])
            blobs += data
        elif op == "rename":
            event["to"] = rest[0]
        events.append(event)
    return events, blobs


# temp file, fsync, rename over the pointer, fsync of the folder: the correct publish
PUBLISH = _record(("create", ".tmp"), ("write", ".tmp", b"step 20"), ("fsync", ".tmp"),
                  ("rename", ".tmp", "latest"), ("fsyncdir", ""))
BEFORE = _record(("create", "latest"), ("write", "latest", b"step 10"), ("fsync", "latest"),
                 ("fsyncdir", ""))


def _enumerate(record, modes, first=0, seed=0, ranks=None):
    ops, blobs = record
    found = plan_states(ops, first, modes, seed, ranks=ranks)
    states = list(build_states(ops, Blobs.of_bytes(blobs), first, found.specs))
    for state in states:
        state.image = plain(state.image)
    return found, states


def _states(record, modes, first=0):
    return _enumerate(record, modes, first)[1]


def _joined():
    ops = BEFORE[0] + [{**e, "blob": [e["blob"][0] + len(BEFORE[1]), e["blob"][1]]}
                       if "blob" in e else e for e in PUBLISH[0]]
    return ops, BEFORE[1] + PUBLISH[1]


def test_kill_states_are_the_prefixes_and_the_page_cache_survives():
    ops, blobs = _joined()
    kills = _states((ops, blobs), ["kill"], first=len(BEFORE[0]))
    assert [s.cut for s in kills] == [4, 5, 6, 7, 8, 9]
    assert kills[0].image == {"latest": ("file", b"step 10")}
    assert kills[2].image == {"latest": ("file", b"step 10"), ".tmp": ("file", b"step 20")}
    assert kills[-1].image == {"latest": ("file", b"step 20")}
    assert "after #4 rename .tmp -> latest" in kills[4].detail


def test_a_power_loss_keeps_what_was_fsynced_and_tries_each_pending_change():
    ops, blobs = _joined()
    losses = _states((ops, blobs), ["lose_unsynced"], first=len(BEFORE[0]))
    after_rename = [s for s in losses if s.cut == 8]
    # pending: the folder's entries only (.tmp's data was fsynced): lost or kept
    assert {tuple(s.image.items()) for s in after_rename} == {
        (("latest", ("file", b"step 10")),), (("latest", ("file", b"step 20")),)}
    after_write = [s for s in losses if s.cut == 6]
    # new .tmp entry and its unsynced data: 4 combinations, the data alone cannot show
    images = [s.image for s in after_write]
    assert {"latest": ("file", b"step 10")} in images  # all lost
    assert {"latest": ("file", b"step 10"), ".tmp": ("file", b"")} in images
    assert {"latest": ("file", b"step 10"), ".tmp": ("file", b"step 20")} in images


def test_a_missing_fsync_before_the_rename_can_leave_an_empty_checkpoint():
    ops, blobs = _record(("create", ".tmp"), ("write", ".tmp", b"data"),
                         ("rename", ".tmp", "ckpt"), ("fsyncdir", ""))
    last = [s for s in _states((ops, blobs), ["lose_unsynced"]) if s.cut == 4]
    assert {"ckpt": ("file", b"")} in [s.image for s in last]


def test_torn_writes_keep_a_seeded_prefix_of_the_write():
    ops, blobs = _record(("create", "ckpt"), ("write", "ckpt", b"0123456789"),
                         ("write", "ckpt", b"abcdefghij", 10))
    torn = _states((ops, blobs), ["torn"])
    assert [s.keep for s in torn][::2] == [0.5, 0.5]
    assert torn[0].image == {"ckpt": ("file", b"01234")}
    assert torn[2].image == {"ckpt": ("file", b"0123456789abcde")}
    assert all(0 < len(s.image["ckpt"][1]) < 20 for s in torn)


def test_folders_links_and_truncation_replay():
    ops, blobs = _record(("mkdir", "step-2"), ("create", "step-2/a"),
                         ("write", "step-2/a", b"xyz"), ("rename", "step-2", "final"),
                         ("unlink", "final/a"), ("rmdir", "final"))
    kills = _states((ops, blobs), ["kill"])
    assert kills[4].image == {"final": ("dir",), "final/a": ("file", b"xyz")}
    assert kills[6].image == {}
    with pytest.raises(Unsupported):
        _states(_record(("write", "nowhere", b"x")), ["kill"])


def _content(data: bytes) -> Content:
    blobs = Blobs.of_bytes(data)
    return Content.empty(blobs).write(0, 0, len(data))


def test_images_materialise_as_files(tmp_path):
    materialise({"d": ("dir",), "d/f": ("file", _content(b"abc")), "l": ("link", "d/f")},
                tmp_path / "i")
    assert (tmp_path / "i" / "d" / "f").read_bytes() == b"abc"
    assert (tmp_path / "i" / "l").read_bytes() == b"abc"


def test_a_recovery_view_tells_apart_only_what_the_recovery_looked_at():
    events = [{"ev": "fs_read", "t": 1.0, "op": "read", "path": "latest"},
              {"ev": "fs_read", "t": 2.0, "op": "stat", "path": "step-10"},
              {"ev": "fs_read", "t": 3.0, "op": "list", "path": ""},
              {"ev": "fs", "t": 4.0, "op": "open", "path": "latest", "trunc": True},
              {"ev": "fs_read", "t": 5.0, "op": "read", "path": "latest"}]
    view = recovery_view(events)
    assert view == [("read", "latest"), ("stat", "step-10"), ("list", "")]
    def file(data):
        return ("file", _content(data))

    base = {"latest": file(b"10"), "step-10": file(b"aaaa")}
    # same size at a stat'ed path, other content: the recovery cannot tell
    assert view_key(base, view) == view_key({**base, "step-10": file(b"bbbb")}, view)
    assert view_key(base, view) != view_key({**base, "step-10": file(b"bb")}, view)
    assert view_key(base, view) != view_key({**base, "latest": file(b"20")}, view)
    # the same bytes from other extents: the same key
    assert view_key(base, view) == view_key({**base, "latest": file(b"10")}, view)
    assert view_key(base, view) != view_key({**base, ".tmp": file(b"")}, view)  # listed
    assert view_key(base, view[:2]) == view_key({**base, ".tmp": file(b"")}, view[:2])


def test_the_lookup_before_a_truncating_create_is_no_view():
    """`open(tmp, "wb")` looks the name up first; whatever it found, it goes on the same
    way, unless it asked for O_EXCL (then an existing file fails it) or looked for
    itself first (`exists()`: a second lookup)."""
    lookup = {"ev": "fs_read", "t": 1.0, "op": "stat", "path": "s/r1.tmp", "pid": 7}
    other = {"ev": "fs_read", "t": 1.5, "op": "read", "path": "latest", "pid": 8}
    create = {"ev": "fs", "t": 2.0, "op": "create", "path": "s/r1.tmp", "pid": 7}
    after = {"ev": "fs_read", "t": 3.0, "op": "stat", "path": "s/r1.tmp", "pid": 7}
    assert recovery_view([lookup, other, create, after]) == [("read", "latest")]
    assert recovery_view([lookup, {**create, "excl": True}]) == [("stat", "s/r1.tmp")]
    assert recovery_view([lookup, {**create, "op": "open", "trunc": False}]) == [
        ("stat", "s/r1.tmp")]
    assert recovery_view([lookup, {**create, "pid": 8}]) == [("stat", "s/r1.tmp")]
    explicit = {**lookup, "t": 0.5}
    assert recovery_view([explicit, lookup, create]) == [("stat", "s/r1.tmp")]


def test_states_are_taken_at_the_ends_of_a_run_of_writes_and_a_seeded_few_between():
    ops, blobs = _record(("create", "f"), *(("write", "f", b"x", n) for n in range(10)),
                         ("fsync", "f"))
    found = plan_states(ops, 0, ["kill"], seed=3)
    assert found.total == 13
    cuts = [s.cut for s in found.specs]
    assert {0, 1, 2, 11, 12} <= set(cuts) and len(cuts) == 7


def test_images_keep_the_order_of_modification_times(tmp_path):
    """A resume that takes the newest checkpoint by mtime finds the one the crash left
    newest."""
    ops, blobs = _record(("create", "b"), ("write", "b", b"1"), ("create", "a"),
                         ("write", "a", b"2"))
    found = plan_states(ops, 0, ["kill"], seed=0)
    last = list(build_states(ops, Blobs.of_bytes(blobs), 0, found.specs))[-1]
    materialise(last.image, tmp_path / "i", last.order)
    a, b = (os.stat(tmp_path / "i" / name).st_mtime_ns for name in "ab")
    assert b < a < time.time_ns()


def test_one_rank_dies_and_the_others_run_on_to_their_next_collective():
    """Rank 1 writes its shard; rank 0 writes its shard, both enter a barrier, rank 0
    moves the pointer. Rank 1 dead after its create: rank 0 still writes its shard
    (before the barrier) but never the pointer (after it)."""
    ops, blobs = _record(("create", "s1"), ("create", "s0"), ("write", "s1", b"1"),
                         ("write", "s0", b"0"), ("create", "latest"),
                         ("write", "latest", b"s"))
    ranks = Ranks([1, 0, 1, 0, 0, 0], {0: [3.5], 1: [2.5]})
    assert ranks.run_on(ops, 1) == [1, 3]  # rank 1 entered nothing: rank 0 stops at 3.5
    assert ranks.run_on(ops, 3) == [3]  # dead after its write, before the barrier
    entered = Ranks(ranks.of_op, {0: [3.5], 1: [1.5]})
    assert entered.run_on(ops, 3) == [3, 4, 5]  # rank 1 in the barrier: rank 0 goes on
    assert ranks.run_on(ops, 2) == [2]  # rank 0 dead after its create: rank 1 writes
    ran_on = [s for s in _enumerate((ops, blobs), ["kill"], ranks=ranks)[1]
              if "ran on" in s.detail]
    first = next(s for s in ran_on if s.cut == 1)
    assert first.image == {"s1": ("file", b""), "s0": ("file", b"0")}
    assert "kill rank 1 after #1 create s1; the others ran on 2 operation(s)" == first.detail
    assert all("latest" not in s.image or s.cut >= 4 for s in ran_on)


def test_a_rank_that_runs_on_into_a_folder_the_dead_rank_made_stops_there():
    """Both ranks `makedirs(step_10/model, exist_ok=True)`; the recording shows rank 0's
    mkdir only (rank 1's met the folder). Rank 0 dead right after its first operation,
    before that mkdir: rank 1 runs on until its shard needs the folder, and stops (the
    sweep refused the whole save: 'no folder holds step_10/model/shard-1.pt.tmp')."""
    ops, blobs = _record(("create", "ready"), ("mkdir", "step_10"),
                         ("mkdir", "step_10/model"), ("create", "rank1-was-here"),
                         ("create", "step_10/model/shard-1.pt.tmp"),
                         ("write", "step_10/model/shard-1.pt.tmp", b"1"))
    for event, pid in zip(ops, [0, 0, 0, 1, 1, 1]):
        event["pid"] = pid
    ranks = Ranks([0, 0, 0, 1, 1, 1], {0: [], 1: []})
    states = _enumerate((ops, blobs), ["kill"], ranks=ranks)[1]
    first = next(s for s in states if s.cut == 1 and "ran on" in s.detail)
    assert first.image == {"ready": ("file", b""), "rank1-was-here": ("file", b"")}


def test_a_content_is_extents_of_the_blob_file_and_reads_as_the_bytes_written():
    blobs = Blobs.of_bytes(b"0123456789abcdef")
    grown = Content.empty(blobs).write(0, 0, 4).write(4, 4, 4)  # "01234567"
    assert grown.read() == b"01234567" and grown.pieces is grown.base.pieces  # shared list
    assert grown.write(2, 10, 3).read() == b"01abc567"  # over the middle
    assert grown.write(10, 12, 2).read() == b"01234567\0\0cd"  # past the end: a hole
    assert grown.truncate(3).read() == b"012" and grown.truncate(9).read() == b"01234567\0"
    torn = grown.write(8, 8, 2)  # a fork of the shared prefix: grown is unchanged
    assert grown.read() == b"01234567" and torn.read() == b"0123456789"
    for content in (grown, torn, grown.write(2, 10, 3), grown.truncate(3)):
        assert content.digest() == hashlib.sha256(content.read()).hexdigest()


def test_describe_and_rebuild_make_the_same_folder(tmp_path):
    ops, blobs = _joined()
    (tmp_path / "blobs").write_bytes(blobs)
    found = plan_states(ops, len(BEFORE[0]), ["kill"], seed=0)
    state = list(build_states(ops, Blobs(tmp_path / "blobs"), len(BEFORE[0]), found.specs))[2]
    rebuild(json.loads(json.dumps(describe(state, tmp_path / "blobs"))), tmp_path / "again")
    assert {p.name: p.read_bytes() for p in (tmp_path / "again").iterdir()} == {
        "latest": b"step 10", ".tmp": b"step 20"}


def test_each_file_keeps_its_own_first_and_last_write_whatever_came_between():
    """Two ranks' writes interleave one by one (as the FUSE daemon sees them): each
    file's run still yields its first, last and two seeded writes, not every write."""
    writes = [op for n in range(10) for op in (("write", "a", b"x", n), ("write", "b", b"y", n))]
    ops, blobs = _record(("create", "a"), ("create", "b"), *writes, ("fsync", "a"),
                         ("fsync", "b"))
    cuts = {s.cut for s in plan_states(ops, 0, ["kill"], seed=1).specs}
    assert {3, 4, 21, 22} <= cuts  # first and last write of a (cuts 3, 21) and of b
    assert len([c for c in cuts if 3 <= c <= 22]) == 8


def test_a_cap_covers_every_mode_and_the_first_tier_first():
    ops, blobs = _record(("create", ".tmp"), *(("write", ".tmp", b"ab", 2 * n) for n in range(6)),
                         ("rename", ".tmp", "ckpt"), ("fsyncdir", ""))
    specs = plan_states(ops, 0, ["kill", "torn", "lose_unsynced"], seed=0).specs
    chosen = sample_specs(specs, 9, seed=0)
    assert [s.mode for s in chosen].count("kill") == 3
    assert {s.mode for s in chosen} == {"kill", "torn", "lose_unsynced"}
    assert all(s.tier == 0 for s in chosen)
    assert chosen == [s for s in specs if s in chosen]  # in their order
    assert coverage(chosen, specs).startswith("kill 3/")


def test_a_200_mb_save_enumerates_without_a_copy_of_its_bytes(tmp_path):
    """Two ranks write a 100 MB file each, interleaved 1 MiB at a time, then publish:
    every state is planned, built and hashed, yet memory stays far below one file."""
    mib = 1 << 20
    blob = tmp_path / "blobs"
    with open(blob, "wb") as out:  # the blob file of such a recording: sparse, 200 MB
        out.truncate(200 * mib)
    ops = [{"ev": "fs", "t": 0.0, "op": "create", "path": f"r{r}.tmp"} for r in (0, 1)]
    for n in range(100):
        for r in (0, 1):
            ops.append({"ev": "fs", "t": len(ops) * 1.0, "op": "write", "path": f"r{r}.tmp",
                        "offset": n * mib, "size": mib, "blob": [(2 * n + r) * mib, mib]})
    for r in (0, 1):
        ops += [{"ev": "fs", "t": len(ops) * 1.0, "op": "fsync", "path": f"r{r}.tmp"},
                {"ev": "fs", "t": len(ops) + 0.5, "op": "rename", "path": f"r{r}.tmp",
                 "to": f"r{r}.pt"}]
    tracemalloc.start()
    found = plan_states(ops, 0, ["kill", "torn", "lose_unsynced"], seed=0)
    states = built = 0
    distinct = set()
    for state in build_states(ops, Blobs(blob), 0, found.specs):
        states += 1
        built += sum(1 for e in state.image.values() if e[0] == "file")
        assert all(isinstance(e[1], Content) for e in state.image.values() if e[0] == "file")
        distinct.add(state.digest)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert states == len(found.specs) > 100 and found.total > 2000
    assert len(distinct) > 20 and built > states  # zeros: equal bytes, one image
    assert peak < 32 * mib, f"{peak / mib:.0f} MiB at the peak"


def test_the_word_for_a_delete_counts_though_another_rank_acted_before_it(tmp_path):
    """A rank says what it did once its call returned; on a busy machine the other
    rank's next operation can come between. The crash after rank 1's unlink must still
    carry rank 1's word for it (so a fall-back past the file reads as the job's delete),
    and never rank 0's word for an operation after the cut."""
    from torchchaos.explore.crash.record import Places, Record
    from torchchaos.explore.crash.states import StateSpec
    from torchchaos.explore.crash.sweep import _echo
    from torchchaos.rundir.history import History

    boots = [{"ev": "boot", "t": 0.0, "rank": r, "pid": 100 + r, "launch": 0, "attempt": 0}
             for r in (0, 1)]
    ops = [{"ev": "fs", "t": 1.0, "op": "unlink", "path": "rank1/step_10.pt", "pid": 101},
           {"ev": "fs", "t": 1.1, "op": "unlink", "path": "rank0/step_10.pt", "pid": 100},
           {"ev": "fs", "t": 1.4, "op": "fsyncdir", "path": "rank1", "pid": 101}]
    words = [{"ev": "file", "t": 1.2, "op": "remove", "path": "out/rank1/step_10.pt",
              "pid": 101, "rank": 1, "save": 3, "index": 0},
             {"ev": "file", "t": 1.15, "op": "remove", "path": "out/rank0/step_10.pt",
              "pid": 100, "rank": 0, "save": 3, "index": 0}]
    record = Record(tmp_path, History(boots + ops + words), ops, None, 0, 2.0)
    crash = Places(record, 3, "out").crash(StateSpec("kill", 1, "kill after #1"))
    assert (crash.rank, crash.writer, crash.t_next) == (1, 101, 1.4)
    echoed = [w["path"] for w in words if _echo(w, crash, "out")]
    assert echoed == ["out/rank1/step_10.pt"]
