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
inside their run directory).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from torchchaos import env
from torchchaos.host import leftovers, netns, procs
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


XDG_CACHE_HOME = "XDG_CACHE_HOME"
_XDG_BEFORE = pytest.StashKey[str | None]()


@pytest.hookimpl(trylast=True)  # after pytest's own, which makes the basetemp
def pytest_configure(config: pytest.Config) -> None:
    """XDG_CACHE_HOME into the session's basetemp, so that the plugin's reference cache
    (the command line's default) is the session's: BASETEMP/torchchaos-cache, also
    reached as BASETEMP/xdg-cache/torchchaos. A pytest-xdist worker inherits it from the
    controller (its own basetemp is a folder in the controller's): one cache for all."""
    if hasattr(config, "workerinput"):
        return
    config.stash[_XDG_BEFORE] = os.environ.get(XDG_CACHE_HOME)
    basetemp = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    cache, xdg = basetemp / "torchchaos-cache", basetemp / "xdg-cache"
    cache.mkdir(exist_ok=True)
    xdg.mkdir(exist_ok=True)
    if not (xdg / "torchchaos").exists():
        (xdg / "torchchaos").symlink_to(cache)
    os.environ[XDG_CACHE_HOME] = str(xdg)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _XDG_BEFORE not in config.stash:
        return
    before = config.stash[_XDG_BEFORE]
    if before is None:
        os.environ.pop(XDG_CACHE_HOME, None)
    else:
        os.environ[XDG_CACHE_HOME] = before


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


def chaos_processes(under: Path) -> list[int]:
    """Live processes of torchchaos runs whose run directory is under `under`."""
    return [pid for pid, run_dir in procs.env_values((env.RUN_DIR,)).items()
            if run_dir.startswith(str(under))]


@pytest.fixture(scope="session", autouse=True)
def nothing_leaks(tmp_path_factory: pytest.TempPathFactory):
    tmp = Path(tempfile.gettempdir())
    before = set(os.listdir(tmp))
    networks_before = set(netns.leftovers())
    yield
    networks = sorted(set(netns.leftovers()) - networks_before)
    assert networks == [], f"network namespaces or links of this session survived it: {networks}"
    leaked = chaos_processes(tmp_path_factory.getbasetemp())
    assert leaked == [], f"processes of this session's runs survived it: {leaked}"
    mounts = mounts_under(tmp_path_factory.getbasetemp())
    assert mounts == [], f"mounts of this session's runs survived it: {mounts}"
    stale = [x.describe() for x in leftovers.stale(leftovers.inventory())]
    assert stale == [], f"leftovers no live harness owns (`torchchaos clean` lists): {stale}"
    # torchinductor_<user>: torch's own per-user compile cache, which an import of
    # torch._dynamo (DDP, Lightning) may create in the temp folder; kept across runs
    new = {n for n in set(os.listdir(tmp)) - before
           if not n.startswith(("pytest-of-", "torchinductor_"))}
    assert not new, f"temporary files or folders left outside the run dirs: {sorted(new)}"
