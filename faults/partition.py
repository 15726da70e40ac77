"""partition: cut the network between simulated nodes with nftables rules.

Every simulated node is a network namespace (`torchchaos.host.netns`: a plain one, or a
container's, `--network docker`, on the same bridge); a partition is
a table `inet torchchaos` of drop rules in the namespaces of the nodes it
cuts off, and healing deletes that table. Packets are dropped, not refused:
a cut peer looks like a dead link (connections stall until a timeout), which
is what a switch failure or a split cluster does.

Shapes (`shape=`, default `isolate`):
- `isolate`: the target node (`node=K`, default a seeded pick) can reach no
  other node and no other node can reach it;
- `halves`: the first half of the nodes (rounded up) against the rest;
- `majority`: the target node and the nodes after it, fewer than half of
  all, against the rest (with 3 nodes: the target alone);
- `oneway`: the target node cannot reach node `to=` (default the next
  node): its packets to it are dropped, and so are the answers to
  connections it opened. Connections `to=` opens still work both ways;
- `store`: only the rendezvous store (node 0's torchrun agent, the c10d
  store) is cut off from every other node; training traffic flows;
- `sides=0+1/2`: explicit sides, nodes joined by `+`, sides by `/`.

When: the trigger (`step=`, `time=`) starts it; `for=S` heals it after S
seconds (default: in force until the run ends), `flaps=N` repeats the cut N
times with `gap=S` (default `for=`) healed in between.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchchaos.errors import UsageError
from torchchaos.faults.contract import (
    ClusterChaos,
    ClusterJob,
    ClusterMapping,
    HarnessKind,
    JobContext,
    NotExported,
    ResolvedFault,
)
from torchchaos.faults.params import choice, non_negative_int, positive_int, seconds
from torchchaos.host.netns import INTERFACE, NODE_NETWORKS, Network, Node

SHAPES = ("isolate", "halves", "majority", "oneway", "store")
TABLE = "torchchaos"


def _parse_sides(value: str) -> list[list[int]]:
    """'0+1/2' -> [[0, 1], [2]]."""
    return [[int(n) for n in group.split("+")] for group in value.split("/")]


def _sides(value: str) -> str:
    try:
        sides = _parse_sides(value)
    except ValueError:
        raise ValueError(f"needs node numbers like 0+1/2, got {value!r}") from None
    flat = [n for side in sides for n in side]
    if len(sides) < 2 or len(set(flat)) != len(flat) or min(flat) < 0:
        raise ValueError(f"needs two or more sides of distinct nodes, got {value!r}")
    return value


def _peer(fault: ResolvedFault, count: int) -> int:
    """The node a oneway cut's target cannot reach (`to=`, default the next node)."""
    return int(fault.params.get("to", (fault.index + 1) % count))  # type: ignore[call-overload]



def _cut(job: ClusterJob, source: list[str], targets: list[list[str]], direction: str
         ) -> dict[str, Any]:
    (target,) = targets
    return {"action": "partition", "mode": "all", "selector": job.selector(source),
            "direction": direction, "target": {"mode": "all", "selector": job.selector(target)}}


class Partition(HarnessKind):
    name = "partition"
    summary = ("cut the network between simulated nodes (isolate, halves, majority, oneway,"
               " store only, sides=), for a while or flapping (nftables in namespaces)")
    params = {"shape": choice(SHAPES), "sides": _sides, "to": non_negative_int,
              "for": seconds, "flaps": positive_int, "gap": seconds}

    def validate(self, params: dict[str, object]) -> None:
        if "sides" in params and "shape" in params:
            raise UsageError("partition: give shape= or sides=, not both")
        if "to" in params and params.get("shape") != "oneway":
            raise UsageError("partition: to= goes with shape=oneway")
        if ("flaps" in params or "gap" in params) and "for" not in params:
            raise UsageError("partition: flaps= and gap= need for= (how long each cut lasts)")

    def chaos_mesh(self, fault: ResolvedFault, job: ClusterJob) -> ClusterMapping:
        shape = fault.params.get("shape", "isolate")
        if shape == "store":
            raise NotExported("cuts one TCP port (the rendezvous store on node 0); NetworkChaos"
                              " partitions whole pods, not ports")
        duration = fault.params.get("for")
        seconds = float(duration) if duration is not None else None  # type: ignore[arg-type]
        if shape == "oneway":
            peer = self.peer(fault, job.nodes)
            spec = _cut(job, job.node_pods(fault.index), [job.node_pods(peer)], "to")
            return [ClusterChaos("NetworkChaos", spec, seconds)], (
                f"direction 'to' drops node {fault.index}'s packets to node {peer}; torchchaos"
                f" keeps the answers on connections node {peer} opened")
        sides = self.sides(fault, job.nodes)
        # Side i against every later side cuts each pair of sides once.
        chaos = []
        for i, side in enumerate(sides[:-1]):
            mine = [p for n in side for p in job.node_pods(n)]
            theirs = [p for s in sides[i + 1:] for n in s for p in job.node_pods(n)]
            chaos.append(ClusterChaos("NetworkChaos", _cut(job, mine, [theirs], "both"), seconds))
        return chaos, ""

    def check_job(self, params: dict[str, object], nodes: int, network: str) -> None:
        if nodes < 2:
            raise UsageError("partition needs --nodes 2 or more (a network between nodes)")
        if network not in NODE_NETWORKS:
            raise UsageError("partition needs --network netns or docker (each node its own network"
                             " namespace; root)")
        sides = _parse_sides(str(params["sides"])) if "sides" in params else []
        named = [n for side in sides for n in side] + [int(params.get("to", 0))]  # type: ignore[call-overload]
        if max(named) >= nodes:
            raise UsageError(f"partition: node {max(named)} does not exist (the job has"
                             f" {nodes} nodes)")

    def cut(self, fault: ResolvedFault, ctx: JobContext
            ) -> tuple[Callable[[], None], dict[str, Any]]:
        assert ctx.network is not None  # check_job
        rules = plan(fault, ctx.network, ctx.store_port)
        touched = []
        try:
            for node, ruleset in rules.items():
                apply(node, ruleset)
                touched.append(node)
        except BaseException:
            heal(touched)
            raise
        shape = str(fault.params.get("sides") or fault.params.get("shape", "isolate"))
        return (lambda: heal(touched)), {"shape": shape, "nodes": describe(fault, ctx.network)}

    # What a cut separates, for tools that express it elsewhere (torchchaos.scenario.chaosmesh): the
    # one definition of the shapes stays here.
    def sides(self, fault: ResolvedFault, count: int) -> list[list[int]]:
        """The node numbers on each side of a symmetric cut (not oneway or store)."""
        return _side_sets(fault, count)

    def peer(self, fault: ResolvedFault, count: int) -> int:
        """The node a oneway cut's target cannot reach."""
        return _peer(fault, count)


