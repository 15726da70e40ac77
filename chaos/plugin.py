"""pytest plugin: declare a chaos scenario in a few lines, get a judged report.

    @pytest.mark.chaos(script="train.py", faults=["kill:rank=1,step=30"])
    def test_survives_kill(chaos_report):
        assert chaos_report.restarts == 1

    def test_buggy_resume_is_caught(chaos_run):
        report = chaos_run("train.py", faults=["kill:rank=1,step=30"], expect="fail")
        assert report.checks["deterministic_resume"]["ok"] is False

A run whose verdict differs from `expect` (default "pass" for the marker,
nothing for `chaos_run`) fails the test with the verdict table and the run
directory. Runs live under `--chaos-dir` (default: pytest's temporary
directory). Fault-free reference runs are cached where the command line
caches them (`$XDG_CACHE_HOME/torchchaos`, else `~/.cache/torchchaos`), so a
second session, and every pytest-xdist worker, reuses them (the cache locks
each entry while one is made); `--chaos-cache-dir` puts the cache elsewhere.
A project's own tests that must not touch the user's cache point
`XDG_CACHE_HOME` at a temporary folder for the session (this repository's
tests/conftest.py does) or pass `--chaos-cache-dir`.

Also: the ready-made suites (`pytest --pyargs torchchaos.suites`, the `chaos_suite`
fixture, configured by `[tool.torchchaos]` in pyproject.toml or by
`--chaos-script` / `--chaos-args` / ...); `*.chaos.yaml` scenario files
collected as tests, or exactly the files given with `--chaos-replay`; every
run's verdict, checks, run directory and replay command as JUnit XML
properties; and one table of every run at the end of the session.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from torchchaos import env
from torchchaos.errors import ChaosError, Unavailable
from torchchaos.report.report_file import MARK, Report

if TYPE_CHECKING:
    from torchchaos.explore.suite import Plan
    from torchchaos.scenario.model import Scenario

_FAILURE_KEY = pytest.StashKey[str]()  # why a marked test fails before its body runs
_SUITE_KEY = pytest.StashKey["Scenario"]()  # the job the suites test

SUITES_DIR = env.package_dir("torchchaos.suites")
SUITE_MARKERS = {
    "chaos_kills": "kills of ranks and nodes, also inside a checkpoint save",
    "chaos_storage": "power loss, torn writes, ENOSPC, bit rot (the fault filesystem)",
    "chaos_sdc": "bit flips and NaNs: silent data corruption",
    "chaos_hangs": "stopped and stuck ranks, stragglers",
    "chaos_partitions": "network partitions between simulated nodes",
}
SCENARIO_SUFFIXES = (".chaos.yaml", ".chaos.yml")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchchaos", "chaos runs of distributed training")
    group.addoption("--chaos-seed", type=int, default=None,
                    help="seed for symbolic fault targets (default 0, or the suites' seed)")
    group.addoption("--chaos-dir", default=None,
                    help="where run directories are kept (default: pytest's tmp dir)")
    group.addoption("--chaos-cache-dir", default=None, metavar="DIR",
                    help="cache of fault-free reference runs, kept across sessions and"
                         " shared by xdist workers (default: the command line's,"
                         " $XDG_CACHE_HOME/torchchaos or ~/.cache/torchchaos; tests that"
                         " must leave the user's cache alone pass a folder of their own,"
                         " or set XDG_CACHE_HOME)")
    group.addoption("--chaos-timeout", type=float, default=None,
                    help="deadline per run in seconds (default: the scenario's, 300)")
    group.addoption("--chaos-hang-timeout", type=float, default=None,
                    help="seconds without progress on any rank before the harness declares"
                         " a hang (default: the scenario's; else 10, or 3x the longest the"
                         " reference went without progress)")
    group.addoption("--chaos-replay", action="append", default=[], metavar="FILE",
                    help="run exactly these scenario files (a run's replay.yaml, an"
                         " incident's .chaos.yaml) instead of the collected tests")
    group.addoption("--chaos-script", default=None, metavar="PATH",
                    help="the training script the suites (and replays) run (default:"
                         " script in [tool.torchchaos], else the bundled reference target)")
    group.addoption("--chaos-args", default=None, metavar="ARGS",
                    help="its arguments, one string split like a shell's: \"--steps 40\"")
    group.addoption("--chaos-link", action="append", default=None, metavar="PATH",
                    help="suites: show PATH in every run directory under its own name"
                         " (repeatable; overrides links in [tool.torchchaos])")
    for name, kind, what in (("nproc", int, "ranks per node"),
                             ("nodes", int, "simulated nodes"),
                             ("max-lost-steps", int, "steps a failure may cost"),
                             ("max-lost-seconds", float, "seconds a failure may cost")):
        group.addoption(f"--chaos-{name}", type=kind, default=None,
                        help=f"suites: {what} (overrides [tool.torchchaos])")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos(script, faults=[...], expect='pass', **scenario):"
                            " run a torchchaos scenario; the chaos_report fixture holds it")
    for name, what in SUITE_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: torchchaos suite: {what}")
    config.addinivalue_line("markers", "chaos_replay: a torchchaos scenario file run as a test")
    config.pluginmanager.register(_Verdicts(), "torchchaos-verdicts")
    try:
        config.stash[_SUITE_KEY] = _suite_scenario(config)
    except ChaosError as exc:
        raise pytest.UsageError(f"torchchaos: {exc}") from None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before any test: remove what dead harnesses left on this machine (an earlier
    session killed by a CI timeout, say), never what a live harness owns."""
    from torchchaos.host import lifeline

    if os.environ.get(lifeline.OFF_ENV) == "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def say(message: str) -> None:
        if reporter is not None:
            reporter.write_line(f"torchchaos: {message}")

    try:
        lifeline.sweep_stale(say)
    except OSError as exc:  # a session that runs no chaos must not fail on this
        say(f"could not look for leftovers of dead harnesses: {exc}")


