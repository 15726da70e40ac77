"""Rules told on small logs written as the scripts print them (the corpus has real runs)."""

from __future__ import annotations

from torchchaos.incident.attribute import attribute
from torchchaos.incident.gather import gather


def _import(tmp_path, first: str, second: str):
    (tmp_path / "launch-0-node-0.log").write_text(first)
    (tmp_path / "launch-1-node-0.log").write_text(second)
    gathered = gather([tmp_path])
    return attribute(gathered.observations, gathered.sources).finding


def test_a_finished_save_the_restart_did_not_find_is_a_power_loss(tmp_path):
    first = "step 5 loss 4.2\nsaved checkpoint ckpt/step-5.pt\nstep 10 loss 4.1\n" \
        "saved checkpoint ckpt/step-10.pt\nstep 11 loss 4.0\n"
    found = _import(tmp_path, first, "resumed from ckpt/step-5.pt at step 5\nstep 20 loss 3\n")
    assert (found.kind, found.phase) == ("power_loss", "between_saves"), found.rules
    assert any("checkpoint of step 10 was saved" in r and "resumed from step 5" in r
               for r in found.rules), found.rules


def test_a_node_lost_after_its_last_save_is_a_node_loss(tmp_path):
    first = "step 5 loss 4.2\nsaved checkpoint ckpt/step-5.pt\nstep 10 loss 4.1\n" \
        "saved checkpoint ckpt/step-10.pt\nstep 11 loss 4.0\n"
    found = _import(tmp_path, first, "resumed from ckpt/step-10.pt at step 10\nstep 20 loss 3\n")
    assert found.kind == "node" and "power_loss" in found.alternatives, found.rules


def test_a_save_begun_is_not_a_save_done(tmp_path):
    first = "step 5 loss 4.2\nsaved checkpoint ckpt/step-5.pt\nstep 10 loss 4.1\n" \
        "saving checkpoint to ckpt/step-10.pt\n"
    found = _import(tmp_path, first, "resumed from ckpt/step-5.pt at step 5\nstep 20 loss 3\n")
    assert found.kind == "node", found.rules
