"""The pytest plugin: the marker, the fixtures, the options and the failure message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import TARGET

pytest_plugins = ["pytester"]

STEPS = ["--steps", "12", "--ckpt-every", "5"]


@pytest.mark.chaos(script=str(TARGET), faults=["kill:rank=1,step=7"], args=STEPS)
def test_the_marker_declares_a_scenario(chaos_report):
    assert chaos_report.verdict == "pass"
    assert chaos_report.faults[0]["fired_step"] == 7


@pytest.mark.slow  # tests/explore/test_suites.py's failing case checks the same lines in CI
def test_a_verdict_other_than_expected_fails_with_the_table(pytester, shared_cache):
    runs = pytester.path / "kept-runs"
    # the scenario of test_e2e_kill.py's skip_optim case: its reference run is reused
    args = ["--steps", "20", "--ckpt-every", "5", "--bug", "skip_optim"]
    cache = shared_cache
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.chaos(script={str(TARGET)!r}, faults=["kill:rank=1,step=7"],
                           args={args!r})
        def test_buggy(chaos_report):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--chaos-dir={runs}",
                                           f"--chaos-cache-dir={cache}", "--chaos-seed=3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*expected verdict 'pass', got 'fail'*",
        "*deterministic_resume  FAIL     diverged from the reference at step 6*optimizer*",
        f"*verdict: FAIL   run dir: {runs}*",
        "*torchchaos verdicts*",
        "verdict  lost  test  ?failing checks?",
        f"               run folder (in {runs})",
        "FAIL     2     test_a_verdict_other_than_expected_fails_with_the_table.py::test_buggy"
        "  ?deterministic_resume?",
        "               test_a_verdict_other_than_expected_fails_with_the_table.py_test_buggy-0",
    ])
    assert any(runs.iterdir()), "runs are kept where --chaos-dir says"


def test_bad_scenarios_fail_the_test_with_one_line(pytester):
    pytester.makepyfile("""
        def test_bad(chaos_run):
            chaos_run("train.py", faults=["kill:rank=0"])
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*torchchaos could not judge: *needs exactly one trigger*"])


def test_the_sessions_reference_cache_is_its_own(request, tmp_path_factory, shared_cache):
    """The plugin's default cache is the command line's ($XDG_CACHE_HOME/torchchaos);
    tests/conftest.py points it into the session's temporary folder, never ~/.cache."""
    from torchchaos.plugin import _base_dirs

    assert _base_dirs(request.config)[1] == shared_cache
    assert (Path(os.environ["XDG_CACHE_HOME"]) / "torchchaos").resolve() == shared_cache
    temp = tmp_path_factory.getbasetemp().resolve().parent  # a worker's is in the controller's
    assert shared_cache.is_relative_to(temp)
    assert not shared_cache.is_relative_to(Path.home() / ".cache")


SHORT = ["--steps", "6", "--ckpt-every", "3"]


def test_a_second_session_reuses_the_reference_the_first_one_made(pytester, monkeypatch):
    """Reference runs persist across pytest sessions by default: both sessions judge
    against one cache entry, in $XDG_CACHE_HOME/torchchaos, which the second one finds
    whole and does not make again (its meta.json, written last, is the first one's). The
    runs are fault-free: what they are judged against is the point, not a recovery."""
    xdg = pytester.path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.chaos(script={str(TARGET)!r}, faults=[], args={SHORT!r}, nproc=1)
        def test_fault_free(chaos_report):
            print("reference dir:", chaos_report.reference_dir)
    """)
    first = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    first.assert_outcomes(passed=1)
    (entry,) = (xdg / "torchchaos").glob("ref-*/")
    made = (entry / "meta.json").stat()
    second = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    second.assert_outcomes(passed=1)
    again = (entry / "meta.json").stat()
    assert (again.st_ino, again.st_mtime_ns) == (made.st_ino, made.st_mtime_ns)
    for result in (first, second):
        result.stdout.fnmatch_lines([f"*reference dir: {entry.resolve()}*"])
    assert [p.name for p in (xdg / "torchchaos").glob("ref-*/")] == [entry.name]