def _side_sets(fault: ResolvedFault, count: int) -> list[list[int]]:
    """The sides of a symmetric cut, as node numbers."""
    everyone = list(range(count))
    if "sides" in fault.params:  # node numbers checked by check_job
        return _parse_sides(str(fault.params["sides"]))
    shape = fault.params.get("shape", "isolate")
    target = fault.index
    if shape == "halves":
        half = (count + 1) // 2
        return [everyone[:half], everyone[half:]]
    if shape == "majority":
        size = max(1, (count - 1) // 2)
        minority = [(target + k) % count for k in range(size)]
        return [minority, [n for n in everyone if n not in minority]]
    return [[target], [n for n in everyone if n != target]]  # isolate


def plan(fault: ResolvedFault, network: Network, store_port: int | None) -> dict[Node, str]:
    """The nftables ruleset to load into each node's namespace."""
    nodes = network.nodes
    shape = fault.params.get("shape", "isolate")
    if shape == "store":
        if store_port is None:
            raise UsageError("partition shape=store: the job has no rendezvous store")
        store = nodes[0].address
        return {node: nft_table([f"ip daddr {store} tcp dport {store_port} drop"],
                               [f"ip saddr {store} tcp sport {store_port} drop"])
                for node in nodes[1:]}
    if shape == "oneway":
        to = _peer(fault, len(nodes))
        if to == fault.index:
            raise UsageError(f"partition shape=oneway: node {to} cannot be cut from itself")
        peer = nodes[to].address
        return {nodes[fault.index]: nft_table(
            [f"ip daddr {peer} ct direction original drop"],
            [f"ip saddr {peer} ct direction reply drop"])}
    rules = {}
    sides = _side_sets(fault, len(nodes))
    for side in sides:
        others = sorted({nodes[n].address for s in sides if s is not side for n in s})
        addresses = "{ " + ", ".join(others) + " }"
        for n in side:
            rules[nodes[n]] = nft_table([f"ip daddr {addresses} drop"],
                                       [f"ip saddr {addresses} drop"])
    return rules


def describe(fault: ResolvedFault, network: Network) -> str:
    """Which nodes the cut separates, in words."""
    shape = fault.params.get("shape", "isolate")
    if shape == "store":
        return "nodes 1.. cut off from the rendezvous store on node 0"
    if shape == "oneway":
        return f"node {fault.index} cannot reach node {_peer(fault, len(network.nodes))}"
    sides = _side_sets(fault, len(network.nodes))
    return " | ".join("+".join(str(n) for n in side) for side in sides)


def nft_table(outgoing: list[str], incoming: list[str], table: str = TABLE) -> str:
    """An nftables table of drop rules on the node's interface, out and in (a
    partition's, or a degraded link's: torchchaos.faults.link)."""
    def chain(name: str, hook: str, match: str, rules: list[str]) -> str:
        body = "\n".join(f"    {match} {rule}" for rule in rules)
        return (f"  chain {name} {{\n    type filter hook {hook} priority 0; policy accept;\n"
                f"{body}\n  }}\n")

    return (f"table inet {table} {{\n"
            + chain("out", "output", f'oifname "{INTERFACE}"', outgoing)
            + chain("in", "input", f'iifname "{INTERFACE}"', incoming) + "}\n")


def apply(node: Node, ruleset: str, table: str = TABLE) -> None:
    """Load `ruleset` (the table `table`) into the node's namespace, and see it there:
    a fault is in force only once the kernel lists its drops (nft can exit 0 into
    another namespace, or a table can be flushed by something else), not once nft was
    asked. A table loaded but not listed whole is deleted again."""
    done = node.run("nft", "-f", "-", stdin=ruleset)
    if done.returncode != 0:
        raise UsageError(f"nft on node {node.index}: {done.stderr.strip()}")
    listed = node.run("nft", "list", "table", "inet", table)
    drops = ruleset.count(" drop")
    if listed.returncode != 0 or listed.stdout.count(" drop") < drops:
        heal([node], table)
        raise UsageError(f"nft on node {node.index}: the table {table} does not list its"
                         f" {drops} drop rule(s) after loading them"
                         f" ({(listed.stderr or listed.stdout).strip()[:200]})")


def heal(nodes: list[Node], table: str = TABLE) -> None:
    """Delete the table in each namespace (missing tables and namespaces are fine:
    the job may be torn down already)."""
    for node in nodes:
        node.run("nft", "delete", "table", "inet", table)
