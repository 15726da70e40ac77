"""A framework's loop, told by its frames (as the readers write them, "func (path:line)")."""

from __future__ import annotations

from torchchaos.incident.frameworks import loop_of

STEP = ["main (lightning_lm.py:117)", "run (pytorch/loops/training_epoch_loop.py:153)",
        "advance (pytorch/loops/training_epoch_loop.py:352)"]


def test_a_lightning_rank_in_a_steps_collective_is_in_its_loop_and_not_saving():
    frames = STEP + ["backward (pytorch/core/module.py:1137)",
                     "_engine_run_backward (torch/autograd/graph.py:979)"]
    loop = loop_of(frames)
    assert loop is not None and loop.framework == "Lightning"
    assert not loop.in_save(frames)


def test_a_lightning_rank_inside_model_checkpoint_is_saving_before_any_save_frame():
    """ModelCheckpoint's callback runs inside the step's `advance`; a collective it makes
    before `save_checkpoint` (no frame named save there) is still inside the save."""
    frames = STEP + ["on_train_batch_end (pytorch/callbacks/model_checkpoint.py:330)",
                     "broadcast (torch/distributed/distributed_c10d.py:3151)"]
    assert loop_of(frames).in_save(frames)


def test_a_loop_that_does_not_fence_its_saves_has_no_entry():
    """The Hugging Face Trainer: a peer may run the next step while rank 0 still saves."""
    frames = ["train (transformers/trainer.py:1576)",
              "_inner_training_loop (transformers/trainer.py:1660)",
              "all_gather (torch/distributed/distributed_c10d.py:4287)"]
    assert loop_of(frames) is None