def _pyproject(config: pytest.Config) -> Path:
    if config.inipath is not None and config.inipath.name == "pyproject.toml":
        return config.inipath
    return config.rootpath / "pyproject.toml"


def _script_options(config: pytest.Config) -> tuple[str | None, list[str] | None]:
    """--chaos-script (from where pytest started) and --chaos-args, where given."""
    from torchchaos.explore.suiteconfig import split_args

    script, args = config.getoption("--chaos-script"), config.getoption("--chaos-args")
    if script is not None:
        script = str(config.invocation_params.dir / script)
    return script, (split_args(args, "--chaos-args") if args is not None else None)


def _link_options(config: pytest.Config) -> list[str] | None:
    """--chaos-link paths, from where pytest started."""
    links = config.getoption("--chaos-link")
    if links is None:
        return None
    return [os.path.normpath(config.invocation_params.dir / link) for link in links]


def _suite_scenario(config: pytest.Config) -> Scenario:
    from torchchaos.explore import suiteconfig

    pyproject = _pyproject(config)
    script, args = _script_options(config)
    options = {"script": script, "args": args, "seed": config.getoption("--chaos-seed"),
               "timeout": config.getoption("--chaos-timeout"),
               "hang_timeout": config.getoption("--chaos-hang-timeout"),
               "links": _link_options(config),
               **{key: config.getoption(f"--chaos-{key.replace('_', '-')}")
                  for key in ("nproc", "nodes", "max_lost_steps", "max_lost_seconds")}}
    return suiteconfig.base_scenario(suiteconfig.read_table(pyproject), pyproject.parent,
                                     options, f"{suiteconfig.TABLE} in {pyproject}")


def _base_dirs(config: pytest.Config) -> tuple[Path, Path]:
    """Where runs are kept (--chaos-dir, else pytest's temporary folder) and the
    reference cache (--chaos-cache-dir, else the command line's, which persists across
    sessions: one path for every pytest-xdist worker too; the cache locks its entries,
    so each reference is made once)."""
    from torchchaos.harness.reference import default_cache_dir

    runs = config.getoption("--chaos-dir")
    cache = config.getoption("--chaos-cache-dir")
    if runs:
        runs_dir = Path(runs)
    else:  # what the tmp_path_factory fixture returns; replay items have no fixtures
        basetemp = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
        runs_dir = basetemp / "torchchaos-runs"
    cache_dir = Path(cache) if cache else default_cache_dir()
    return runs_dir.resolve(), cache_dir.resolve()


def _new_out_dir(runs_dir: Path, nodeid: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid)[-80:]
    number = 0
    while (runs_dir / f"{stem}-{number}").exists():
        number += 1
    return runs_dir / f"{stem}-{number}"


def _run(item: pytest.Item, scenario: Scenario) -> Report:
    """Run a scenario for this test and record it; raises ChaosError when it cannot
    be judged."""
    from torchchaos.engine import run_scenario

    runs_dir, cache_dir = _base_dirs(item.config)
    out_dir = _new_out_dir(runs_dir, item.nodeid)
    report = run_scenario(scenario, out_dir, cache_dir)
    _record(item, report, out_dir)
    return report


def _record(item: pytest.Item, report: Report, out_dir: Path) -> None:
    """As properties: JUnit XML shows them (`--junitxml`), and the session's table is
    made from them (`_Verdicts`), also when a pytest-xdist worker ran the test."""
    props = [("chaos_verdict", report.verdict), ("chaos_lost", _lost(report))]
    failing = report.failing()  # the cause first: the session's table lists them so
    names = failing + [name for name in report.checks if name not in failing]
    props += [(f"chaos_check_{name}", MARK[report.checks[name]["ok"]]) for name in names]
    props += [("chaos_run_dir", report.run_dir), ("chaos_report", str(out_dir / "report.json")),
              ("chaos_replay", f"torchchaos replay {report.replay}")]
    item.user_properties.extend(props)


