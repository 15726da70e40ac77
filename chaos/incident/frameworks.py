"""Training loops that live in a framework, not in the script: which frames are a step.

A script's own loop is read in its own lines (`script_source`): where it saves, and
whether a collective fences the save. A framework's loop is in the library, so its
tracebacks quote the library's lines, not the script's. What a peer's frames say there
is written here, one entry per framework, from the framework's own source (the version
is named). Only a loop that fences every save with a collective gets an entry: there, a
peer that waited in a step's collective when a rank died tells that no save was under
way, since no rank starts a step while another still saves.

The Hugging Face Trainer has no entry: its `_save_checkpoint` (transformers 5.24) calls
no barrier unless it tracks a best model, so a peer may run the next step while rank 0
still writes, and its frames then say nothing of rank 0's phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchchaos.incident.observations import function_of, path_of


@dataclass(frozen=True)
class Loop:
    framework: str
    step: tuple[str, str]       # (function, path ending) of a frame inside a training step
    saving: tuple[str, ...]     # path endings of frames inside a save
    fence: str                  # where every save ends in a collective, as the source has it

    def holds(self, frames: tuple[str, ...] | list[str]) -> bool:
        return any(_is(frame, *self.step) for frame in frames)

    def in_save(self, frames: tuple[str, ...] | list[str]) -> bool:
        return any(path_of(frame).endswith(self.saving) for frame in frames)


LOOPS = (
    Loop("Lightning", ("advance", "loops/training_epoch_loop.py"),
         ("callbacks/model_checkpoint.py",),
         "`Trainer.save_checkpoint` ends in `strategy.barrier(\"Trainer.save_checkpoint\")`"
         " (lightning/pytorch/trainer/trainer.py, Lightning 2.6)"),
)


def loop_of(frames: tuple[str, ...] | list[str]) -> Loop | None:
    """The framework loop a rank's frames run in, or None."""
    return next((loop for loop in LOOPS if loop.holds(frames)), None)


def _is(frame: str, function: str, path_end: str) -> bool:
    return function_of(frame) == function and path_of(frame).endswith(path_end)
