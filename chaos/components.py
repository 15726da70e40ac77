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


def same_state(a: dict[str, str], b: dict[str, str]) -> bool:
    return all(a.get(key) == b.get(key) for key in STATE_KEYS)


def diverging_component(mine: dict[str, str], ref: dict[str, str],
                         noisy: frozenset[str] = frozenset()) -> str:
    def differs(key: str) -> bool:
        return key in mine and key in ref and mine[key] != ref[key]

    rngs = [k[4:] for k in sorted(mine) if k.startswith("rng.") and k not in noisy
            and differs(k)]
    for key, name in STATE:
        if key == "batch" and rngs:  # generators are drawn from after lr, before the batch
            return f"rng ({', '.join(rngs)})"
        if differs(key):
            return name
    return "unknown"


CAUSES = ("weights", "optimizer", "lr_schedule", "rng", "data", "gradients")


def cause_rank(component: str) -> int:
    """Components ordered from cause to consequence (unknown last)."""
    return next((i for i, c in enumerate(CAUSES) if component.startswith(c)), len(CAUSES))
