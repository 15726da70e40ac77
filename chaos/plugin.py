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
directory); fault-free reference runs are cached for the session, or in
`--chaos-cache-dir` across sessions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chaos.errors import ChaosError
from chaos.report import Report

_RESULTS_KEY = pytest.StashKey[list]()  # (nodeid, report) of every run this session
_FAILURE_KEY = pytest.StashKey[str]()  # why a marked test fails before its body runs


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchchaos", "chaos runs of distributed training")
    group.addoption("--chaos-seed", type=int, default=0,
                    help="seed for symbolic fault targets (default 0)")
    group.addoption("--chaos-dir", default=None,
                    help="where run directories are kept (default: pytest's tmp dir)")
    group.addoption("--chaos-cache-dir", default=None,
                    help="cache of fault-free reference runs (default: one per session)")
    group.addoption("--chaos-timeout", type=float, default=None,
                    help="deadline per run in seconds (default: the scenario's, 300)")
    group.addoption("--chaos-hang-timeout", type=float, default=None,
                    help="seconds without progress on any rank before the harness declares"
                         " a hang (default: the scenario's; else 10, or 3x the longest the"
                         " reference went without progress)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos(script, faults=[...], expect='pass', **scenario):"
                            " run a torchchaos scenario; the chaos_report fixture holds it")
    config.stash[_RESULTS_KEY] = []


def _base_dirs(request: pytest.FixtureRequest) -> tuple[Path, Path]:
    config = request.config
    factory = request.getfixturevalue("tmp_path_factory")
    runs = config.getoption("--chaos-dir")
    cache = config.getoption("--chaos-cache-dir")
    runs_dir = Path(runs) if runs else factory.getbasetemp() / "torchchaos-runs"
    cache_dir = Path(cache) if cache else factory.getbasetemp() / "torchchaos-cache"
    return runs_dir.resolve(), cache_dir.resolve()


def _new_out_dir(runs_dir: Path, nodeid: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid)[-80:]
    number = 0
    while (runs_dir / f"{stem}-{number}").exists():
        number += 1
    return runs_dir / f"{stem}-{number}"


RunFn = Callable[..., Report]


def _runner(request: pytest.FixtureRequest) -> RunFn:
    """Run a scenario for this test; raises ChaosError when it cannot be judged."""
    from chaos.engine import run_scenario
    from chaos.scenario import Scenario

    runs_dir, cache_dir = _base_dirs(request)
    config = request.config

    def run(script: str, faults: list[str] | None = None, **kwargs: Any) -> Report:
        kwargs.setdefault("seed", config.getoption("--chaos-seed"))
        if config.getoption("--chaos-timeout"):
            kwargs["timeout"] = config.getoption("--chaos-timeout")
        if config.getoption("--chaos-hang-timeout"):
            kwargs.setdefault("hang_timeout", config.getoption("--chaos-hang-timeout"))
        scenario = Scenario.build(str(script), faults=faults, **kwargs)
        report = run_scenario(scenario, _new_out_dir(runs_dir, request.node.nodeid), cache_dir)
        config.stash[_RESULTS_KEY].append((request.node.nodeid, report))
        return report

    return run


def _verdict_failure(report: Report, expect: str) -> str | None:
    if report.verdict == expect:
        return None
    return f"expected verdict {expect!r}, got {report.verdict!r}\n\n{report.table()}"


@pytest.fixture
def chaos_run(request: pytest.FixtureRequest) -> RunFn:
    """Run a scenario: chaos_run(script, faults=[...], args=[...], expect=None, **scenario)."""
    run = _runner(request)

    def checked(script: str, faults: list[str] | None = None, expect: str | None = None,
                **kwargs: Any) -> Report:
        try:
            report = run(script, faults, **kwargs)
        except ChaosError as exc:
            pytest.fail(f"torchchaos could not judge: {exc}", pytrace=False)
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


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS_KEY, [])
    if not results:
        return
    terminalreporter.section("torchchaos verdicts")
    for nodeid, report in results:
        failing = [n for n, c in report.checks.items() if c["ok"] is False]
        extra = f" ({', '.join(failing)})" if failing else ""
        terminalreporter.write_line(f"{report.verdict.upper():<5} {nodeid}{extra}")
