"""The bundled target, except that rank 1 of the job's first elastic restart dies at
start-up, before it loads anything, the way a worker dies on a transient failure (a
port still held, a rendezvous timeout). The next restart recovers: the job is
healthy, and its checks must say so."""

import os
import runpy
import sys
from pathlib import Path

if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "1" and os.environ.get("RANK") == "1":
    sys.exit("flaky_restart.py: a transient start-up failure on the first restart")

TARGET = Path(__file__).resolve().parents[2] / "targets" / "ddp_lm.py"
sys.argv[0] = str(TARGET)
sys.path.insert(0, str(TARGET.parent))  # its helper modules, as if run itself
runpy.run_path(str(TARGET), run_name="__main__")