RunFn = Callable[..., Report]


def _runner(request: pytest.FixtureRequest) -> RunFn:
    """Run a scenario for this test; raises ChaosError when it cannot be judged."""
    from torchchaos.scenario.model import Scenario

    config = request.config

    def run(script: str, faults: list[str] | None = None, **kwargs: Any) -> Report:
        seed = config.getoption("--chaos-seed")
        kwargs.setdefault("seed", 0 if seed is None else seed)
        if config.getoption("--chaos-timeout"):
            kwargs["timeout"] = config.getoption("--chaos-timeout")
        if config.getoption("--chaos-hang-timeout"):
            kwargs.setdefault("hang_timeout", config.getoption("--chaos-hang-timeout"))
        return _run(request.node, Scenario.build(str(script), faults=faults, **kwargs))

    return run


def _verdict_failure(report: Report, expect: str) -> str | None:
    if report.verdict == expect:
        return None
    return f"expected verdict {expect!r}, got {report.verdict!r}\n\n{report.table()}"


def _could_not_judge(exc: ChaosError) -> BaseException:
    """The test's failure, one line: `raise _could_not_judge(exc) from None` (without
    `from None`, pytest shows the ChaosError it was handling too); a skip where this
    machine cannot have what the scenario asks for (a GPU fault without a GPU)."""
    if isinstance(exc, Unavailable):
        return pytest.skip.Exception(f"torchchaos: {exc}")
    return pytest.fail.Exception(f"torchchaos could not judge: {exc}", pytrace=False)


@pytest.fixture
def chaos_run(request: pytest.FixtureRequest) -> RunFn:
    """Run a scenario: chaos_run(script, faults=[...], args=[...], expect=None, **scenario)."""
    run = _runner(request)

    def checked(script: str, faults: list[str] | None = None, expect: str | None = None,
                **kwargs: Any) -> Report:
        try:
            report = run(script, faults, **kwargs)
        except ChaosError as exc:
            raise _could_not_judge(exc) from None
        failure = _verdict_failure(report, expect) if expect else None
        if failure:
            pytest.fail(failure, pytrace=False)
        return report

    return checked


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest) -> Report | None:
    """The report of the scenario declared by the test's `chaos` marker.

    The run happens while the fixture is set up; a wrong verdict (or one that
    could not be reached) fails the test itself, before its body runs, so it is
    reported as a failure rather than as a set-up error.
    """
    marker = request.node.get_closest_marker("chaos")
    if marker is None:
        pytest.fail("chaos_report needs @pytest.mark.chaos(script=..., faults=[...])",
                    pytrace=False)
    kwargs = dict(marker.kwargs)
    if marker.args:
        kwargs.setdefault("script", marker.args[0])
    expect = kwargs.pop("expect", "pass")
    try:
        report = _runner(request)(**kwargs)
    except ChaosError as exc:
        request.node.stash[_FAILURE_KEY] = f"torchchaos could not judge: {exc}"
        return None
    failure = _verdict_failure(report, expect)
    if failure:
        request.node.stash[_FAILURE_KEY] = failure
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    failure = item.stash.get(_FAILURE_KEY, None)
    if failure:
        pytest.fail(failure, pytrace=False)


# -- the ready-made suites ---------------------------------------------------------------

@pytest.fixture(scope="session")
def chaos_suite_plan(pytestconfig: pytest.Config) -> Plan:
    """The suites' job and the faults planned from its one fault-free run (explore.suite)."""
    from torchchaos.explore.suite import Plan

    return Plan(pytestconfig.stash[_SUITE_KEY], _base_dirs(pytestconfig)[1])


@pytest.fixture
def chaos_suite(request: pytest.FixtureRequest, chaos_suite_plan: Plan) -> Callable[[str], Report]:
    """chaos_suite(case): run a named case of explore.suite against the configured job and
    fail with the verdict table unless it passes; skip where the case does not apply."""
    from torchchaos.explore.suite import NotApplicable

    def check(case: str) -> Report:
        try:
            report = _run(request.node, chaos_suite_plan.scenario(case))
        except NotApplicable as exc:
            pytest.skip(str(exc))
        except ChaosError as exc:
            raise _could_not_judge(exc) from None
        failure = _verdict_failure(report, "pass")
        if failure:
            pytest.fail(failure, pytrace=False)
        return report

    return check


# -- scenario files as tests -------------------------------------------------------------

