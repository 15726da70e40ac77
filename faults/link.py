"""link: degrade a simulated node's link: loss, a rate limit, delay, jitter, reordering.

A partition cuts a link outright; a degraded link still carries the collective,
badly, which is what a flaky NIC, a congested switch port or a failing optic
does. The node (`node=K`, default a seeded pick) is a network namespace
(`torchchaos.host.netns`); its link is its interface there, and the
degradation acts on both directions through it.

- `loss=P`: each packet dropped with probability P percent;
- `rate=R`: at most R KB/s each way, the rest dropped;
- `delay=MS`, `jitter=MS`, `reorder=P`: need the kernel's netem queueing
  discipline (`sch_netem`).

Loss and the rate limit are nftables rules in the node's namespace (a table
`inet torchchaos_link`: `numgen random` for the loss, `limit rate over` for the
rate), which every kernel with nftables has. Delay, jitter and reordering are
a `tc netem` qdisc on the interface; where the kernel has no netem (this
project's CI machines: "Specified qdisc kind is unknown") a spec asking for
them is refused before any process starts. A fault is in force only once the
kernel lists its rules or its qdisc. Timing as for partitions: the trigger
starts it, `for=` heals it, `flaps=`/`gap=` repeat it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from functools import cache
from typing import Any

from torchchaos.errors import UsageError
from torchchaos.faults import partition
from torchchaos.faults.contract import HarnessKind, JobContext, ResolvedFault
from torchchaos.faults.params import non_negative_int, percentage, positive_int, seconds
from torchchaos.host.netns import INTERFACE, NODE_NETWORKS, Node

TABLE = "torchchaos_link"
NETEM = ("delay", "jitter", "reorder")


@cache
def netem_missing() -> str:
    """Why this kernel cannot run a netem qdisc ("" if it can), asked once in a
    throwaway network namespace (nothing is left behind)."""
    if shutil.which("tc") is None or shutil.which("unshare") is None:
        return "tc (iproute2) or unshare is not installed"
    done = subprocess.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root",
                           "netem", "delay", "1ms"], capture_output=True, text=True, timeout=30)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def ruleset(params: dict[str, object]) -> str:
    """The nftables table of the loss and rate limit, both directions."""
    rules = []
    if "loss" in params:
        share = round(float(params["loss"]) * 100)  # type: ignore[arg-type]
        # numgen's values are 0..9999: every packet is a plain drop
        rules.append("drop" if share >= 10000 else f"numgen random mod 10000 < {share} drop")
    if "rate" in params:
        rules.append(f"limit rate over {params['rate']} kbytes/second drop")
    return partition.nft_table(rules, rules, TABLE)


def netem_arguments(params: dict[str, object]) -> list[str]:
    """`tc qdisc add dev IF root netem ...` arguments for the whole degradation."""
    args = ["netem"]
    if "delay" in params:
        args += ["delay", f"{params['delay']}ms"]
        if "jitter" in params:
            args += [f"{params['jitter']}ms"]
    if "loss" in params:
        args += ["loss", f"{params['loss']}%"]
    if "reorder" in params:
        args += ["reorder", f"{params['reorder']}%"]
    if "rate" in params:
        args += ["rate", f"{int(params['rate']) * 8}kbit"]  # type: ignore[call-overload]
    return args


def degrade(node: Node, params: dict[str, object]) -> Callable[[], None]:
    """Put the degradation in force on `node` and see it listed; returns its heal."""
    if any(key in params for key in NETEM):
        return _netem(node, params)
    return _nftables(node, params)


def _nftables(node: Node, params: dict[str, object]) -> Callable[[], None]:
    partition.apply(node, ruleset(params), TABLE)
    return lambda: partition.heal([node], TABLE)


def _netem(node: Node, params: dict[str, object]) -> Callable[[], None]:
    done = node.run("tc", "qdisc", "add", "dev", INTERFACE, "root", *netem_arguments(params))
    if done.returncode != 0:
        raise UsageError(f"tc netem on node {node.index}: {done.stderr.strip()}")
    shown = node.run("tc", "qdisc", "show", "dev", INTERFACE)
    if "netem" not in shown.stdout:
        raise UsageError(f"tc on node {node.index}: no netem qdisc listed on {INTERFACE}")

    def heal() -> None:
        node.run("tc", "qdisc", "del", "dev", INTERFACE, "root")

    return heal


class Link(HarnessKind):
    name = "link"
    summary = ("degrade a simulated node's link: loss=%, rate= KB/s (nftables), delay=,"
               " jitter=, reorder= (netem), for a while or flapping")
    not_on_a_cluster = ("NetworkChaos's delay/loss/bandwidth actions are the cluster's "
                        "equivalent; not mapped yet")
    params = {"loss": percentage, "rate": positive_int, "delay": non_negative_int,
              "jitter": non_negative_int, "reorder": percentage, "for": seconds,
              "flaps": positive_int, "gap": seconds}

    def validate(self, params: dict[str, object]) -> None:
        if not any(key in params for key in ("loss", "rate", *NETEM)):
            raise UsageError("link needs loss=, rate=, delay= or reorder= (what to degrade)")
        if "jitter" in params and "delay" not in params:
            raise UsageError("link: jitter= goes with delay=")
        if "reorder" in params and "delay" not in params:
            raise UsageError("link: reorder= needs delay= (netem reorders by sending some"
                             " packets without it)")
        if ("flaps" in params or "gap" in params) and "for" not in params:
            raise UsageError("link: flaps= and gap= need for= (how long each lasts)")

    def check_job(self, params: dict[str, object], nodes: int, network: str) -> None:
        if nodes < 2:
            raise UsageError("link needs --nodes 2 or more (a link between nodes)")
        if network not in NODE_NETWORKS:
            raise UsageError("link needs --network netns or docker (each node its own network"
                             " namespace; root)")
        wanted = [key for key in NETEM if key in params]
        if wanted and netem_missing():
            raise UsageError(f"link {wanted[0]}= needs the kernel's netem qdisc, which this"
                             f" machine cannot run ({netem_missing()}); loss= and rate= work"
                             " without it")

    def cut(self, fault: ResolvedFault, ctx: JobContext
            ) -> tuple[Callable[[], None], dict[str, Any]]:
        assert ctx.network is not None  # check_job
        node = ctx.network.nodes[fault.index]
        heal = degrade(node, fault.params)
        said = {k: v for k, v in fault.params.items() if k in ("loss", "rate", *NETEM)}
        return heal, {"node": fault.index, **said}
