"""Where the agent's cost per training step goes, measured inside one training process.

One process trains the bundled TinyLM under DDP (gloo, world size 1, one thread; with
`--ranks 2` two processes in one group, rank 0's figures) in
blocks of steps, the agent's patches of torch switched on and off from block to block
(on first in odd blocks), so the machine's drift falls on both alike. Each variant
switches one part of the agent's light-step work off as well, and says what the step
costs without it: the fingerprints (`digest_tensors`, the parameters' `RepeatedDigest`,
`digest_object`), the step's history line (`HistoryWriter.record_step`), both with the
heartbeat. Then one run with timers around those
parts, in place: what each costs where it runs, between torch's kernels, with the caches
the step left (several times what the same call costs in a loop of its own).

    python bench/agent_cost.py --blocks 40 --steps 200 [--ranks 2]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

VARIANTS = {
    "the agent as it is": "",
    "without fingerprints": "nodigest",
    "without the history line": "nohistory",
    "without both and the heartbeat": "nodigest,nohistory,nobeat",
}
TIMED = ("digest_tensors", "params_digest", "digest_object", "record_step", "record")


def _patched_state() -> tuple[Any, ...]:
    import torch
    from torch.nn.modules import module
    from torch.optim import optimizer

    return (module.Module.__call__, torch.Tensor.backward,
            dict(optimizer._global_optimizer_pre_hooks),
            dict(optimizer._global_optimizer_post_hooks))


def _restore(state: tuple[Any, ...]) -> None:
    import torch
    from torch.nn.modules import module
    from torch.optim import optimizer

    module.Module.__call__, torch.Tensor.backward = state[0], state[1]
    for hooks, saved in zip((optimizer._global_optimizer_pre_hooks,
                             optimizer._global_optimizer_post_hooks), state[2:]):
        hooks.clear()
        hooks.update(saved)


def _timed(name: str, fn: Callable[..., Any], spent: collections.Counter[str]) -> Callable:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start
    return timed


def one_process(blocks: int, steps: int, without: set[str], timers: bool, rank: int,
                ranks: int, port: int) -> dict[str, Any]:
    """The measurement itself (in a process of its own: the agent patches torch)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank))
    import torch.distributed as dist
    from reference_step import ReferenceTraining  # the bundled target's step
    from torch.nn.parallel import DistributedDataParallel

    from torchchaos import env
    from torchchaos.rank import agent as agent_module
    from torchchaos.rundir.layout import RunLayout

    run, reference = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    # a reference whose last step is far away: every step after the first few is light
    table = RunLayout(reference).rank_history(rank)  # each rank's own (none: a reference run)
    table.parent.mkdir(parents=True)
    table.write_text(json.dumps({"ev": "step", "step": 10**9,
                                 "fp": {"params_start": "-", "optim_start": "-"}}) + "\n")
    off = _patched_state()
    agent = agent_module.Agent({**os.environ, env.RUN_DIR: str(run),
                                env.REFERENCE: str(reference)})
    agent.install()
    on = _patched_state()
    spent: collections.Counter[str] = collections.Counter()
    if "nodigest" in without:
        agent_module.digest_tensors = lambda tensors: ""
        agent_module.digest_object = lambda obj: ""
        agent.params_digest = lambda tensors: ""
    if "nohistory" in without:
        agent.history.record_step = lambda *args, **kwargs: None
    if "nobeat" in without:
        agent.heartbeat.progress = lambda doing, step: None
    if timers:
        for name in ("digest_tensors", "digest_object"):
            setattr(agent_module, name, _timed(name, getattr(agent_module, name), spent))
        agent.params_digest = _timed("params_digest", agent.params_digest, spent)
        for name in ("record_step", "record"):
            setattr(agent.history, name, _timed(name, getattr(agent.history, name), spent))

    dist.init_process_group("gloo")
    training = ReferenceTraining.create()  # made after the agent, as in a rank
    training.model = DistributedDataParallel(training.model)
    medians: dict[str, list[float]] = {"off": [], "on": []}
    for block in range(blocks):
        order = (("off", off), ("on", on)) if block % 2 == 0 else (("on", on), ("off", off))
        for side, state in order:
            _restore(state)
            times, last = [], time.perf_counter()
            for _ in range(steps):
                training.step()
                now = time.perf_counter()
                times.append(now - last)
                last = now
            medians[side].append(statistics.median(times[5:]))
    on_steps = blocks * steps
    return {"off": statistics.median(medians["off"]), "on": statistics.median(medians["on"]),
            "ratios": [b / a for a, b in zip(medians["off"], medians["on"])],
            "spent_us": {name: spent[name] / on_steps * 1e6 for name in TIMED if spent[name]}}


def run_variant(blocks: int, steps: int, without: str, ranks: int,
                timers: bool = False) -> dict[str, Any]:
    """One variant in `ranks` processes of one DDP group; rank 0's figures."""
    port = 20000 + (os.getpid() + int(time.time())) % 20000
    children = [subprocess.Popen([sys.executable, __file__, "--child", without or "-",
                                  "--blocks", str(blocks), "--steps", str(steps),
                                  "--rank", str(rank), "--ranks", str(ranks),
                                  "--port", str(port), *(["--timers"] if timers else [])],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 cwd=tempfile.gettempdir()) for rank in range(ranks)]
    results = [child.communicate() for child in children]
    for child, (_, err) in zip(children, results):
        if child.returncode:
            sys.exit(f"the measurement failed: {err[-2000:]}")
    return json.loads(results[0][0].splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=200, help="steps a block")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=1,
                        help="processes in the DDP group (each on its own core, if there are)")
    parser.add_argument("--timers", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=29500, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.ranks < 1 or ns.blocks < 1 or ns.steps < 10:
        parser.error("--ranks and --blocks must be at least 1, --steps at least 10")
    if ns.child is not None:
        without = set() if ns.child == "-" else set(ns.child.split(","))
        print(json.dumps(one_process(ns.blocks, ns.steps, without, ns.timers, ns.rank,
                                     ns.ranks, ns.port)), flush=True)
        os._exit(0)  # torch 2.13: freeing DDP's reducer at exit can hang in gloo
    for label, without in VARIANTS.items():
        got = run_variant(ns.blocks, ns.steps, without, ns.ranks)
        ratios = got["ratios"]
        print(f"{label:32s} step {got['off'] * 1e3:.3f} ms unpatched, {got['on'] * 1e3:.3f} ms"
              f" patched: ratio {got['on'] / got['off']:.3f} (blocks {min(ratios):.3f} to"
              f" {max(ratios):.3f})", flush=True)
    timed = run_variant(max(ns.blocks // 4, 2), ns.steps, "", ns.ranks, timers=True)
    print("in place, per patched step: " + ", ".join(
        f"{name} {value:.1f} us" for name, value in timed["spent_us"].items()))


if __name__ == "__main__":
    main()
