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
