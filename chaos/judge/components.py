"""The components of a step's fingerprints, in the order a step consumes them.

Shared by the checkers and the corruption analysis: two steps are the same
state when every training component matches, and the first component that
differs says what went wrong (what a resume did not restore, or where a
corruption entered).
"""

from __future__ import annotations

# The order in which a step consumes state: the first component that differs
# at the divergent step is the one that was not restored. RNG states (one
# "rng.<generator>" key each) only name a culprit; a step diverges when the
# training state does, since a generator the target never seeds nor uses
# differs between any two runs without doing harm.
STATE = (
    ("params_start", "weights"),
    ("optim_start", "optimizer"),
    ("lr", "lr_schedule"),
    ("batch", "data"),
    ("grads", "gradients"),
    ("optim", "optimizer"),
    ("params", "weights"),
)
STATE_KEYS = tuple(key for key, _ in STATE)
# Compared, but never the culprit: the loss is what the weights, batch and RNG made.
COMPARED_KEYS = (*STATE_KEYS, "loss")


def same_state(a: dict[str, str], b: dict[str, str]) -> bool:
    """Equal in every component both took (a light step: loss, lr, batch, and the
    parameters on some steps)."""
    shared = [key for key in COMPARED_KEYS if key in a and key in b]
    return bool(shared) and all(a[key] == b[key] for key in shared)


def is_light(fp: dict[str, str]) -> bool:
    """A step fingerprinted lightly: without the components that name a culprit."""
    return "grads" not in fp


def diverging_component(mine: dict[str, str], ref: dict[str, str],
                         noisy: frozenset[str] = frozenset()) -> str:
    def differs(key: str) -> bool:
        return key in mine and key in ref and mine[key] != ref[key]

    rngs = [k[4:] for k in sorted(mine) if k.startswith("rng.") and k not in noisy
            and differs(k)]
    light = is_light(mine) or is_light(ref)
    for key, name in STATE:
        if key == "batch" and rngs:  # generators are drawn from after lr, before the batch
            return f"rng ({', '.join(rngs)})"
        if differs(key) and not (light and key == "params"):
            return name
    return "unknown"  # on a light step: the weights differ, what made them is not known


CAUSES = ("weights", "optimizer", "lr_schedule", "rng", "data", "gradients")


def cause_rank(component: str) -> int:
    """Components ordered from cause to consequence (unknown last)."""
    return next((i for i, c in enumerate(CAUSES) if component.startswith(c)), len(CAUSES))