@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> bool | None:
    """With --chaos-replay, collect exactly those files (and nothing else)."""
    files = session.config.getoption("--chaos-replay")
    if not files:
        return None
    session.perform_collect(files)
    return True


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    config = parent.config
    replays = {(config.invocation_params.dir / f).resolve()
               for f in config.getoption("--chaos-replay")}
    if file_path.name.endswith(SCENARIO_SUFFIXES) or file_path.resolve() in replays:
        return ScenarioFileTests.from_parent(parent, path=file_path)
    if _suite_module_unmatched(file_path, parent):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def _suite_module_unmatched(file_path: Path, parent: pytest.Collector) -> bool:
    """A suites module that the project's `python_files` would leave out: the suites are
    `test_*.py`, and `pytest --pyargs torchchaos.suites` must run them in any project."""
    if not fnmatch.fnmatch(file_path.name, "test_*.py"):
        return False
    if file_path.parent.resolve() != SUITES_DIR:
        return False
    if parent.session.isinitpath(file_path):
        return False
    patterns = parent.config.getini("python_files")
    return not any(fnmatch.fnmatch(file_path.name if os.sep not in p else str(file_path), p)
                   for p in patterns)


class ScenarioFileTests(pytest.File):
    """A scenario file: one test, named after the file."""

    def collect(self) -> Iterator[pytest.Item]:
        name = self.path.name
        for suffix in (*SCENARIO_SUFFIXES, ".yaml", ".yml", ".json"):
            name = name.removesuffix(suffix)
        yield ScenarioFileItem.from_parent(self, name=name or "replay")


class ScenarioFileItem(pytest.Item):
    """Runs the file's scenario; fails when the report differs from its `expect:`
    (verdict "pass" where it has none)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker("chaos_replay")

    def runtest(self) -> None:
        from torchchaos.scenario import files as scenario_file

        try:
            script, args = _script_options(self.config)
            loaded = scenario_file.load(self.path, script=script, args=args)
            report = _run(self, loaded.scenario)
        except ChaosError as exc:
            raise _could_not_judge(exc) from None
        mismatches = (loaded.expect or scenario_file.Expectation()).mismatches(report)
        if mismatches:
            pytest.fail("\n".join(["not what the file expects:", *mismatches, "",
                                   report.table(), *_reproduction(loaded, report)]),
                        pytrace=False)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"chaos scenario {self.path.name}"


def _reproduction(loaded: Any, report: Report) -> list[str]:
    """For an imported incident: whether the run reproduced it, and its postmortem page."""
    if loaded.incident is None or not report.run_dir:
        return []
    from torchchaos.incident.importing import judge_replay

    line, page = judge_replay(loaded.incident, Path(report.run_dir).parent,
                              loaded.name or loaded.path.name, report.verdict, report.failing())
    return [line, f"postmortem: {page}"]


# -- the session's table -----------------------------------------------------------------

def _lost(report: Report) -> str:
    return ",".join("?" if n is None else str(n) for n in report.lost_steps) or "-"


@dataclass
class _Row:
    """One run of the session's table, rebuilt from a test's properties: under
    pytest-xdist the run happened in a worker, and only the properties travel."""

    nodeid: str
    verdict: str
    lost: str
    failing: list[str]
    out_dir: Path


def _rows(nodeid: str, properties: list[tuple[str, object]]) -> list[_Row]:
    rows: list[_Row] = []
    for name, value in properties:
        if name == "chaos_verdict":  # each run's properties start with it
            rows.append(_Row(nodeid, str(value), "-", [], Path()))
        elif rows and name == "chaos_lost":
            rows[-1].lost = str(value)
        elif rows and name.startswith("chaos_check_") and value == MARK[False]:
            rows[-1].failing.append(name.removeprefix("chaos_check_"))
        elif rows and name == "chaos_report":
            rows[-1].out_dir = Path(str(value)).parent
    return rows


class _Verdicts:
    """The session's table of runs: gathered from every test's last report (in this
    process, or sent by the pytest-xdist worker that ran it), shown at the end."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":  # it carries every property the test recorded
            self.rows += _rows(report.nodeid, report.user_properties)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """One row per run: verdict, steps lost per failure, the test and its failing
        checks, and under the test its run folder; two short columns, so a narrow
        terminal wraps only the long names."""
        if not self.rows:
            return
        terminalreporter.section("torchchaos verdicts")
        roots = {row.out_dir.parent for row in self.rows}
        root = roots.pop() if len(roots) == 1 else None
        where = f" (in {root})" if root is not None else ""
        lines = ["verdict  lost  test  [failing checks]", f"               run folder{where}"]
        for row in self.rows:
            extra = f"  [{', '.join(row.failing)}]" if row.failing else ""
            lines.append(f"{row.verdict.upper():<7}  {row.lost:<4}  {row.nodeid}{extra}")
            lines.append(" " * 15 + (row.out_dir.name if root is not None else str(row.out_dir)))
        for line in lines:
            terminalreporter.write_line(line)
