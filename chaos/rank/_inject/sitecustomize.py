"""Loaded by every Python process started with this folder on PYTHONPATH.

It arms the torchchaos agent only in torchrun workers of a harness run (the
launcher itself and unrelated processes stay untouched), then hands over to
any other `sitecustomize` further down the path so a user's own keeps working.
"""

import importlib.machinery
import importlib.util
import os
import sys

if (
    os.environ.get("TORCHCHAOS_RUN_DIR")
    and "LOCAL_RANK" in os.environ
    and "TORCHCHAOS_AGENT_PID" not in os.environ
):
    from torchchaos.rank.agent import boot

    boot()
elif os.environ.get("TORCHCHAOS_RUN_DIR") and sys.orig_argv[1:3] in (
    ["-m", "torch.distributed.run"],
    ["-m", "torchchaos.rank.warmrun"],
):
    # A harness run's torchrun runs no user code: its exit need not collect all of torch's
    # objects again and again (0.35 s of CPU after every run; the harness waits for it).
    import atexit
    import gc

    atexit.register(gc.freeze)  # registered first, so it runs last


def _chain_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_chain_next_sitecustomize()
