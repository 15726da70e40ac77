"""The incident's fault as the harness injects it: each corpus case maps onto a fault
spec the harness accepts, of the kind that makes what the artefacts showed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchchaos.incident import mapping
from torchchaos.incident.attribute import Finding, Incident, attribute
from torchchaos.incident.gather import gather
from torchchaos.incident.mapping import Placement
from torchchaos.scenario.spec import pairs, parse_fault_spec

DATA = Path(__file__).resolve().parents[1] / "data" / "incidents"
CASES = sorted(p.parent for p in DATA.glob("**/expected.json"))


def faults_for(*args, **kwargs) -> list[tuple[str, str]]:
    """The mapping's faults as the scenario file writes them."""
    return [(str(spec), note) for spec, note in mapping.faults_for(*args, **kwargs)]


# the fault kind that replays each kind the import finds
REPLAYED_BY = {"kill": "kill", "preempt": "kill", "crash": "crash", "oom": "oom",
               "exception": "raise", "dataloader": "dataloader", "abort": "abort",
               "hang": "hang", "node": "kill", "torn_write": "storage",
               "power_loss": "storage"}


def _incident(case: Path) -> Incident:
    gathered = gather([p for p in sorted(case.iterdir()) if p.name != "expected.json"])
    return attribute(gathered.observations, gathered.sources)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_case_maps_onto_faults_the_harness_takes(case):
    incident = _incident(case)
    specs = faults_for(incident, Placement(between=6), same_script=False)
    faults = [parse_fault_spec(spec) for spec, _note in specs]  # raises on a bad spec
    if specs[-1][1].startswith("then the restart's"):  # the restart's own fault, after
        assert faults[-1].kind == "raise" and faults[-1].trigger.phase == "checkpoint_load"
        faults = faults[:-1]
    told = incident.finding.kind
    if told == "node" and incident.finding.phase == "mid_save":
        assert faults[-1].kind == "storage"  # the node went down inside the save
    elif told in REPLAYED_BY:
        assert faults[-1].kind == REPLAYED_BY[told], specs
    assert all(note for _spec, note in specs)


def test_a_dead_loader_worker_replays_as_one_killed_and_an_aborted_group_as_an_abort():
    worker = faults_for(_incident(DATA / "harness" / "loader_worker_killed"), Placement(),
                        same_script=True)
    assert str(worker[0][0]).startswith("dataloader:rank=1,") and "mode=kill" in str(worker[0][0])
    aborted = faults_for(_incident(DATA / "harness" / "group_aborted"), Placement(),
                         same_script=True)
    assert str(aborted[0][0]).startswith("abort:rank=1,")


def test_a_rank_hung_in_its_data_loader_replays_as_a_stopped_worker():
    finding = Finding(kind="hang", rank=1, role="other", phase="between_saves",
                      how="waiting for a batch from its DataLoader worker",
                      step_window=(11, None))
    spec, _note = faults_for(Incident(finding, {}), Placement(), same_script=True)[0]
    assert str(spec) == "dataloader:rank=1,step=11,mode=stop"  # fires once step 11 is done
    plain = Finding(kind="hang", rank=1, role="other", phase="between_saves",
                    how="collective timeout", step_window=(11, None))
    assert str(faults_for(Incident(plain, {}), Placement(), same_script=True)[0][0]) \
        .startswith("hang:rank=1,step=11")


def test_the_expected_kinds_of_the_corpus_are_ones_the_import_knows():
    from torchchaos.incident.attribute import KINDS

    for case in CASES:
        assert json.loads((case / "expected.json").read_text())["kind"] in KINDS


def test_a_restart_whose_load_raised_on_sound_data_replays_that_exception_after_the_first():
    """An exception out of the resume's read that says nothing of bad data is a fault of
    its own, replayed at the load after the first failure; a file that does not load is
    the script's doing after the first failure (tests/data/incidents/load: a torn file),
    which the first failure's replay reproduces on the buggy script and a fixed one
    passes, so nothing is added for it."""
    raised = faults_for(_incident(DATA / "harness" / "exception_at_restart_load_plain_ddp"),
                        Placement(), same_script=True)
    assert len(raised) == 2 and str(raised[0][0]).startswith("kill:rank=1,step=")
    assert str(raised[1][0]) == "raise:rank=0,phase=checkpoint_load,event=1,type=RuntimeError"
    torn = faults_for(_incident(DATA / "load"), Placement(), same_script=True)
    assert not any("checkpoint_load" in str(spec) for spec, _ in torn), torn


