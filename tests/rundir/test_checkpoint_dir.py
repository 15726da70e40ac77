"""Storage faults go where the job writes: the folder a save writes in, and its use.

`History.checkpoint_dir` infers the folder of the run directory a save writes
in, from its file events; the battery's power loss and the crash points'
storage modes mount the fault filesystem there (`dir=`), and leave it out, or
refuse, where a save writes in several top-level folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import TARGET
from histories import Timeline

from torchchaos.errors import UsageError
from torchchaos.explore import battery
from torchchaos.explore.crash import points as crashpoints
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import parse_fault_spec


def saves(*paths_by_save: list[Any], rank: int = 0, launch: int = 0) -> History:
    """A reference of 20 steps on 2 ranks (a save every 5) whose k-th save's file events
    are the k-th list: each item a path written, or (op, path)."""
    timeline = Timeline()
    timeline.train(2, range(1, 21), save_every=0)
    for number, paths in enumerate(paths_by_save, start=1):
        timeline.add("save_begin", save=number, after_step=5 * number,
                     **timeline.proc(rank, launch))
        for index, item in enumerate(paths, start=1):
            op, path = item if isinstance(item, tuple) else ("write", item)
            timeline.add("file", op=op, path=path, save=number, index=index,
                         **timeline.proc(rank, launch))
    return timeline.history()


ATOMIC = [("open", "out/ckpt/.tmp-1"), ("write", "out/ckpt/.tmp-1"),
          ("fsync", "out/ckpt/.tmp-1"), ("rename", "out/ckpt/step-10.pt"),
          ("fsync", "out/ckpt")]


@pytest.mark.parametrize("paths, folder", [
    (ATOMIC, "out"),
    # makedirs("out", exist_ok=True) before each save; the folder fsynced after a rename
    ([("mkdir", "out"), ("open", "out/ckpt.pt"), ("write", "out/ckpt.pt"),
      ("rename", "out/latest.pt"), ("fsync", "out")], "out"),
    ([("open", "ckpt.tmp"), ("write", "ckpt.tmp"), ("rename", "ckpt.pt"), ("fsync", "ckpt.pt")],
     "."),
    # a folder published by a rename in the run directory itself: a new entry there
    ([("mkdir", "tmp-10"), ("write", "tmp-10/model.pt"), ("rename", "checkpoint-10")], None),
    ([("open", "ckpt.pt"), ("write", "ckpt.pt"), ("rename", "latest.pt")], "."),
    ([("open", "ckpt/model.pt"), ("write", "ckpt/model.pt"), ("write", "ckpt/step")],
     "ckpt"),
    (["out/model.pt", "logs/metrics.json"], None),  # several top-level folders
    (["ckpt.pt", "out/model.pt"], None),  # the run directory itself and a folder in it
    (["/data/ckpt/step-10.pt"], None),  # outside the run directory
    (["../elsewhere/step-10.pt"], None),
    ([], None),  # a save with no file events
], ids=["atomic", "makedirs", "fsync in the run dir", "folder renamed in the run dir",
        "rename in the run dir", "ckpt", "two folders", "dir and folder", "absolute",
        "parent", "none"])
def test_the_folder_a_save_writes_in(paths, folder):
    assert saves(["first/save.pt"], paths).checkpoint_dir(2) == folder


def test_only_that_save_of_the_first_launch_counts_on_every_rank():
    history = saves(["a/1.pt"], ["b/2.pt"])
    assert (history.checkpoint_dir(1), history.checkpoint_dir(2)) == ("a", "b")
    assert history.checkpoint_dir(3) is None
    relaunched = saves(["b/1.pt"], ["b/2.pt"], launch=1).events
    assert History([*history.events, *relaunched]).checkpoint_dir(2) == "b"
    other_rank = saves(["c/1.pt"], ["c/shard-1.pt"], rank=1).events
    assert History([*history.events, *other_rank]).checkpoint_dir(2) is None


class _Reference:
    def __init__(self, history: History) -> None:
        self._history = history

    def history(self) -> History:
        return self._history


def _plan(monkeypatch: pytest.MonkeyPatch, history: History) -> tuple[list, list[str]]:
    """The battery planned over a made-up reference, with the fault filesystem usable."""
    monkeypatch.setattr(battery, "get_reference", lambda *_: _Reference(history))
    monkeypatch.setattr("torchchaos.faults.faultfs.mount.unavailable_reason", lambda: "")
    lines: list[str] = []
    entries = battery.plan(Scenario(script=str(TARGET)), Path("unused"), lines.append)
    return entries, lines


def test_the_battery_mounts_its_power_loss_where_the_saves_write(monkeypatch):
    entries, lines = _plan(monkeypatch, saves(ATOMIC, ATOMIC))
    storage = {e.name: str(e.fault) for e in entries if str(e.fault).startswith("storage:")}
    assert storage == {
        "tear rank 0's last write in its 2nd save":
            "storage:mode=torn,via=agent,rank=0,phase=checkpoint_save,save=2,event=2",
        "power loss on rank 0 after a rename in its 2nd save":
            "storage:mode=lose_unsynced,rank=0,phase=checkpoint_save,save=2,event=4,dir=out",
    }
    assert all(parse_fault_spec(fault) for fault in storage.values())
    assert lines == []


def test_the_battery_tears_the_file_its_2nd_save_wrote_last(monkeypatch):
    manifest = [("open", "ckpt/.tmp-m"), ("write", "ckpt/.tmp-m"),
                ("rename", "ckpt/manifest.json")]
    ckpt = [(op, path.replace("out/ckpt", "ckpt")) for op, path in ATOMIC]
    entries, _ = _plan(monkeypatch, saves(ckpt, ckpt + manifest))
    by_name = {e.name: str(e.fault) for e in entries}
    assert by_name["tear rank 0's last write in its 2nd save"].endswith("save=2,event=7")
    # the default folder keeps the spec as it always read
    assert by_name["power loss on rank 0 after a rename in its 2nd save"].endswith("event=4")


def test_the_battery_leaves_the_power_loss_out_where_saves_write_in_two_folders(monkeypatch):
    two = [*ATOMIC, ("open", "logs/state.json"), ("write", "logs/state.json")]
    entries, lines = _plan(monkeypatch, saves(two, two))
    assert not any("lose_unsynced" in str(e.fault) for e in entries)
    assert any("torn,via=agent" in str(e.fault) for e in entries)  # needs no mount
    assert len(lines) == 1 and "no power loss" in lines[0], lines
    assert "writes in logs, out, not in one folder" in lines[0], lines


def test_crash_points_mount_the_fault_filesystem_where_the_save_writes(monkeypatch):
    history = saves(ATOMIC, ATOMIC)
    monkeypatch.setattr(crashpoints, "get_reference", lambda *_: _Reference(history))
    found = crashpoints.plan(Scenario(script=str(TARGET)), Path("unused"), lambda _: None,
                             save=2, modes=list(crashpoints.MODES), cap=None,
                             from_snapshot=False)
    specs = [str(p.spec(2)) for p in found.points]
    assert [s for s in specs if s.startswith("kill:")][0].endswith("event=1")
    storage = [s for s in specs if s.startswith("storage:")]
    assert storage and all(s.endswith(",dir=out") for s in storage), storage


def test_crash_points_refuse_storage_modes_for_a_save_in_two_folders(monkeypatch):
    two = [*ATOMIC, ("write", "logs/state.json")]
    history = saves(two, two)
    monkeypatch.setattr(crashpoints, "get_reference", lambda *_: _Reference(history))
    base = Scenario(script=str(TARGET))
    with pytest.raises(UsageError, match="several top-level folders") as refused:
        crashpoints.plan(base, Path("unused"), lambda _: None, save=2,
                         modes=["kill", "lose_unsynced"], cap=None, from_snapshot=False)
    assert "\n" not in str(refused.value)
    kills = crashpoints.plan(base, Path("unused"), lambda _: None, save=2, modes=["kill"],
                             cap=None, from_snapshot=False)
    assert len(kills.points) == len(two)  # kills need no mount
