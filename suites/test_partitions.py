"""Partitions: simulated nodes cut off from each other for a while, then healed
(needs nodes >= 2, and root for the network namespaces).

The job must come through (its collective timeout fires, torchrun restarts,
the rendezvous completes once the network heals) and end bitwise equal.
"""

import pytest

pytestmark = pytest.mark.chaos_partitions


@pytest.mark.parametrize("case", [
    "isolate the last node",
    "cut off the rendezvous store",  # only the links to torchrun's c10d store
])
def test_partition(chaos_suite, case: str) -> None:
    chaos_suite(case)
