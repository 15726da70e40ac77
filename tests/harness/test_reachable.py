"""A fault the job never reaches is refused from its reference run's history."""

from __future__ import annotations

from torchchaos.harness.reachable import unreachable
from torchchaos.rundir.history import History
from torchchaos.scenario import schedule
from torchchaos.scenario.spec import parse_fault_spec


def _history() -> History:
    """Two ranks, 10 steps; rank 0 writes 2 saves of 3 file events each."""
    events = [{"ev": "step", "rank": r, "step": s, "t": s} for r in (0, 1) for s in range(1, 11)]
    events += [{"ev": "file", "rank": 0, "save": k, "index": i, "op": "write", "t": 20}
               for k in (1, 2) for i in (1, 2, 3)]
    events += [{"ev": "file", "rank": 0, "save": 0, "index": 0, "op": "mkdir", "t": 0}]
    return History(events)


def _why(spec: str) -> str | None:
    faults = schedule.resolve([parse_fault_spec(spec)], 0, 2, 1)
    return unreachable(faults, _history(), nproc=2)


def test_what_the_job_reaches_is_let_through():
    for spec in ("kill:rank=1,step=10", "kill:rank=0,phase=checkpoint_save,save=2,event=3",
                 "kill:node=0,step=4", "kill:rank=1,time=99", "kill:rank=0,p=0.1",
                 "kill:rank=1,phase=checkpoint_load,save=5"):
        assert _why(spec) is None, spec


def test_past_the_last_step_the_last_save_or_a_save_s_last_event_is_refused():
    assert "step=11 is past rank 1's last step, 10" in _why("kill:rank=1,step=11")
    assert "rank 0 makes 2 checkpoint save(s)" in \
        _why("kill:rank=0,phase=checkpoint_save,save=3")
    assert "rank 0's save 2 makes 3 file event(s)" in \
        _why("kill:rank=0,phase=checkpoint_save,save=2,event=4")
    assert "rank 1 writes no checkpoint" in _why("kill:rank=1,phase=checkpoint_save,save=1")
