"""End to end on 2 gloo ranks: real torchrun jobs, real kills, real verdicts.

The reference target passes every check under each kill; each planted
recovery bug is caught by the check that exists for it, with the diagnosis
that names it; verdicts repeat run after run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PLAIN, TARGET, cases

from torchchaos.rank.agent import FULL_WINDOW, PARAMS_EVERY
from torchchaos.rundir.history import History

STEPS = ["--steps", "20", "--ckpt-every", "5"]

CORRECT = {
    "kill rank 0": "kill:rank=0,step=12",
    "kill rank 1": "kill:rank=1,step=12",
    "kill node 0": "kill:node=0,step=12",
    "kill during save": "kill:rank=0,phase=checkpoint_save,save=2,event=3",
    "preemption": "kill:rank=0,step=12,signal=SIGTERM,grace=20",
    "segfault": "kill:rank=1,step=12,signal=SIGSEGV",
    "exit 3": "kill:rank=0,step=12,signal=exit,code=3",
}


# the battery (tests/cli/test_cli.py) runs rank, node and in-save kills and a preemption too
@pytest.mark.parametrize("fault", cases(CORRECT, slow=frozenset({
    "kill rank 0", "kill rank 1", "kill node 0", "kill during save", "exit 3", "preemption"})))
def test_reference_target_passes_every_check(chaos_run, fault):
    report = chaos_run(TARGET, faults=[fault], args=STEPS, expect="pass")
    assert all(check["ok"] is not False for check in report.checks.values()), report.table()
    # a kill tests recovery; durability under power loss is the storage faults' job
    decided = {n for n, c in report.checks.items() if c["ok"] is not None}
    assert decided >= {"completes", "atomic_recovery", "deterministic_resume",
                       "bounded_lost_work", "no_orphans"}, report.table()
    assert report.restarts >= 1 and report.faults[0]["fired"]
    if "SIGTERM" in fault:
        assert report.lost_steps == [0], "a preempted run saves before it exits"
    assert_light_only_between_windows(History.of_run(Path(report.run_dir)))


def assert_light_only_between_windows(history: History) -> None:
    """Full fingerprints for 5 steps after each process starts and after a scheduled
    fault's step on every rank; light on the steps between (loss, lr, batch, and the
    parameters every 4th step and at the last)."""
    fault_steps = [e["step"] for e in history.of("fault") if e.get("step") is not None]
    by_process: dict[tuple, list] = {}
    for e in history.steps():
        by_process.setdefault((e["rank"], e["launch"], e["attempt"]), []).append(e)
    for steps in by_process.values():
        for e in steps:
            near_fault = any(s < e["step"] <= s + FULL_WINDOW for s in fault_steps)
            full = e["local"] <= FULL_WINDOW or near_fault
            assert e.get("light", False) is not full, e
            assert ("grads" in e["fp"]) is full and "loss" in e["fp"]
            params_due = full or e["step"] % PARAMS_EVERY == 0 or e["step"] >= 20
            assert ("params" in e["fp"]) is params_due, e
    assert any(e.get("light") for e in history.steps()), "a 20-step run has light steps"


# bug flag -> (fault that exposes it, failing check, words the diagnosis must hold, bound)
BUGS = {
    "write_in_place": ("kill:rank=0,phase=checkpoint_save,save=2,event=2",
                       "atomic_recovery", "resume failed on rank", None),
    # event 4: the manifest's rename, which publishes a pointer to a file not written yet
    "early_pointer": ("kill:rank=0,phase=checkpoint_save,save=2,event=4",
                      "atomic_recovery", "resume failed on rank", None),
    "skip_rng": ("kill:rank=1,step=12", "deterministic_resume",
                 "RNG not restored (numpy, python, torch", None),
    "skip_optim": ("kill:rank=1,step=12", "deterministic_resume",
                   "optimizer not restored", None),
    "skip_sched": ("kill:rank=1,step=12", "deterministic_resume",
                   "LR schedule not restored", None),
    "off_by_one": ("kill:rank=1,step=12", "deterministic_resume", "data not restored", None),
    "sparse_ckpt": ("kill:rank=1,step=19", "bounded_lost_work", "redid 9 steps", 5),
}


# The incidents (tests/scenario/test_incidents.py) run the same fault on write_in_place (torn
# checkpoint) and another lost data position (replay_data): these only with -m slow.
# skip_optim is caught in CI by the suites' and the replay-file tests
# (tests/explore/test_suites.py).
@pytest.mark.parametrize("bug", cases({b: b for b in BUGS}, slow=frozenset({
    "write_in_place", "off_by_one", "skip_optim"})))
def test_each_planted_bug_is_caught_by_its_check(chaos_run, bug):
    fault, check, words, bound = BUGS[bug]
    # A resume that raises fails again at every retry: one is enough to judge it.
    retries = {"max_restarts": 1, "max_relaunches": 0} if check == "atomic_recovery" else {}
    report = chaos_run(TARGET, faults=[fault], args=[*STEPS, "--bug", bug], expect="fail",
                       max_lost_steps=bound, **retries)
    failing = [name for name, c in report.checks.items() if c["ok"] is False]
    assert check in failing, report.table()
    assert words in report.checks[check]["detail"], report.table()


def test_a_resume_that_dies_the_same_way_twice_is_stopped_and_judged(chaos_run):
    """Issue 30, item 7: with the default retries (3 restarts, 3 relaunches) a resume
    that dies on a broken checkpoint was restarted 11 times (35 s here, over 90 s
    elsewhere); the second identical death settles it."""
    report = chaos_run(TARGET, faults=[BUGS["early_pointer"][0]],
                       args=[*STEPS, "--bug", "early_pointer"], expect="fail")
    assert report.restarts == 2, report.table()  # the kill's restart, then one more
    completes = report.checks["completes"]["detail"]
    assert "died twice in a row before its first step with the same error" in completes
    assert report.checks["atomic_recovery"]["ok"] is False, report.table()


@pytest.mark.slow  # tests/test_plugin.py sees the divergent step named too
def test_deterministic_resume_names_the_first_divergent_step(chaos_run):
    report = chaos_run(TARGET, faults=["kill:rank=1,step=12"], args=[*STEPS, "--bug",
                                                                     "skip_optim"])
    check = report.checks["deterministic_resume"]
    assert check["divergent_step"] == 11 and check["component"] == "optimizer"


def test_a_restart_that_dies_at_start_up_once_is_not_blamed(chaos_run):
    """Rank 1 of the first restart exits before it loads anything (a transient start-up
    failure); the next restart resumes from step 10. The job recovered on its own: no
    failed resume, lost work judged on the recovery that resumed, the death said."""
    script = Path(__file__).parents[1] / "scripts" / "flaky_restart.py"
    report = chaos_run(script, faults=["kill:rank=1,step=12"], args=STEPS, expect="pass")
    assert report.restarts == 2, report.table()  # the kill's restart, then the one that resumed
    checks = report.checks
    assert all(checks[name]["ok"] is True for name in (
        "completes", "atomic_recovery", "deterministic_resume", "bounded_lost_work",
        "no_orphans")), report.table()
    assert "1 restart(s) died before their first step" in checks["atomic_recovery"]["detail"]
    assert report.lost_steps == [2], report.table()


def test_a_nondeterministic_target_is_reported_not_blamed(chaos_run):
    report = chaos_run(TARGET, faults=["kill:rank=1,step=12"],
                       args=[*STEPS, "--bug", "nondeterministic"])
    assert report.verdict == "error"
    assert "not deterministic without faults" in report.reason
    assert report.checks["deterministic_resume"]["ok"] is None


@pytest.mark.slow  # a good and a bad run, twice; CI runs both kinds in other tests
@pytest.mark.parametrize("round_", [0, 1])
def test_verdicts_repeat(chaos_run, round_):
    good = chaos_run(TARGET, faults=["kill:rank=1,step=8"], args=STEPS)
    bad = chaos_run(TARGET, faults=["kill:rank=1,step=8"], args=[*STEPS, "--bug", "skip_rng"])
    assert good.verdict == "pass", good.table()
    assert bad.verdict == "fail", bad.table()
    assert bad.checks["deterministic_resume"]["divergent_step"] == 6


@pytest.mark.slow  # multi-node recovery runs in CI through tests/e2e/test_e2e_partition.py
@pytest.mark.parametrize("fault", ["kill:node=1,step=12", "kill:rank=0,step=12"])
def test_two_simulated_nodes_recover(chaos_run, fault):
    """Two torchrun agents, one rank each (as root: each in its own network namespace,
    the c10d rendezvous on node 0)."""
    report = chaos_run(TARGET, faults=[fault], args=STEPS, nodes=2, nproc=1, expect="pass")
    assert report.restarts >= 1


@pytest.mark.slow
def test_two_nodes_still_catch_a_resume_bug(chaos_run):
    report = chaos_run(TARGET, faults=["kill:node=1,step=12"], nodes=2, nproc=1,
                       args=[*STEPS, "--bug", "skip_optim"], expect="fail")
    assert report.checks["deterministic_resume"]["component"] == "optimizer"


def test_kill_at_a_time(chaos_run):
    """The time trigger counts from the harness's start of the job: the kill fires 9 s
    after it, wherever the job then is. On a quiet machine that is mid-training (10 s of
    it after a 2 s start-up); on a loaded one the start-up alone may take longer, and a
    kill before the first step is as real a failure (issue 43: the test assumed the
    machine's speed). Its reference is test_cli.py's interrupted run's too."""
    report = chaos_run(TARGET, faults=["kill:rank=1,time=9"],
                       args=["--steps", "25", "--step-sleep", "0.4"], expect="pass")
    history = History.of_run(Path(report.run_dir))
    launched = min(e["t"] for e in history.of("launch"))
    booted = min(e["t"] for e in history.of("boot") if e["rank"] == 1)
    fired = next(e for e in history.faults())
    # 9 s after t0 (the launch comes just after it), or at once where rank 1's agent was
    # not up by then: the machine's speed decides which, never a constant here
    assert fired["t"] - launched >= 8.0, fired
    assert fired["t"] - max(launched + 9.0, booted) < 2.0, (fired, launched, booted)
    assert report.restarts >= 1 and report.faults[0]["fired_step"] < 26


@pytest.mark.parametrize("args", [[], ["--closure"]], ids=["step", "closure"])
def test_plain_ddp_script_is_instrumented_and_judged(chaos_run, args):
    """With optimizer.step(closure), the gradients exist only once the step ran: taken
    before it, a resumed process's first step read as 'gradients differ' (issue 17)."""
    report = chaos_run(PLAIN, faults=["kill:rank=1,step=12"], args=args, expect="pass")
    assert report.checks["deterministic_resume"]["ok"] is True
    # The kill's restart, and now and then one more: this plain script destroys the process
    # group with DDP alive, and torch 2.13's gloo teardown may abort after the last step
    # ("terminate called without an active exception"; README, Known limits).
    assert report.restarts >= 1
