"""The Docker engine on this machine: Debian's dockerd, started and stopped by the
project, the image built from the repository without a registry, and the faults run
inside a container with named capabilities (never --privileged).

The image is built once for the module (about 45 s for the Debian base, cached, and
45 s for the image); the module's tests share one worker (`--dist loadgroup`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from torchchaos import env
from torchchaos.errors import CannotJudge, Unavailable, UsageError
from torchchaos.host import engine_folders as folders
from torchchaos.host import lifeline, netns, procs
from torchchaos.host.docker import containers, images
from torchchaos.host.docker import engine as engine_module
from torchchaos.host.docker.engine import Engine

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group("docker-engine")


NO_ENGINE = engine_module.unavailable_reason() or ("" if shutil.which("docker-compose") else
                              "docker-compose not found (apt-get install -y docker-compose)")
# in CI the engine is installed by the set-up: a missing one fails there, never skips
needs_engine = pytest.mark.skipif(bool(NO_ENGINE) and not os.environ.get("CI"),
                                  reason=NO_ENGINE or "ok")


@pytest.fixture(scope="module")
def built():
    """One engine with the project's image, for the module."""
    with Engine.start() as engine:
        base = images.base_image(engine)
        yield engine, images.build_image(engine, REPO, base)


def _nothing_left_of(engine: Engine, pids: list[int], bridge: str) -> list[str]:
    left = [f"process {p}" for p in pids if procs.pid_alive(p)]
    left += [f"mount {m}" for m in folders.mounts_under(engine.root)]
    left += [f"cgroup of {engine.engine_id}"] if folders.container_pids(engine.engine_id) \
        or folders._groups(engine.engine_id) else []
    left += [f"link {bridge}"] if any(bridge in item for item in netns.leftovers()) else []
    left += [f"folder {engine.root}"] if engine.root.exists() else []
    return left


@needs_engine
def test_the_faults_run_inside_the_image_with_named_capabilities(built) -> None:
    """Namespaces, nftables and FUSE inside a container of the image: the suite's own tests
    of them, run there, pass with none skipped."""
    engine, image = built
    status, output = containers.run(
        engine, image, ["python", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "tests/host/test_netns.py", "tests/faults/test_faultfs.py"])
    tail = output[-3000:]
    assert status == 0, tail
    assert " passed" in tail and "skipped" not in tail, tail


@needs_engine
def test_the_battery_and_a_partition_pass_inside_a_container(built) -> None:
    """The main job, in the container on a network of the run's own: the battery against
    the bundled target (kills, a torn write, a power loss through FUSE, ...), then a
    partition between two namespace nodes inside the container."""
    engine, image = built
    network = containers.network(engine)
    status, output = containers.run(
        engine, image, ["sh", "-c", "torchchaos battery --quiet && torchchaos run --quiet"
                        " --nodes 2 --network netns --fault partition:node=1,step=6,for=4"
                        " -- targets/ddp_lm.py --steps 12 --ckpt-every 4"],
        network_name=network)
    assert status == 0, output[-3000:]  # the battery and the run: exit 0 is every PASS
    battery = [line for line in output.splitlines() if line.rstrip().endswith(" PASS")]
    assert len(battery) == 9, output[-3000:]


