"""Storage: what disks do to a checkpoint protocol (needs FUSE: the fault filesystem).

A power loss drops whatever was not fsynced (data and directory entries); a
torn write reaches the disk in part; ENOSPC fails a write; bit rot flips bits
in the newest committed checkpoint. All land in the second save of the rank
that writes checkpoints, or after it. `torchchaos crashpoints` goes through
every file event of a save.
"""

import pytest

pytestmark = pytest.mark.chaos_storage


@pytest.mark.parametrize("case", [
    "power loss after rename in 2nd save",  # only fsyncs make the new name (and data) stay
    "power loss mid-write in 2nd save",
    "torn write in 2nd save",
    "ENOSPC in 2nd save",
    "bit rot in the newest checkpoint",  # resume must notice, and fall back
])
def test_storage(chaos_suite, case: str) -> None:
    chaos_suite(case)
