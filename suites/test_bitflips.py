"""Silent data corruption: a flipped bit must be detected within the bound (default:
the checkpoint interval) and the run end bitwise equal to the fault-free one.

A job with no defences (cross-replica checks, non-finite guards, rollback)
fails these: that is the finding. `torchchaos campaign` measures the rates.
"""

import pytest

pytestmark = pytest.mark.chaos_sdc


@pytest.mark.parametrize("case", [
    "flip a weight's exponent bit",  # a seeded rank, step and element
    "flip an optimizer state sign bit",
    "NaN in the loss",
])
def test_bitflip(chaos_suite, case: str) -> None:
    chaos_suite(case)
