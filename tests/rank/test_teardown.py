"""A rank's lightened teardown still finalises what a script left to the collector.

The agent freezes the heap at exit so the interpreter's teardown does not walk all of
torch again and again; it collects first, so an object a script left in a reference
cycle is still finalised, and the script's own atexit handlers still run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import atexit, sys
    from torchchaos.rank.agent import _lighten_teardown
    atexit.register(_lighten_teardown)   # as the agent's boot does, before the script
    class Writer:                        # as a writer that finishes its file in __del__
        def __del__(self):
            with open(sys.argv[1], "w") as out:
                out.write("finalised")
    held = Writer()
    held.itself = held                   # a cycle: only the collector frees it
    del held
    atexit.register(lambda: open(sys.argv[2], "w").write("the script's handler ran"))
""")


def test_a_cycle_left_at_exit_is_finalised_and_the_scripts_handlers_run(tmp_path: Path):
    left, handler = tmp_path / "left.txt", tmp_path / "handler.txt"
    subprocess.run([sys.executable, "-c", SCRIPT, str(left), str(handler)], check=True,
                   timeout=120)
    assert left.read_text() == "finalised"
    assert handler.read_text() == "the script's handler ran"
