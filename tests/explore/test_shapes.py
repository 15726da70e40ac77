"""Which saves a crash-state sweep covers by default (torchchaos.explore.crash.shapes):
one of each shape, read from the reference's file events."""

from __future__ import annotations

from histories import Timeline

from torchchaos.explore.crash import shapes


def _keep_two(steps: int = 17, prune_first: bool = False) -> Timeline:
    """A job saving out/step_N.pt every 5 steps through a temporary file, keeping its two
    newest: its 3rd save is the first that deletes."""
    timeline = Timeline()
    timeline.train(1, range(1, steps + 1), save_every=0)
    for save, step in enumerate(range(5, steps + 1, 5), 1):
        where = {**timeline.proc(0), "save": save}
        timeline.add("save_begin", after_step=step, **where)
        if prune_first and save >= 3:
            timeline.add("file", op="remove", path=f"out/step_{step - 10}.pt", **where)
        for op, path in (("open", f"out/.step_{step}.tmp"), ("write", f"out/.step_{step}.tmp"),
                         ("rename", f"out/step_{step}.pt")):
            timeline.add("file", op=op, path=path, **where)
        timeline.add("file", op="open", path="out/latest", **where)
        if not prune_first and save >= 3:
            timeline.add("file", op="remove", path=f"out/step_{step - 10}.pt", **where)
    return timeline


def test_the_first_save_of_each_shape_is_chosen_and_said_why() -> None:
    chosen, notes = shapes.choose(_keep_two().history())
    assert [(c.save, c.why) for c in chosen] == [
        (2, "the first that creates (out/step_10.pt) and replaces (out/latest)"),
        (3, "the first that deletes (out/step_5.pt)")]
    assert notes == []


def test_a_temporary_file_made_and_removed_in_one_save_is_no_deletion() -> None:
    timeline = _keep_two(steps=11)
    where = {**timeline.proc(0), "save": 2}
    timeline.add("file", op="open", path="out/scratch.tmp", **where)
    timeline.add("file", op="remove", path="out/scratch.tmp", **where)
    assert "deletes" not in shapes.shapes(timeline.history())[2]


def test_a_folder_removed_with_an_earlier_saves_files_in_it_is_a_deletion() -> None:
    timeline = _keep_two(steps=11)
    where = {**timeline.proc(0), "save": 2}
    timeline.add("file", op="remove", path="out", **where)  # shutil.rmtree's last call
    assert shapes.shapes(timeline.history())[2]["deletes"] == "out"


def test_a_shape_only_the_last_save_shows_is_said_not_chosen() -> None:
    """Saves at steps 5, 10 and 15 of 15: the deleting save ends the job, and a
    recording runs to the step after its save."""
    chosen, notes = shapes.choose(_keep_two(steps=15).history())
    assert [c.save for c in chosen] == [2]
    assert notes == ["save 3 is the first that deletes, but it is the job's last: no step"
                     " follows it to recover into; give the job more steps to crash in it"]
