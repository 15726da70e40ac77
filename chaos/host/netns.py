"""Simulated nodes with their own network: one Linux network namespace per node.

Each node of a job gets a namespace with loopback and one interface, `tc0`,
whose other end is plugged into a bridge private to the job, with the address
10.77.0.(node + 1)/24. The bridge has no address in the host's namespace, so
the job's traffic never leaves the bridge and jobs running side by side (each
its own bridge) cannot see each other even though they use the same
addresses. Processes join a node with `nsenter --net=...` (only the network
namespace: the mounts, the processes and the files stay shared, as on a
cluster with a shared filesystem).

Everything is named after the run id, so whatever a killed harness left
behind can be found (`leftovers`) and removed (`remove_leftovers`); deleting
a namespace also deletes its end of the link and every firewall rule in it.
Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass

from torchchaos.errors import ChaosError

PREFIX = "tc"  # namespaces tc<run>n<k>, bridge tcb<run>, host-side links tcv<run>n<k>
INTERFACE = "tc0"  # the node's interface, inside its namespace
SUBNET = "10.77.0"
NETNS_DIR = "/run/netns"
# the scenario networks whose nodes each have a namespace of this module's making: plain
# namespaces, or containers plugged into the same bridge (torchchaos.host.docker.nodes)
NODE_NETWORKS = ("netns", "docker")


class NetworkError(ChaosError):
    """The simulated nodes' network could not be built or commanded."""


def unavailable_reason() -> str:
    """Why namespaces cannot be made here, or "" if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"{tool} not found (install Debian's {package})"
    return ""


def free_port() -> int:
    """A TCP port nothing on this machine listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Node:
    index: int
    namespace: str
    address: str
    host_link: str  # the link's end in the host namespace, on the bridge

    def enter(self) -> list[str]:
        """The command prefix that runs a program on this node."""
        return ["nsenter", f"--net={NETNS_DIR}/{self.namespace}", "--"]

    def job_prefix(self) -> list[str]:
        """The prefix a job's process (its torchrun agent) starts with: on a plain node
        `enter()`; a container node's also makes it the container's (see there)."""
        return self.enter()

    def run(self, *command: str, stdin: str | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.enter(), *command], input=stdin, capture_output=True,
                              text=True, timeout=timeout)


class Network:
    """The namespaces, links and bridge of one job; `close()` removes them all. Register
    the run with the harness's lifeline first (`torchchaos.host.lifeline.own`, as `Job` does):
    if the harness dies, its watcher removes them."""

    def __init__(self, run_id: str, nodes: int) -> None:
        tag = run_id[:8]
        self.bridge = f"{PREFIX}b{tag}"
        self.nodes = [Node(k, f"{PREFIX}{tag}n{k}", f"{SUBNET}.{k + 1}", f"{PREFIX}v{tag}n{k}")
                      for k in range(nodes)]

    def create(self) -> Network:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for node in self.nodes:
                self._add(node)
        except BaseException:
            self.close()
            raise
        return self

    def _add(self, node: Node) -> None:
        _ip("netns", "add", node.namespace)
        self._plug(node)

    def _plug(self, node: Node, mac: str | None = None) -> None:
        """The node's link: a veth from the bridge into its namespace, with its address
        (and `mac`, where the node must keep one)."""
        _ip("link", "add", node.host_link, "type", "veth", "peer", "name", INTERFACE,
            "netns", node.namespace)
        _ip("link", "set", node.host_link, "master", self.bridge, "up")
        inside = ("-n", node.namespace)
        if mac is not None:
            _ip(*inside, "link", "set", INTERFACE, "address", mac)
        _ip(*inside, "addr", "add", f"{node.address}/24", "dev", INTERFACE)
        _ip(*inside, "link", "set", INTERFACE, "up")
        _ip(*inside, "link", "set", "lo", "up")

    def _unplug(self, node: Node) -> None:
        _ip("netns", "del", node.namespace, check=False)
        _ip("link", "del", node.host_link, check=False)

    def close(self) -> None:
        """Remove every namespace (with its link end and rules) and the bridge. Safe
        to call twice, and on a half-built network."""
        for node in self.nodes:
            self._unplug(node)
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()


OURS = re.compile(rf"^{PREFIX}(?:[bv])?([0-9a-f]{{8}})(?:n\d+)?$")


def leftovers(run_id: str = "") -> list[str]:
    """Namespaces and links of torchchaos runs (of `run_id` only, if given) that exist."""
    if shutil.which("ip") is None:
        return []
    found = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        found += [f"netns {name}" for name in line.split()[:1] if _ours(name, run_id)]
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        if _ours(name, run_id):
            found.append(f"link {name}")
    return found


def _ours(name: str, run_id: str) -> bool:
    match = OURS.match(name)
    return match is not None and (not run_id or match.group(1) == run_id[:8])


def remove_leftovers(run_id: str = "") -> list[str]:
    """Delete what `leftovers` finds; returns what it removed."""
    found = leftovers(run_id)
    for item in found:
        what, name = item.split(" ", 1)
        if what == "netns":
            _ip("netns", "del", name, check=False)
        else:
            _ip("link", "del", name, check=False)
    return found
