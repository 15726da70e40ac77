"""Kills: the process crashes that lose work, placed from your job's fault-free run.

"Mid-interval" is a step between two of its checkpoints, where work is at
stake; the in-save kills hit the second checkpoint save of the rank that
writes checkpoints, mid-write (a torn file) and right after a rename (a
published name). Every case must recover and end bitwise equal to the
fault-free run.
"""

import pytest

pytestmark = pytest.mark.chaos_kills


@pytest.mark.parametrize("case", [
    "kill rank 0 mid-interval",
    "kill last rank mid-interval",
    "kill node 0 mid-interval",  # its torchrun agent and every worker
    "kill mid-write in 2nd save",
    "kill after rename in 2nd save",
    "preempt rank 0 with SIGTERM",  # SIGKILL after a 30 s grace
])
def test_kill(chaos_suite, case: str) -> None:
    chaos_suite(case)