@needs_engine
def test_the_compose_cpu_service_builds_and_runs_with_named_capabilities(built) -> None:
    """docker-compose.yml as users run it (Debian's docker-compose), on the base made here
    and a staged context: the CPU service builds and its container runs the namespace
    tests; the GPU service's file is read here and built in the test below."""
    engine, _ = built
    base = images.base_image(engine)
    project = ["docker-compose", "--ansi", "never", "-f", str(REPO / "docker-compose.yml"), "-p",
               f"tc{engine.engine_id[:8]}"]
    with images.staged_context(engine, REPO, base) as context:
        environ = {**os.environ, **engine.env(), "TORCHCHAOS_CONTEXT": str(context),
                   "TORCHCHAOS_BASE": base, "TORCHCHAOS_BUILD_NETWORK": "none"}
        config = subprocess.run([*project, "config"], capture_output=True, text=True,
                                env=environ, timeout=60)
        assert config.returncode == 0, config.stderr
        assert "privileged" not in config.stdout and "trainer:" in config.stdout
        built_service = subprocess.run([*project, "build", "torchchaos"], capture_output=True,
                                       text=True, env=environ, timeout=900)
        assert built_service.returncode == 0, built_service.stdout[-2000:] + \
            built_service.stderr[-2000:]
        ran = subprocess.run([*project, "run", "--rm", "--no-deps", "torchchaos", "python",
                              "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                              "tests/host/test_netns.py"], capture_output=True, text=True,
                             env=environ, timeout=600)
    tail = ran.stdout[-3000:] + ran.stderr[-2000:]
    assert ran.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail, tail


@needs_engine
def test_the_gpu_image_builds_on_the_same_base(built) -> None:
    """Dockerfile.gpu, the nightly GPU runner's, built here on the Debian base with the
    wheels staged: its steps are checked. Staged here is torch's CPU wheel (the CUDA one
    is GBs this machine has not got), and it runs nothing: it needs a GPU."""
    engine, _ = built
    tag = images.build_image(engine, REPO, images.base_image(engine),
                             dockerfile="Dockerfile.gpu")
    client = engine.client()
    try:
        config = client.images.get(tag).attrs["Config"]
    finally:
        client.close()
    assert "NVIDIA_VISIBLE_DEVICES=all" in config["Env"]
    assert config["Cmd"] == ["torchchaos", "battery"]


@needs_engine
def test_a_stopped_engine_leaves_no_process_mount_cgroup_network_or_folder() -> None:
    engine = Engine.start()
    base = images.base_image(engine)
    bridge = containers.network(engine)
    sleeper = containers.run(engine, base, ["sleep", "300"], network_name=bridge,
                             detach=True)
    assert sleeper.reload() is None and sleeper.status == "running"
    pids = engine.pids()
    assert folders.container_pids(engine.engine_id)  # the sleeper, found by its cgroup
    assert engine.stop() == []
    assert _nothing_left_of(engine, pids, bridge) == []


@needs_engine
@pytest.mark.parametrize("state", ["running", "paused"])
def test_a_killed_harness_leaves_no_engine(tmp_path: Path, state: str) -> None:
    """SIGKILL the harness while a container runs: its lifeline kills the daemon, its
    containerd, the shim and the container's processes (found by the engine's cgroup: they
    carry no mark), and the sweep removes the layers' mounts, the cgroups, the network's
    bridge and the folder. Paused (a frozen node), its processes die only once thawed:
    the watcher thaws first."""
    starter = tmp_path / "starter.py"
    starter.write_text(textwrap.dedent(f"""
        import time
        from torchchaos.host import engine_folders as folders
        from torchchaos.host.docker import containers, images
        from torchchaos.host.docker.engine import Engine
        engine = Engine.start()
        bridge = containers.network(engine)
        sleeper = containers.run(engine, images.base_image(engine), ["sleep", "300"],
                                 network_name=bridge, detach=True)
        while not folders.container_pids(engine.engine_id):
            time.sleep(0.1)
        if {state!r} == "paused":
            sleeper.pause()
        print(engine.engine_id, engine.root, bridge, *engine.pids(), flush=True)
        time.sleep(600)
    """))
    harness = subprocess.Popen([sys.executable, str(starter)], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        engine_id, root, bridge, *pids = harness.stdout.readline().split()
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
    engine = Engine(Path(root), engine_id, owned=True)
    deadline = time.monotonic() + 60  # the watcher: SIGKILLs, then unmounts and removes
    while _nothing_left_of(engine, [int(p) for p in pids], bridge) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    lifeline.sweep_stale(lambda _: None)
    assert _nothing_left_of(engine, [int(p) for p in pids], bridge) == []


def test_a_machine_without_the_engine_is_one_clear_error(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    done = subprocess.run([str(bare / "python"), "-m", "torchchaos.cli", "docker", "up",
                           "--dir", str(tmp_path / "d")], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(bare)}, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert "no Docker engine here: dockerd" in done.stderr and "docker.io" in done.stderr
    assert not (tmp_path / "d").exists()


@needs_engine
def test_a_daemon_that_cannot_start_is_one_clear_error_and_leaves_nothing(
        tmp_path: Path) -> None:
    """dockerd refuses a setting it does not know: its own words, and nothing left."""
    root = Path(tempfile.mkdtemp(prefix="tce-")) / "engine"
    before = _engine_processes()  # the module's engine may run meanwhile
    with pytest.raises(CannotJudge, match="dockerd exited with status 1 while starting:"
                       ".*no-such-option"):
        Engine.start(root, settings={"no-such-option": True})
    assert not root.exists()
    root.parent.rmdir()
    assert _engine_processes() <= before


def _engine_processes() -> set[int]:
    return {pid for pid in procs.env_values((env.ENGINE,)) if procs.pid_alive(pid)}


@needs_engine
def test_an_image_that_cannot_be_built_is_one_clear_error(built) -> None:
    engine, _ = built
    with pytest.raises(CannotJudge, match="could not be built|no Python 3"):
        images.build_image(engine, REPO, "torchchaos-no-such-base:1")
    assert not list(engine.root.glob("context-*"))  # the staged context went with it


def test_a_capability_the_machine_refuses_is_named_before_anything_runs() -> None:
    without_sys_resource = (1 << 41) - 1 & ~(1 << 24)
    with pytest.raises(Unavailable, match="does not grant CAP_SYS_RESOURCE"):
        containers.refuse_missing(["NET_ADMIN", "SYS_RESOURCE"], without_sys_resource)
    with pytest.raises(UsageError, match="no capability 'NET_ADMINS'"):
        containers.refuse_missing(["NET_ADMINS"], without_sys_resource)
    containers.refuse_missing(containers.FAULT_CAPABILITIES, without_sys_resource)


@needs_engine
def test_the_command_line_starts_and_stops_an_engine(tmp_path: Path) -> None:
    """In a short folder of its own (a socket's path has 107 bytes; tmp_path's, under
    pytest -n, leaves too little room: refused, as the last line checks)."""
    root = Path(tempfile.mkdtemp(prefix="tce-")) / "engine"

    def cli(*words: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "torchchaos.cli", "docker", *words,
                               "--dir", str(root)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})

    up = cli("up")
    try:
        assert up.returncode == 0, up.stderr
        assert f"export DOCKER_HOST=unix://{root}/docker.sock" in up.stdout
        assert cli("up").returncode == 2  # one is up there already
        assert cli("status").stdout.strip() == "dockerd answers"
    finally:
        down = cli("down")  # the user's engine: no lifeline takes it
    assert down.returncode == 0 and not root.exists(), down.stdout + down.stderr
    assert cli("status").returncode == 2  # no engine there now
    root.parent.rmdir()
    deep = tmp_path / ("deep-" * 12) / "engine"
    refused = subprocess.run([sys.executable, "-m", "torchchaos.cli", "docker", "up", "--dir",
                              str(deep)], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert refused.returncode == 2 and "must be short" in refused.stderr, refused.stderr
    assert not deep.exists()


def test_this_module_runs_on_one_worker(request: pytest.FixtureRequest) -> None:
    """Its engine fixture, and the container nodes' e2e tests, need one worker in a row
    (`--dist loadgroup`): under pytest 9.2 xdist ignored every group without a word
    (pytest-xdist#1386), and the module built its image three times in CI."""
    if request.config.getoption("dist", "no") == "loadgroup" \
            and os.environ.get("PYTEST_XDIST_WORKER"):
        assert request.node.nodeid.endswith("@docker-engine"), request.node.nodeid
