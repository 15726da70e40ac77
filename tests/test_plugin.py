"""The pytest plugin: the marker, the fixtures, the options and the failure message."""

from __future__ import annotations

import pytest
from conftest import TARGET

pytest_plugins = ["pytester"]

STEPS = ["--steps", "12", "--ckpt-every", "5"]


@pytest.mark.chaos(script=str(TARGET), faults=["kill:rank=1,step=7"], args=STEPS)
def test_the_marker_declares_a_scenario(chaos_report):
    assert chaos_report.verdict == "pass"
    assert chaos_report.faults[0]["fired_step"] == 7


@pytest.mark.slow  # tests/explore/test_suites.py's failing case checks the same lines in CI
def test_a_verdict_other_than_expected_fails_with_the_table(pytester, tmp_path_factory):
    runs = pytester.path / "kept-runs"
    # the scenario of test_e2e_kill.py's skip_optim case: its reference run is reused
    args = ["--steps", "20", "--ckpt-every", "5", "--bug", "skip_optim"]
    cache = tmp_path_factory.getbasetemp() / "torchchaos-cache"
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
