"""Failure rules that stand on the checkpoint folder alone."""

from __future__ import annotations

from torchchaos.incident.finding import FirstFailure, say


def checkpoint_only(c: FirstFailure) -> bool:
    obs, f = c.obs, c.finding
    bad = [o for o in obs if o.what == "checkpoint" and o.extra.get("loads") is False]
    if not bad:
        return False
    f.kind, f.how = "torn_write", bad[0].detail
    say(f, f"torn_write: {bad[0].source} {bad[0].detail}; no death is in the artefacts",
         bad[0])
    return True
