"""Shared test set-up: helpers importable, and a session-wide leak check.

The session's reference runs are cached in its temporary folder, never in the
developer's ~/.cache: the plugin (and the command line, and every pytest the tests
start) caches them in $XDG_CACHE_HOME/torchchaos, and XDG_CACHE_HOME points into
the session's basetemp (`shared_cache`) until the session ends.

Every test may start real torchrun jobs; when the session ends, no process
of any torchchaos run may still be alive, no fault filesystem may still be
mounted, no simulated node's network namespace or link may be left, nothing
may be stale (`torchchaos clean` would find nothing), and no
temporary folder may have appeared outside pytest's own (runs keep theirs
inside their run directory). Under pytest-xdist (`-n`) each worker checks its own
runs, and the controller the host once every worker has ended.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings

from torchchaos import env
from torchchaos.host import leftovers, lifeline, netns, procs
from torchchaos.host.mounts import mounts_under

sys.path.insert(0, str(Path(__file__).parent))

# No example database in the checkout, and no deadline: a first example may import torch.
settings.register_profile("torchchaos", database=None, deadline=None)
settings.load_profile("torchchaos")

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "targets" / "ddp_lm.py"
PLAIN = REPO / "tests" / "scripts" / "plain_ddp.py"


def cases(table: dict, slow: frozenset[str] = frozenset()) -> list:
    """Parametrize over a {id: value} table; the ids in `slow` only run with -m slow
    (the default run stays within CI's time budget; these repeat covered paths)."""
    return [pytest.param(*(value if isinstance(value, tuple) else (value,)), id=key,
                         marks=[pytest.mark.slow] if key in slow else [])
            for key, value in table.items()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Under pytest-xdist a test marked `host_exclusive` runs alone on the host: it
    orphans a run on purpose and lists what is left, and every harness that starts
    meanwhile sweeps the orphans of dead harnesses. Other tests share the host: a
    readers-writer lock in the controller's basetemp around each test's set-up, call
    and teardown, with a turnstile that keeps them from starving an exclusive one. The
    exclusive tests run on one worker in a row (`--dist loadgroup`, their xdist_group),
    which keeps the host until the last of them: the others wait for it once."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    exclusive = _exclusive(item)
    if _HOST_TURN.get("exclusive") != exclusive:
        _release_host()
        _take_host(item.config, exclusive)
    yield
    if not (exclusive and nextitem is not None and _exclusive(nextitem)):
        _release_host()


@pytest.fixture(autouse=True)
def _owned_folder(request: pytest.FixtureRequest) -> None:
    """Under pytest-xdist, what a test makes in its folder without a harness (a fault
    filesystem it mounts itself) is this worker's lifeline's: a harness starting in
    another worker sweeps what no live harness owns. Tests that orphan runs on purpose
    run alone and keep theirs unowned."""
    if os.environ.get("PYTEST_XDIST_WORKER") and not _exclusive(request.node):
        lifeline.own(path=str(request.getfixturevalue("tmp_path")))


_HOST_TURN: dict = {}  # this worker's hold on the host: "exclusive", "files"


def _exclusive(item: pytest.Item) -> bool:
    return item.get_closest_marker("host_exclusive") is not None


def _take_host(config: pytest.Config, exclusive: bool) -> None:
    folder = config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]
    turnstile = open(folder / "host-turnstile.lock", "w")  # noqa: SIM115 - held across tests
    host = open(folder / "host.lock", "w")  # noqa: SIM115
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    fcntl.flock(host, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    if not exclusive:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
    _HOST_TURN.update(exclusive=exclusive, files=(turnstile, host))


def _release_host() -> None:
    for file in _HOST_TURN.pop("files", ()):
        file.close()  # its lock goes with it
    _HOST_TURN.clear()


XDG_CACHE_HOME = "XDG_CACHE_HOME"
_BEFORE = pytest.StashKey[dict[str, str | None]]()


def _interruptible() -> None:
    """Ctrl-C as a terminal gives it, whoever started the suite. A shell that starts it
    in the background (`nohup ... &`, a script's `&`) ignores SIGINT, every child inherits
    that, and the tests that interrupt a child (a harness, a mount's owner) would wait
    for an end that never comes. A handler here is reset to the default at each exec."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(trylast=True)  # after pytest's own, which makes the basetemp
def pytest_configure(config: pytest.Config) -> None:
    """XDG_CACHE_HOME into the session's basetemp, so that the plugin's reference cache
    (the command line's default) is the session's: BASETEMP/torchchaos-cache, also
    reached as BASETEMP/xdg-cache/torchchaos. A pytest-xdist worker inherits it from the
    controller (its own basetemp is a folder in the controller's): one cache for all.

    PYTHONPATH, where it is unset, is what the tests give the command lines they start
    (the checkout): a job the suite runs itself and one a command line runs then import
    alike, and the launchers this process lends (`_lent_launchers`) serve both."""
    _interruptible()
    if hasattr(config, "workerinput"):
        return
    config.stash[_BEFORE] = {name: os.environ.get(name)
                             for name in (XDG_CACHE_HOME, "PYTHONPATH")}
    basetemp = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    cache, xdg = basetemp / "torchchaos-cache", basetemp / "xdg-cache"
    cache.mkdir(exist_ok=True)
    xdg.mkdir(exist_ok=True)
    if not (xdg / "torchchaos").exists():
        (xdg / "torchchaos").symlink_to(cache)
    os.environ[XDG_CACHE_HOME] = str(xdg)
    os.environ.setdefault("PYTHONPATH", str(REPO))


def pytest_unconfigure(config: pytest.Config) -> None:
    for name, before in config.stash.get(_BEFORE, {}).items():
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@pytest.fixture(scope="session", autouse=True)
def _lent_launchers(tmp_path_factory: pytest.TempPathFactory):
    """The warm launchers of every harness the tests start (a command line, a pytest) are
    forked from this process's launcher server (`torchchaos.harness.spare.share`), which
    imported torch once, instead of one server per harness that imports it again."""
    from torchchaos.harness import runner, spare

    spare.share(runner.launcher_environment(), tmp_path_factory.getbasetemp())
    yield
    os.environ.pop(env.LAUNCHER_SOCKET, None)


@pytest.fixture
def shared_cache() -> Path:
    """The session's reference-run cache (the plugin's, where the command line's default
    points during the session): CLI tests of a scenario another test runs too reuse its
    reference run instead of making their own."""
    from torchchaos.harness.reference import default_cache_dir

    return default_cache_dir().resolve()


def lifeline_watcher(harness_pid: int) -> int | None:
    """The pid of the lifeline watcher of harness `harness_pid` (its lock file's name,
    `<pid>-<random>.lock`, is on the watcher's command line), if one runs."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        words = proc.info["cmdline"] or []
        if "torchchaos.host.lifeline" in words and any(
                Path(w).name.startswith(f"{harness_pid}-") for w in words):
            return proc.pid
    return None


def signal_and_wait(proc: subprocess.Popen, sig: int, what: str, seconds: float = 60) -> None:
    """Send `sig` and wait for `proc` to end; one that outlives it by `seconds` is killed
    (what it made ends with it, not left for the session) and the test fails."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{what} outlived {signal.Signals(sig).name} by {seconds:g} s"
                             ) from None


def chaos_processes(under: Path) -> list[int]:
    """Live processes of torchchaos runs whose run directory is under `under`."""
    return [pid for pid, run_dir in procs.env_values((env.RUN_DIR,)).items()
            if run_dir.startswith(str(under))]


@pytest.fixture(scope="session", autouse=True)
def nothing_leaks(tmp_path_factory: pytest.TempPathFactory):
    """Every run of this session (of this worker, under pytest-xdist) reaped and
    unmounted; without xdist, the host-wide checks too (`_host_leaks`)."""
    before = None if os.environ.get("PYTEST_XDIST_WORKER") else _host_state()
    yield
    leaked = chaos_processes(tmp_path_factory.getbasetemp())
    assert leaked == [], f"processes of this session's runs survived it: {leaked}"
    mounts = mounts_under(tmp_path_factory.getbasetemp())
    assert mounts == [], f"mounts of this session's runs survived it: {mounts}"
    if before is not None:
        problems = _host_leaks(before)
        assert not problems, "; ".join(problems)


_HOST_BEFORE = pytest.StashKey[tuple[set[str], set[str]]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    if session.config.pluginmanager.hasplugin("dsession"):  # the xdist controller
        session.config.stash[_HOST_BEFORE] = _host_state()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under pytest-xdist the host-wide checks wait for every worker to end: a worker's
    view of the host holds the other workers' live runs."""
    if _HOST_BEFORE not in session.config.stash:
        return
    problems = _host_leaks(session.config.stash[_HOST_BEFORE])
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for problem in problems:
            reporter.write_line(f"LEAK: {problem}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _host_state() -> tuple[set[str], set[str]]:
    return set(os.listdir(tempfile.gettempdir())), set(netns.leftovers())


def _stale_once_watchers_are_done(bound: float = 15.0) -> list[str]:
    """What no live harness owns, once the watchers of harnesses that just ended (the
    xdist workers) had their time to remove their runs and lock files."""
    deadline = time.monotonic() + bound
    while True:
        stale = [x.describe() for x in leftovers.stale(leftovers.inventory())]
        if not stale or time.monotonic() > deadline:
            return stale
        time.sleep(0.5)


def _host_leaks(before: tuple[set[str], set[str]]) -> list[str]:
    """What the session left on the host: networks, leftovers no live harness owns,
    temporary folders outside pytest's own."""
    tmp_before, networks_before = before
    problems = []
    networks = sorted(set(netns.leftovers()) - networks_before)
    if networks:
        problems.append(f"network namespaces or links of this session survived it: {networks}")
    stale = _stale_once_watchers_are_done()
    if stale:
        problems.append(f"leftovers no live harness owns (`torchchaos clean` lists): {stale}")
    # torchinductor_<user>: torch's own per-user compile cache, which an import of
    # torch._dynamo (DDP, Lightning) may create in the temp folder; kept across runs
    new = {n for n in set(os.listdir(tempfile.gettempdir())) - tmp_before
           if not n.startswith(("pytest-of-", "torchinductor_"))}
    if new:
        problems.append(f"temporary files or folders left outside the run dirs: {sorted(new)}")
    return problems
