"""Hangs: a stuck rank must make the job fail or restart within the harness's bound
(`hang_timeout`), never wait forever; a straggler only slows it.

Torch's default collective timeouts are minutes: a job that keeps them fails
these, with every rank's stack in the report.
"""

import pytest

pytestmark = pytest.mark.chaos_hangs


@pytest.mark.parametrize("case", [
    "stop a rank with SIGSTOP",
    "hold a rank before a collective",
    "collective order mismatch",  # one rank calls a collective no peer calls
    "straggler",
])
def test_hang(chaos_suite, case: str) -> None:
    chaos_suite(case)
