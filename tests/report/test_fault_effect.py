"""A fault counts as fired only once it took effect (issue 62, part 5).

A harness fault (a partition, a toxic) is asked for by the rank that reaches its
trigger, then put in force by the harness's nemesis, which records `nemesis_begin`
only when that worked. Before this, the rank's request was taken as the firing: a
toxic the Toxiproxy server refused (409) was reported "fired at step 6" and the run
passed. Here the history is written as the harness writes it (HistoryWriter), by the
same events a refused toxic and a partition whose rules could not be added leave."""

from __future__ import annotations

from torchchaos.faults.contract import ResolvedFault, Trigger
from torchchaos.report.verdict import _never_fired, fault_summary
from torchchaos.rundir.history import History, HistoryWriter


def _fault(kind: str, **params: object) -> ResolvedFault:
    return ResolvedFault(f"f0-{kind}", kind, "node", 1, Trigger(step=6), dict(params),
                         f"{kind}:node=1,step=6", 0)


def _history(tmp_path, *events: tuple[str, dict]) -> History:
    writer = HistoryWriter(tmp_path / "history" / "harness.jsonl")
    for ev, fields in events:
        writer.record(ev, **fields)
    writer.close()
    return History.load(tmp_path / "history")


def test_a_refused_toxic_is_not_fired_and_the_run_could_not_judge(tmp_path):
    toxic = _fault("toxic", type="latency", latency=500)
    history = _history(tmp_path,
                       ("fault", {"id": toxic.id, "rank": 0, "step": 6}),
                       ("fault_error", {"id": toxic.id, "error": "toxiproxy answered 409:"
                                        " toxic already exists"}))
    (summary,) = fault_summary([toxic], history)
    assert summary["fired"] is False and "409" in summary["error"]
    assert _never_fired([summary]).startswith("fault(s) could not act: toxic:node=1,step=6:"
                                              " toxiproxy answered 409")


def test_a_partition_whose_rules_could_not_be_added_is_not_fired(tmp_path):
    cut = _fault("partition", shape="isolate")
    history = _history(tmp_path,
                       ("fault", {"id": cut.id, "rank": 0, "step": 6}),
                       ("fault_error", {"id": cut.id, "error": "nft: Could not process rule"}))
    (summary,) = fault_summary([cut], history)
    assert summary["fired"] is False
    assert "could not act" in _never_fired([summary])


def test_a_harness_fault_put_in_force_is_fired_at_the_step_it_was_asked_for(tmp_path):
    cut = _fault("partition", shape="isolate")
    history = _history(tmp_path,
                       ("fault", {"id": cut.id, "rank": 0, "step": 6}),
                       ("nemesis_begin", {"id": cut.id, "kind": "partition", "window": 1}))
    (summary,) = fault_summary([cut], history)
    assert (summary["fired"], summary["fired_step"]) == (True, 6)
    assert _never_fired([summary]) == ""
