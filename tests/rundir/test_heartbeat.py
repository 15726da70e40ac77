"""A rank's heartbeat file, written by its beat thread and by its main thread at once."""

from __future__ import annotations

import threading

from torchchaos.rundir.heartbeat import Heartbeat, read_beats


def test_two_threads_writing_beats_at_once_never_lose_the_file(tmp_path):
    """The beat thread and the main thread's teardown beat share the temporary name: two
    writes at once renamed it twice, and a rank that had finished training died of
    FileNotFoundError (seen in an incident replay, 2026-11-27)."""
    beat = Heartbeat(tmp_path / "beats" / "rank-1.json", rank=1, launch=0, attempt=0)
    errors: list[BaseException] = []

    def hammer(doing: str) -> None:
        try:
            for step in range(400):
                beat.progress(doing, step)
                beat.write()
        except BaseException as exc:  # noqa: BLE001 - what the test looks for
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(f"thread {n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    [last] = read_beats(tmp_path / "beats")
    assert (last.rank, last.step) == (1, 399)
    assert [p.name for p in (tmp_path / "beats").iterdir()] == ["rank-1.json"]
