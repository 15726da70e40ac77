"""The fault models a detector campaign draws its trials from, and the trial plan.

Field models first (`torchchaos.faults.miscompute`: a matrix product computes wrong),
the classic one last:

- `element`, `warp`, `burst`: one wrong product in the step (one element; a warp's
  block of 32; 4 adjacent bits of one element), then the unit computes right again:
  a transient fault;
- `nan`: one product's element becomes NaN (about 1 % of field outcomes);
- `persistent`: from the step on, 2 % of the rank's products come out wrong, the same
  wrong result for the same operands (a defective unit; a rerun on the same device
  reproduces it);
- `param_flip`: one bit of one stored weight flips after the step (what `bitflip`
  does; the rare case in the field).

Each trial draws, from the campaign's seed, the model's bit class (where it has one),
the rank it hits and the step it starts at; every rank draws the same plan.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

BIT_CLASSES = ("sign", "exp_high", "exp_low", "mant_high", "mant_low")


@dataclass(frozen=True)
class Model:
    name: str
    compute: bool  # a wrong product (miscompute), else a flipped stored weight
    params: tuple[tuple[str, object], ...] = ()
    lasting: bool = False  # wrong from its step to the trial's end
    bit_classes: tuple[str, ...] = BIT_CLASSES  # () for a value (NaN)


MODELS = {m.name: m for m in (
    Model("element", True, (("pattern", "element"), ("times", 1))),
    Model("warp", True, (("pattern", "warp"), ("times", 1))),
    Model("burst", True, (("pattern", "burst"), ("bits", 4), ("times", 1))),
    Model("nan", True, (("value", "nan"), ("times", 1)), bit_classes=()),
    Model("persistent", True, (("pattern", "element"), ("rate", 2.0)), lasting=True),
    Model("param_flip", False),
)}
CLEAN = "clean"  # a trial with no fault: the false alarms


@dataclass(frozen=True)
class Trial:
    index: int
    model: str  # a MODELS name, or CLEAN
    rank: int
    step: int  # the step it strikes in (1-based within the trial)
    bit_class: str  # "" for a value or a clean trial
    seed: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def plan(models: list[str], trials: int, clean: int, steps: int, world: int,
         seed: int) -> list[Trial]:
    """`trials` trials of each model and `clean` fault-free ones, interleaved so that
    an interrupted campaign still has some of each. The fault strikes in the first
    half of the trial, so every detector has steps left to see it."""
    rng = random.Random(seed)
    wanted = [name for _ in range(trials) for name in models] + [CLEAN] * clean
    rng.shuffle(wanted)
    last_start = max(1, steps // 2)
    found = []
    for index, name in enumerate(wanted):
        classes = MODELS[name].bit_classes if name != CLEAN else ()
        found.append(Trial(index, name, rng.randrange(world), rng.randint(1, last_start),
                           rng.choice(classes) if classes else "", rng.randrange(2**31)))
    return found
