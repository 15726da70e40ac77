"""The tiny opt-in API for training scripts: tell the harness what they noticed.

Nothing here is required: the harness judges a black-box target from what it
observes. A target that reports its own detections gets sharper verdicts
(`sdc_detected` names the step it noticed a corruption). Every call is a
no-op outside a torchchaos run, so a script can keep the calls in production:

    try:
        from torchchaos.api import report_detection
    except ImportError:  # torchchaos not installed
        def report_detection(what, **details): pass
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Set by the agent when it arms in this process.
_record: Callable[..., Any] | None = None
_committed: Callable[[int], Any] | None = None


def report_detection(what: str, **details: Any) -> None:
    """The target noticed something wrong (e.g. replicas disagree, a non-finite loss)
    and is acting on it (rolling back, stopping). `details` must be JSON-serialisable."""
    if _record is not None:
        _record(what, details)


def report_checkpoint_committed(step: int) -> None:
    """The checkpoint of `step` is committed: every rank's part is written and published,
    and a restart must resume from it (or a later one). Without this call, a checkpoint
    counts as committed once every rank that writes it went on to the next step."""
    if _committed is not None:
        _committed(int(step))
