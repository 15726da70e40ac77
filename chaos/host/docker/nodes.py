"""Simulated nodes as containers: each node its own disk, hostname and network.

`--network docker` runs every node of a job in a container of an engine the run starts
for itself (`torchchaos.host.docker.engine`). A node is what a cluster's machine is to a
job: the shared filesystem at the same paths (the run directory, the script, the Python
the job runs with: bind mounts of the host's folders), and a disk of its own that no
other node sees and that dies with the node: the container's own filesystem, with
`/local` ready for a job's node-local scratch. A killed node is replaced by a new
container before the job's next launch, so what a job left only on node-local storage
is gone, as it is when a machine of a cluster goes down.

The network is the namespace nodes' (`torchchaos.host.netns`): the container starts
with none, and the run plugs its own veth into it on the run's bridge, with the same
addresses, interface name and firewall table names; a partition or a degraded link cuts
the container's link as it cuts a namespace's. The container shares the machine's
process ids (`pid_mode=host`), so the ranks' pids, signals, stacks and reaping work as
for every other run. Processes enter a node with `nsenter` into its mount, network,
hostname and IPC namespaces.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from torchchaos.errors import CannotJudge
from torchchaos.host import engine_folders as folders
from torchchaos.host import freezer, netns
from torchchaos.host.docker import images
from torchchaos.host.docker.engine import Engine
from torchchaos.host.owners import state_dir

LOCAL = "/local"  # a node's own disk, gone with the node


@dataclass(frozen=True)
class ContainerNode(netns.Node):
    pid: int = 0  # the container's first process, whose namespaces a node's processes join
    workdir: str = "/"
    groups: tuple[str, ...] = ()  # the container's cgroup folders, one per hierarchy

    def enter(self) -> list[str]:
        # `nsenter --wd` leaves torch's oneMKL unable to load it (seen here): cd after
        return ["nsenter", "-t", str(self.pid), "-m", "-n", "-u", "-i", "--", "sh", "-c",
                'cd "$0" && exec "$@"', self.workdir]

    def job_prefix(self) -> list[str]:
        """`enter()`, once the process joined the container's cgroups: the job's processes
        are then the container's, and `docker pause` freezes them with it. The harness's
        own commands on the node (`run`: nft, tc) stay outside, so a paused node can still
        be healed."""
        files = " ".join(shlex.quote(f"{g}/cgroup.procs") for g in self.groups)
        joining = f"echo $$ | tee {files} > /dev/null && " if files else ""
        return ["sh", "-c", f'{joining}exec "$@"', "sh", *self.enter()]


def shared_folders(*extra: Path) -> list[Path]:
    """The host folders every node sees at the same path: the Python the job runs with,
    torchchaos, the temporary folder, the state folder (locks, short links), and
    `extra` (the run directory, the reference, the script's folder); none inside another."""
    import torchchaos

    wanted = {Path(sys.prefix), Path(sys.base_prefix),
              Path(torchchaos.__file__).resolve().parents[1], Path(tempfile.gettempdir()),
              state_dir(), *extra}
    folders = sorted({p.resolve() for p in wanted if p.exists()}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for folder in folders:
        if not any(folder.is_relative_to(k) for k in kept):
            kept.append(folder)
    return kept


class ContainerNetwork(netns.Network):
    """The namespace nodes' bridge and links, each node's end inside a container."""

    def __init__(self, run_id: str, nodes: int, shared: list[Path], workdir: Path) -> None:
        super().__init__(run_id, nodes)
        self.shared, self.workdir = shared, workdir
        self.engine: Engine | None = None
        self.base = ""
        self.containers: dict[int, object] = {}

    def create(self) -> ContainerNetwork:
        try:
            self.engine = Engine.start()  # the run's own, on the harness's lifeline
            self.base = images.base_image(self.engine)
        except BaseException:
            self.close()
            raise
        super().create()  # the bridge, then each node through `_add`
        return self

    def _add(self, node: netns.Node) -> None:
        """The node's container, its namespace named as a plain node's, then its link."""
        from docker.types import Mount

        assert self.engine is not None
        client = self.engine.client(timeout=60)
        try:
            container = client.containers.run(
                self.base, ["sh", "-c", f"mkdir -p {LOCAL} && exec sleep infinity"],
                detach=True, network_mode="none", pid_mode="host",
                hostname=f"node-{node.index}", name=node.namespace,
                mounts=[Mount(str(p), str(p), type="bind") for p in self.shared])
            container.reload()
        except Exception as exc:  # noqa: BLE001 - docker's errors, as one line
            raise CannotJudge(f"node {node.index}'s container could not start: {exc}") from None
        finally:
            client.close()
        self.containers[node.index] = container
        pid = int(container.attrs["State"]["Pid"])
        netns._ip("netns", "attach", node.namespace, str(pid))  # partitions find it by name
        groups = tuple(str(g) for g in folders.container_groups(self.engine.engine_id,
                                                                 container.id))
        entered = ContainerNode(node.index, node.namespace, node.address, node.host_link, pid,
                                str(self.workdir), groups)
        self.nodes[node.index] = entered
        # the node's MAC address is its own whatever container it runs in: the other nodes'
        # neighbour tables, which held the old one for up to 45 s, stay right after a
        # replacement (seen: a new node 0, the store's host, unreachable for a relaunch)
        self._plug(entered, self._mac(node.index))

    def _mac(self, index: int) -> str:
        """Locally administered (02:), from the run's tag and the node's index."""
        tag = self.bridge[-6:]
        return f"02:77:{tag[0:2]}:{tag[2:4]}:{tag[4:6]}:{index:02x}"

    def pause(self, index: int) -> Path:
        """`docker pause` the node's container; returns its freezer cgroup, frozen."""
        container = self.containers[index]
        container.pause()  # type: ignore[attr-defined]
        return self.freezer_group(index)

    def unpause(self, index: int) -> None:
        """Let the node run again (a container that is not paused, or gone, is fine)."""
        container = self.containers.get(index)
        if container is None:
            return
        try:
            container.reload()  # type: ignore[attr-defined]
            if container.attrs["State"]["Paused"]:  # type: ignore[attr-defined]
                container.unpause()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - gone, or the engine stopping: thaw it by hand
            freezer.thaw(self.freezer_group(index))

    def is_paused(self, index: int) -> bool:
        """Docker's word that the node's container is paused."""
        container = self.containers[index]
        container.reload()  # type: ignore[attr-defined]
        return bool(container.attrs["State"]["Paused"])  # type: ignore[attr-defined]

    def freezer_group(self, index: int) -> Path:
        node = self.nodes[index]
        assert isinstance(node, ContainerNode)
        # the v1 freezer where there is one: a hybrid machine's unified hierarchy also
        # has cgroup.freeze, but docker pauses through the freezer controller's
        groups = sorted((Path(g) for g in node.groups if freezer.is_group(Path(g))),
                        key=lambda g: not (g / "freezer.state").exists())
        return groups[0]

    def replace(self, index: int) -> None:
        """The node is a new machine: a new container, an empty disk, the same address."""
        node = self.nodes[index]
        self._unplug(node)
        container = self.containers.pop(index, None)
        if container is not None:
            container.remove(force=True)  # type: ignore[attr-defined]
        self._add(node)

    def close(self) -> None:
        """Every container with its disk, the engine, then the bridge and links."""
        if self.engine is not None:
            self.engine.stop()
            self.containers.clear()
        super().close()