def test_a_death_seen_through_a_peer_inside_the_save_replays_late_in_the_save():
    """A peer that waited inside a save of its own (DCP's broadcast, dcp_lm.py's async
    save) was there because the dying rank was deep in the save: replayed right after a
    rename. At the save's first write, that script's peer still trains and the replay's
    phase is unknown (1 of 1 replays before, 5 of 5 reproduced after)."""
    place = Placement(in_save=pairs(phase="checkpoint_save", save=2, event=3),
                      late_in_save=pairs(phase="checkpoint_save", save=2, event=8))
    peer_in_save = _incident(DATA / "harness" / "dcp_peer_inside_the_save")
    assert peer_in_save.finding.peers_in_save
    [(spec, _note)] = faults_for(peer_in_save, place, same_script=True)
    assert str(spec) == "kill:rank=0,phase=checkpoint_save,save=2,event=8"
    peer_at_barrier = _incident(DATA / "harness" / "silent_mid_save")  # after the save
    assert not peer_at_barrier.finding.peers_in_save


def test_a_hang_whose_peers_waited_in_a_named_call_holds_the_rank_in_that_call():
    """lightning/07: rank 1 stopped, rank 0 waited in Lightning's broadcast. Held in the
    backward's all-reduce (the default), the replay's peer waited there instead, and the
    incident's collective was not reproduced. On another script that call may never
    come, so there the default stays."""
    finding = Finding(kind="hang", rank=1, role="other", phase="between_saves",
                      how="stacks taken, job killed", collective="broadcast",
                      step_window=(None, None))
    same, _ = faults_for(Incident(finding, {}), Placement(between=12), same_script=True)[0]
    other, _ = faults_for(Incident(finding, {}), Placement(between=12), same_script=False)[0]
    assert "mode=collective,op=broadcast" in same
    assert "mode=collective" in other and "op=" not in other
    parse_fault_spec(same)  # the harness takes it


def test_a_node_loss_whose_relaunch_found_no_checkpoint_replays_as_a_power_loss(tmp_path):
    """A node's death leaves its checkpoint for the restart; a relaunch that says it found
    none lost it, as a power loss does (lightning/05: Lightning's own words). A relaunch
    that resumed replays as the node's death."""
    first = "step 5 loss 4.2\nstep 10 loss 4.1\n"
    (tmp_path / "launch-0-node-0.log").write_text(first)
    (tmp_path / "launch-1-node-0.log").write_text(
        '.fit(ckpt_path="last") is set, but there is no last checkpoint available.\n'
        "step 5 loss 4.2\nstep 10 loss 4.1\nstep 15 loss 4.0\n")
    incident = _incident(tmp_path)
    assert incident.finding.kind == "node" and incident.recovery.startswith(
        "restarted from scratch"), (incident.finding.rules, incident.recovery)
    (spec, note), = faults_for(incident, Placement(between=6), same_script=False)
    assert parse_fault_spec(spec).params["mode"] == "lose_unsynced", spec
    (tmp_path / "launch-1-node-0.log").write_text(
        "resumed from ckpt/step-5.pt at step 5\nstep 10 loss 4.1\nstep 15 loss 4.0\n")
    (spec, note), = faults_for(_incident(tmp_path), Placement(between=6), same_script=False)
    assert spec.startswith("kill:node="), spec


def test_on_the_same_script_a_death_mid_save_replays_in_the_save_the_logs_place_it_in():
    """ignite/05: rank 0 died early in the 3rd save, after Ignite had removed the oldest
    checkpoint; every restart then failed removing it again. Replayed in the battery's
    2nd save, the restart resumed and nothing failed; in the 3rd, it failed again."""
    finding = Finding(kind="kill", rank=0, role="writer", phase="mid_save", phase_seen=True,
                      how="SIGKILL", step_window=(15, 16), save=3)
    incident = Incident(finding, {})
    (spec, _note), = faults_for(incident, Placement(between=6), same_script=True)
    assert spec == "kill:rank=0,phase=checkpoint_save,save=3,event=1"
    (spec, _note), = faults_for(incident, Placement(between=6), same_script=False)
    assert spec == "kill:rank=0,phase=checkpoint_save,save=2,event=1"


def test_on_another_script_the_step_keeps_its_place_between_saves():
    """Issue 61: an incident at step 17 of a job that saved every 10 steps, replayed on a
    script that saves every 4 from step 4: 7 of 10 steps past a save is step 4 + 3 there,
    said, not the reference's own choice; a step the intervals cannot map stays the
    reference's."""
    finding = Finding(kind="kill", rank=1, role="other", phase="between_saves",
                      how="SIGKILL", step_window=(17, None))
    incident = Incident(finding, {}, save_interval=10)
    place = Placement(between=6, source="the replay script's fault-free reference run",
                      first_save=4, interval=4)
    spec, note = faults_for(incident, place, same_script=False)[0]
    assert spec == "kill:rank=1,step=7", spec
    assert "the incident's step 17 is 7 of the 10 steps between its saves: step 7" in note
    unknown = Incident(finding, {})  # no save interval the artefacts tell
    assert faults_for(unknown, place, same_script=False)[0][0] == "kill:rank=1,step=6"
