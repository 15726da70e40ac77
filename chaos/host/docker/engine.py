"""A Docker engine on this machine, started and stopped by torchchaos.

`Engine.start()` runs Debian's `dockerd` with everything of its own in one folder
(images, containers, its containerd's state, its socket) and returns once the daemon
answers; `stop()` removes every container, stops the daemon and removes the folder,
leaving no process, mount, cgroup or network behind. The machine's own Docker, if it
has one, is never touched: this daemon listens only on its folder's socket.

What the daemon may change on the machine is switched off: no default bridge (`docker0`)
and no iptables rules (Docker's FORWARD policy DROP would cut the simulated nodes'
bridges). Containers get the networks a run makes for them, and nothing else. Every
container runs under the engine's own cgroup, so that a harness killed mid-run leaves
nothing its lifeline cannot find: an owned engine (the tests', the chaos runs') carries
the run id mark and is registered with the lifeline before the daemon starts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchchaos import env
from torchchaos.errors import Unavailable, UsageError
from torchchaos.host import engine_folders as folders
from torchchaos.host import lifeline, procs
from torchchaos.host.slurm import daemons

PROGRAMS = ("dockerd", "containerd", "runc")
INSTALL = "apt-get install -y docker.io"
RECORD = "engine.json"  # in the folder: what `torchchaos docker down` needs
STOP_SECONDS = 15.0  # for the daemon to stop its containers and unmount their layers
# exec/libnetwork/<12 hex>.sock, with room to spare: a Unix socket's path has 107 bytes
LONGEST_SOCKET_UNDER_ROOT = 40
SOCKET_PATH_MAX = 107


def unavailable_reason() -> str:
    """Why an engine of torchchaos's own cannot run here, or "" if it can."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"no Docker engine here: {', '.join(missing)} not found ({INSTALL})"
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker package is not installed (pip install docker)"
    if os.geteuid() != 0:
        return "a Docker engine of torchchaos's own needs root"
    return ""


def need() -> None:
    """Refuse (exit 2) where the engine or the docker package is not installed."""
    reason = unavailable_reason()
    if reason:
        raise Unavailable(reason)


