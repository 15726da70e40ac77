"""Containers of an engine: the networks a run makes for them, and the capabilities
the faults need instead of `--privileged`.

A fault inside a container needs what it needs on the host, named: network namespaces
and nftables rules need CAP_NET_ADMIN and CAP_SYS_ADMIN (`ip netns add` bind-mounts the
namespace), the fault filesystem needs `/dev/fuse` and CAP_SYS_ADMIN, a hung rank's
stacks need CAP_SYS_PTRACE. `--privileged` asks for every capability, and a sandbox
whose bounding set lacks one (this machine kind: CAP_SYS_RESOURCE) refuses to start the
container at all; a capability the machine lacks is refused here, before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchchaos.errors import CannotJudge, Unavailable, UsageError
from torchchaos.host import netns
from torchchaos.host.docker.engine import Engine

FAULT_CAPABILITIES = ("NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE")
FAULT_DEVICES = ("/dev/fuse",)
# linux/capability.h, by number
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
    "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN",
    "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE",
    "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME",
    "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ",
    "PERFMON", "BPF", "CHECKPOINT_RESTORE")


def bounding_set(status: Path = Path("/proc/self/status")) -> int:
    """The capabilities any process of this machine (so any container) can ever have."""
    for line in status.read_text().splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16)
    return 0


def refuse_missing(capabilities: Sequence[str], bounding: int | None = None) -> None:
    """One clear error (exit 2) for a capability unknown, or one this machine never grants."""
    bounding = bounding_set() if bounding is None else bounding
    for name in capabilities:
        bare = name.upper().removeprefix("CAP_")
        if bare not in CAPABILITIES:
            raise UsageError(f"no capability {name!r} (Linux names them as in"
                             " `man 7 capabilities`, e.g. NET_ADMIN)")
        if not bounding >> CAPABILITIES.index(bare) & 1:
            raise Unavailable(f"this machine does not grant CAP_{bare} (its bounding set"
                              f" lacks it), so no container here can have it")


def network(engine: Engine, index: int = 0) -> str:
    """A bridge network of the engine's own, its bridge named as a run's network is (so
    that the lifeline finds it if the engine's harness dies): its name."""
    name = f"{netns.PREFIX}b{engine.engine_id[:8]}n{index}"
    client = engine.client(timeout=30)
    try:
        client.networks.create(name, driver="bridge", check_duplicate=True,
                               options={"com.docker.network.bridge.name": name})
    except Exception as exc:  # noqa: BLE001 - docker's errors, as one line
        raise CannotJudge(f"the engine could not make the network {name}: {exc}") from None
    finally:
        client.close()
    return name


def run(engine: Engine, image: str, command: Sequence[str], *, network_name: str = "none",
        capabilities: Sequence[str] = FAULT_CAPABILITIES,
        devices: Sequence[str] = FAULT_DEVICES, environment: Mapping[str, str] | None = None,
        volumes: Mapping[str, str] | None = None, name: str | None = None,
        hostname: str | None = None, detach: bool = False, timeout: float = 600.0) -> Any:
    """Run `command` in a new container of `image` with the named capabilities and devices.

    Detached: the container (the caller removes it, or the engine's stop does). Else: wait
    for it, remove it, and return (exit status, its output)."""
    refuse_missing(capabilities)
    for device in devices:
        if not Path(device).exists():
            raise Unavailable(f"this machine has no {device} to give the container")
    import docker

    client = engine.client(timeout=timeout)
    try:
        try:
            container = client.containers.run(
                image, list(command), detach=True, network=network_name,
                cap_add=list(capabilities), devices=[f"{d}:{d}:rwm" for d in devices],
                environment=dict(environment or {}), name=name, hostname=hostname,
                volumes={host: {"bind": inside, "mode": "rw"}
                         for host, inside in (volumes or {}).items()})
        except docker.errors.DockerException as exc:
            raise CannotJudge(f"a container of {image} could not start: {exc}") from None
        if detach:
            return container
        try:
            status = container.wait(timeout=timeout)["StatusCode"]
            return status, container.logs().decode(errors="replace")
        finally:
            container.remove(force=True)
    finally:
        client.close()
