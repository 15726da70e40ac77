"""How file events are grouped into checkpoint saves, also from background threads."""

import threading

from torchchaos.rank.saves import SaveTracker

MAIN = None


def writer() -> threading.Thread:
    return threading.Thread(target=lambda: None)


def test_synchronous_saves_end_at_the_next_step():
    saves = SaveTracker()
    first, _ = saves.event(MAIN, 5)
    second, _ = saves.event(MAIN, 5)
    assert first is second and second.events == 2 and first.after_step == 5
    assert saves.step_begins() is first
    third, _ = saves.event(MAIN, 10)
    assert third.number == 2 and third.events == 1


def test_the_rank_goes_on_from_a_save_once_per_new_event_and_not_from_a_writers():
    saves, thread = SaveTracker(), writer()
    assert saves.left() is None, "no save open"
    save, _ = saves.event(MAIN, 12)
    assert saves.left() is save and save.left_at == 1
    assert saves.left() is None, "a second barrier: nothing new to go on from"
    saves.event(MAIN, 12)
    assert saves.left() is save and save.left_at == 2
    saves.step_begins()
    saves.event(thread, 13, started_at=13)
    assert saves.left() is None, "the main thread's barrier says nothing of a writer at work"
    committed, _ = saves.event(MAIN, 14)
    assert saves.left() is committed, "once the main thread committed it, it can go on"


def test_a_background_save_spans_steps_and_its_commit_joins_it():
    saves, thread = SaveTracker(), writer()
    data, _ = saves.event(thread, 6, started_at=5)  # written while step 6 ran
    assert data.after_step == 5, "the state of the step the writer was started in"
    assert saves.step_begins() is None, "still writing: the save stays open"
    saves.event(thread, 7, started_at=5)
    commit, _ = saves.event(MAIN, 7)  # the training thread publishes the pointer
    assert commit is data and data.events == 3 and data.committed and data.last_step == 7
    assert saves.step_begins() is data
    assert saves.open is None


def test_a_background_save_without_commit_ends_when_the_next_one_opens():
    saves, first_writer, second_writer = SaveTracker(), writer(), writer()
    first, _ = saves.event(first_writer, 5, started_at=5)
    assert saves.step_begins() is None
    second, closed = saves.event(second_writer, 10, started_at=10)
    assert closed is first and second.number == 2 and second.after_step == 10
    assert saves.finish() is second


def test_a_long_lived_writer_thread_saves_the_state_of_its_first_event():
    saves, thread = SaveTracker(), writer()
    first, _ = saves.event(thread, 5, started_at=0)  # started before training
    assert first.after_step == 5
    saves.event(MAIN, 5)
    saves.step_begins()
    later, _ = saves.event(thread, 10, started_at=0)
    assert later.number == 2 and later.after_step == 10


def test_a_long_lived_writer_begins_a_save_where_its_path_names_the_next_step():
    """verl/Megatron-style: one writer thread per rank, global_step_N/ per save and no
    training-thread I/O in between (rank 1): each folder is a save of its own."""
    saves, thread = SaveTracker(), writer()
    numbers = []
    for step in (4, 8, 12):
        for op, name in (("mkdir", ""), ("open", "/model_rank_1.pt.tmp"),
                         ("rename", "/model_rank_1.pt"), ("fsync", "")):
            save, _ = saves.event(thread, step, 0, op, f"ckpts/global_step_{step}{name}")
            numbers.append((save.number, save.after_step))
        assert saves.step_begins() is None, "a writer's save stays open across steps"
    assert numbers == [(1, 4)] * 4 + [(2, 8)] * 4 + [(3, 12)] * 4


def test_a_late_writer_holds_the_step_its_path_names_not_the_step_it_woke_in():
    saves, thread = SaveTracker(), writer()
    first, _ = saves.event(thread, 5, 0, "open", "out/global_step_4/shard.pt.tmp")
    assert first.after_step == 4
    again, _ = saves.event(thread, 5, 0, "open", "out/global_step_4/shard_2.pt.tmp")
    assert again is first, "another file of the same step's folder"
    later, closed = saves.event(thread, 9, 0, "open", "out/global_step_8/shard.pt.tmp")
    assert closed is first and later.number == 2 and later.after_step == 8


def test_a_rank_folders_number_is_no_step():
    saves, thread = SaveTracker(), writer()
    first, _ = saves.event(thread, 5, 0, "open", "out/rank1/ckpt.pt.tmp")
    assert first.after_step == 5


def test_a_long_lived_writer_with_fixed_names_begins_a_save_when_it_opens_a_file_again():
    saves, thread = SaveTracker(), writer()
    first, _ = saves.event(thread, 5, 0, "open", "ckpt/state.pt.tmp")
    saves.event(thread, 5, 0, "rename", "ckpt/state.pt")
    assert saves.step_begins() is None
    second, closed = saves.event(thread, 10, 0, "open", "ckpt/state.pt.tmp")
    assert closed is first and second.number == 2 and second.after_step == 10


def test_a_save_writing_its_shards_across_steps_stays_one_save():
    saves, thread = SaveTracker(), writer()
    for shard, step in ((1, 4), (2, 5), (3, 6), (4, 6)):
        save, _ = saves.event(thread, step, 0, "open", f"ckpt/step_4/shard_{shard}_of_4.pt")
        assert save.number == 1 and save.after_step == 4