@dataclass
class Engine:
    root: Path
    engine_id: str
    owned: bool
    process: subprocess.Popen | None = None  # dockerd
    containerd: subprocess.Popen | None = None

    @classmethod
    def start(cls, root: Path | None = None, owned: bool = True, timeout: float = 60.0,
              settings: dict[str, Any] | None = None) -> Engine:
        """A daemon that answers; on any failure nothing of it is left. `settings`: more of
        daemon.json's (a registry mirror, say); the machine's own daemon.json is not read."""
        need()
        engine_id = uuid.uuid4().hex[:12]
        root = (root if root is not None else folders.owned_root(engine_id)).absolute()
        _check_root(root)
        if owned:
            lifeline.own(engine_id, root)  # before anything of it exists
        engine = cls(root, engine_id, owned)
        try:
            engine._boot(timeout, settings or {})
        except BaseException:
            engine.stop()
            raise
        return engine

    @classmethod
    def of(cls, root: Path) -> Engine:
        """The engine `torchchaos docker up` started in `root`."""
        try:
            record = json.loads((root / RECORD).read_text())
        except (OSError, ValueError):
            raise UsageError(f"{root} holds no Docker engine (no readable {RECORD})") from None
        return cls(root.absolute(), record["id"], owned=False)

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def log(self) -> Path:
        return self.root / "dockerd.log"

    def env(self) -> dict[str, str]:
        """What a client (`docker`, the docker package) needs to talk to this engine."""
        return {"DOCKER_HOST": f"unix://{self.socket}"}

    def client(self, timeout: float = 120.0) -> Any:
        """A `docker.DockerClient` of this engine."""
        import docker

        return docker.DockerClient(base_url=f"unix://{self.socket}", timeout=timeout)

    def marks(self) -> dict[str, str]:
        marks = {env.ENGINE: self.engine_id, **lifeline.lock_env()}
        if self.owned:
            marks[env.RUN_ID] = self.engine_id
        return marks

    def _boot(self, timeout: float, settings: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._start_containerd(timeout)
        config = self.root / "daemon.json"  # not the machine's /etc/docker/daemon.json
        config.write_text(json.dumps(settings) + "\n")
        self.process = daemons.start(
            ["dockerd", "--config-file", str(config), "--host", f"unix://{self.socket}",
             "--containerd", str(self.containerd_socket),
             "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "--pidfile", str(self.root / "dockerd.pid"), "--bridge", "none",
             "--iptables=false", "--ip6tables=false",
             "--cgroup-parent", folders.cgroup_parent(self.engine_id)],
            self.log, self.marks())
        daemons.wait_until(self.answers, "dockerd", self.process, self.log, timeout)
        (self.root / RECORD).write_text(json.dumps({"id": self.engine_id}))

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    def _start_containerd(self, timeout: float) -> None:
        """containerd of the engine's own, waited for as long as `timeout`: dockerd gives
        the one it starts itself a few seconds, which a loaded machine exceeds ("timeout
        waiting for containerd to start", seen in CI)."""
        folder = self.root / "containerd"
        config = self.root / "containerd.toml"  # not the machine's /etc/containerd
        config.write_text("\n".join([
            "version = 2", f'root = "{folder / "root"}"', f'state = "{folder / "state"}"',
            # the Kubernetes plugin would set up networking of its own
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
            "[grpc]", f'  address = "{self.containerd_socket}"',
            "[ttrpc]", '  address = ""', "[debug]", '  address = ""', "[metrics]",
            '  address = ""', ""]))
        log = self.root / "containerd.log"
        self.containerd = daemons.start(["containerd", "--config", str(config)], log,
                                        self.marks())
        daemons.wait_until(self.containerd_socket.exists, "containerd", self.containerd, log,
                           timeout)

    def answers(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            client = self.client(timeout=5)
        except Exception:  # noqa: BLE001 - any failure to answer is "not yet"
            return False
        try:
            return bool(client.ping())
        except Exception:  # noqa: BLE001
            return False
        finally:
            client.close()

    def pids(self) -> list[int]:
        """Every process of the engine: the daemon, its containerd and shims, and
        everything in its containers."""
        marked = [pid for pid, value in procs.env_values((env.ENGINE,)).items()
                  if value == self.engine_id]
        found = set(marked) | set(folders.container_pids(self.engine_id))
        return sorted(set(procs.tree(sorted(found))))

    def stop(self) -> list[str]:
        """Remove every container, stop the daemon, then take away whatever is left of it
        (processes, mounts, cgroups, the folder). Returns what could not be removed."""
        if self.answers():
            self._remove_containers()
        for daemon in (self._daemon_pid(), self._containerd_pid()):  # in that order
            if daemon is not None:
                procs.signal_all([daemon], signal.SIGTERM)
                _wait_gone(daemon, STOP_SECONDS)
        _, survivors = procs.kill_until_gone(self.pids, 10.0)
        for process in (self.process, self.containerd):
            if process is not None:
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        failures = [f"processes {survivors} survived SIGKILL"] if survivors else []
        return failures + folders.remove(self.root, self.engine_id)

    def _remove_containers(self) -> None:
        client = self.client(timeout=30)
        try:
            for container in client.containers.list(all=True):
                container.remove(force=True)
            for network in client.networks.list():
                if network.name not in ("bridge", "host", "none"):
                    network.remove()
        except Exception:  # noqa: BLE001 - the kill below takes what this could not
            pass
        finally:
            client.close()

    def _daemon_pid(self) -> int | None:
        if self.process is not None:
            return self.process.pid if self.process.poll() is None else None
        try:
            pid = int((self.root / "dockerd.pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if procs.pid_alive(pid) else None

    def _containerd_pid(self) -> int | None:
        if self.containerd is not None:
            return self.containerd.pid if self.containerd.poll() is None else None
        return next((pid for pid in self.pids()
                     if Path(f"/proc/{pid}/exe").resolve().name == "containerd"), None)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _check_root(root: Path) -> None:
    if len(str(root).encode()) + LONGEST_SOCKET_UNDER_ROOT > SOCKET_PATH_MAX:
        raise UsageError(f"an engine's folder must be short (its sockets live in it, and a"
                         f" socket path has {SOCKET_PATH_MAX} bytes at most): {root}")
    if (root / RECORD).exists():
        raise UsageError(f"a Docker engine is up in {root} already (`torchchaos docker down"
                         f" --dir {root}` stops it)")
    if root.exists() and any(root.iterdir()):
        raise UsageError(f"{root} is not empty: an engine starts in a new folder")


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while procs.pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
