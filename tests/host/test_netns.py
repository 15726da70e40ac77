"""Simulated nodes' network on real namespaces, and partitions cut with real nftables rules.

A connection attempt is the proof: a cut peer's SYN is dropped, so connecting
times out; healed, it connects again.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from torchchaos.errors import UsageError
from torchchaos.faults import partition
from torchchaos.harness.nemesis import windows
from torchchaos.host import lifeline, netns
from torchchaos.scenario.schedule import ResolvedFault
from torchchaos.scenario.spec import Trigger

pytestmark = pytest.mark.skipif(bool(netns.unavailable_reason()),
                                reason=netns.unavailable_reason() or "ok")

PORT = 7000
SERVE = (f"import socket\ns = socket.create_server(('0.0.0.0', {PORT}))\n"
         "while True:\n    s.accept()[0].close()\n")
CONNECT = ("import socket, sys\n"
           f"socket.create_connection((sys.argv[1], {PORT}), timeout=1.0).close()\n")


def fault(shape: str = "isolate", node: int = 1, **params: object) -> ResolvedFault:
    return ResolvedFault("f0-partition", "partition", "node", node, Trigger(step=1),
                         {"shape": shape, **params}, "partition", 0)


@pytest.fixture
def network():
    run_id = uuid.uuid4().hex[:12]  # its own: tests side by side under pytest -n
    lifeline.own(run_id)  # and owned: a harness starting beside it leaves it alone
    net = netns.Network(run_id, 3).create()
    servers = [subprocess.Popen([*node.enter(), sys.executable, "-c", SERVE],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for node in net.nodes]
    try:
        for node in net.nodes:
            _wait_reachable(net.nodes[0], node)
        yield net
    finally:
        for server in servers:
            server.kill()
            server.wait()
        net.close()
    assert netns.leftovers(run_id) == []


def _wait_reachable(src: netns.Node, dst: netns.Node) -> None:
    deadline = time.monotonic() + 10
    while not reaches(src, dst):
        assert time.monotonic() < deadline, f"node {dst.index} never listened"
        time.sleep(0.1)


def reaches(src: netns.Node, dst: netns.Node) -> bool:
    return src.run(sys.executable, "-c", CONNECT, dst.address).returncode == 0


def test_nodes_reach_each_other_by_address(network):
    a, b, c = network.nodes
    assert reaches(a, b) and reaches(b, c) and reaches(c, a)
    assert [n.address for n in network.nodes] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]


def test_an_isolated_node_times_out_until_healed(network):
    a, b, c = network.nodes
    heal, details = partition.Partition().cut(fault("isolate", node=1), _ctx(network))
    assert details["nodes"] == "1 | 0+2"
    started = time.monotonic()
    assert not reaches(a, b)
    assert time.monotonic() - started >= 0.9  # dropped, not refused: a timeout
    assert not reaches(b, c) and reaches(a, c)
    heal()
    assert reaches(a, b) and reaches(b, c)
    heal()  # twice is fine


def test_one_way_cut_lets_the_other_side_connect(network):
    a, b, _ = network.nodes
    heal, details = partition.Partition().cut(fault("oneway", node=0, to=1), _ctx(network))
    assert details["nodes"] == "node 0 cannot reach node 1"
    assert not reaches(a, b)
    assert reaches(b, a)
    heal()
    assert reaches(a, b)


def test_halves_and_explicit_sides(network):
    a, b, c = network.nodes
    heal, details = partition.Partition().cut(fault("halves"), _ctx(network))
    assert details["nodes"] == "0+1 | 2"
    assert reaches(a, b) and not reaches(a, c) and not reaches(c, b)
    heal()
    sides = ResolvedFault("f1", "partition", "node", 0, Trigger(step=1), {"sides": "0/1+2"},
                          "partition", 0)
    heal, details = partition.Partition().cut(sides, _ctx(network))
    assert details["nodes"] == "0 | 1+2"
    assert reaches(b, c) and not reaches(a, b)
    heal()


def test_store_cut_drops_only_the_store_port(network):
    a, b, _ = network.nodes
    heal, _ = partition.Partition().cut(fault("store"), _ctx(network, store_port=PORT))
    assert not reaches(b, a)  # the "store" listens on node 0's PORT
    heal()
    assert reaches(b, a)


def test_closing_removes_namespaces_links_and_rules():
    run_id = uuid.uuid4().hex[:12]
    lifeline.own(run_id)
    net = netns.Network(run_id, 2).create()
    partition.Partition().cut(fault("isolate"), _ctx(net))
    assert len(netns.leftovers(run_id)) == 2 + 3  # 2 namespaces, bridge, 2 links
    net.close()
    assert netns.leftovers(run_id) == []
    net.close()  # twice is fine


def test_elastic_jobs_and_store_placement_in_the_torchrun_command():
    from pathlib import Path

    from torchchaos.harness.runner import torchrun_command
    from torchchaos.scenario.model import Scenario

    elastic = Scenario("train.py", nodes=3, min_nodes=2, network="netns")
    net = netns.Network("0123456789ab", 3)  # names only: nothing is created
    node1 = torchrun_command(elastic, 1, "RUN", 29400, Path("/r"), net)
    assert node1[:2] == ["nsenter", "--net=/run/netns/tc01234567n1"]
    joined = " ".join(node1)
    assert "--nnodes 2:3" in joined and "--rdzv-endpoint 10.77.0.1:29400" in joined
    assert "is_host=0" in joined and "--local-addr 10.77.0.2" in joined
    proxied = torchrun_command(Scenario("train.py", nodes=2, network="host"), 1, "RUN", 5,
                               Path("/r"), None, "toxiproxy:7000")
    assert "--rdzv-endpoint toxiproxy:7000" in " ".join(proxied)


def test_flapping_windows():
    flapping = fault(**{"for": 2.0, "flaps": 3, "gap": 1.0})
    assert [(w.start, w.end) for w in windows(flapping, 10.0)] == [
        (10.0, 12.0), (13.0, 15.0), (16.0, 18.0)]
    assert [(w.start, w.end) for w in windows(fault(), 10.0)] == [(10.0, None)]


def _ctx(network: netns.Network, store_port: int | None = None):
    from torchchaos.faults.contract import JobContext

    return JobContext(network=network, store_port=store_port, run_dir=None, run_id="x")  # type: ignore[arg-type]


def test_the_nemesis_applies_a_requested_flapping_cut_and_heals_it_on_time(network, tmp_path):
    """The runner's side: a rank's request (a file), then cut, heal, cut, heal on time."""
    from torchchaos.faults.contract import JobContext
    from torchchaos.harness.nemesis import Nemesis
    from torchchaos.rundir.history import History, HistoryWriter
    from torchchaos.rundir.layout import RunLayout

    layout = RunLayout(tmp_path)
    layout.create()
    flapping = fault(**{"for": 1.5, "flaps": 2, "gap": 1.5})
    log = HistoryWriter(layout.harness_history, source="harness")
    ctx = JobContext(tmp_path, "x", network=network)
    nemesis = Nemesis([flapping], ctx, log, partition.Partition().cut)
    a, b, _ = network.nodes
    layout.requests_dir.mkdir()
    (layout.requests_dir / f"{flapping.id}.json").write_text("{}")
    seen = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        nemesis.poll()
        seen.append(reaches(a, b))  # a 1 s timeout while cut: polls every second or so
    nemesis.close()
    log.close()
    events = [e["ev"] for e in History.of_run(tmp_path).events if e["ev"].startswith("nemesis")]
    assert events == ["nemesis_begin", "nemesis_end"] * 2
    assert (layout.requests_dir / f"{flapping.id}.done").exists()
    assert seen[0] is False and True in seen and seen.count(False) >= 2, seen
    assert reaches(a, b)


def test_a_cut_whose_rules_the_kernel_does_not_list_is_not_in_force(network):
    """Issue 62, part 5: nft was asked and exited 0, but the table holds no drop (here
    the same batch deletes it again, as a flush by something else would): `apply`
    refuses, so the nemesis records fault_error and the run reads "could not judge"."""
    node = network.nodes[1]
    ruleset = partition.plan(fault(), network, None)[node]
    with pytest.raises(UsageError, match=r"does not list its 2 drop rule\(s\)"):
        partition.apply(node, ruleset + f"delete table inet {partition.TABLE}\n")
    partition.apply(node, ruleset)  # loaded and listed: in force
    assert not reaches(network.nodes[0], node)
    partition.heal([node])
    assert reaches(network.nodes[0], node)


def test_a_link_that_drops_every_packet_cuts_until_healed_and_is_listed(network):
    from torchchaos.faults import link

    a, b, _ = network.nodes
    heal = link.degrade(b, {"loss": 100.0})
    listed = b.run("nft", "list", "table", "inet", link.TABLE).stdout
    interface = netns.INTERFACE
    assert (listed.count(f'oifname "{interface}" drop')
            + listed.count(f'iifname "{interface}" drop')) == 2, listed
    assert not reaches(a, b)
    heal()
    assert reaches(a, b)
    heal()  # twice is fine


def test_a_rate_limited_link_still_connects():
    from torchchaos.faults import link

    rules = link.ruleset({"rate": 200, "loss": 5.0})
    assert "numgen random mod 10000 < 500 drop" in rules
    assert rules.count("limit rate over 200 kbytes/second drop") == 2  # both directions
