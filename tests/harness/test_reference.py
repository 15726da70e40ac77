"""The fault-free reference: cached by content, made once, proven deterministic on request."""

from __future__ import annotations

import threading

from conftest import PLAIN, TARGET

from chaos.harness.reference import get_reference
from chaos.scenario.model import Scenario


def test_two_harnesses_asking_at_once_run_the_reference_once(tmp_path):
    scenario = Scenario(script=str(PLAIN))
    said: list[str] = []
    workers = [threading.Thread(target=get_reference, args=(scenario, tmp_path, said.append))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sum("reference run 1/1" in line for line in said) == 1
    assert sum("reusing cached run" in line for line in said) == 1


def test_an_interrupted_entry_is_run_again_not_reused(tmp_path):
    scenario = Scenario(script=str(PLAIN))
    first = get_reference(scenario, tmp_path, lambda _: None)
    (first.run_dir.parent / "meta.json").unlink()  # as if killed before it finished
    said: list[str] = []
    get_reference(scenario, tmp_path, said.append)
    assert any("reference run 1/1" in line for line in said)


def test_two_reference_runs_prove_or_disprove_determinism(tmp_path):
    args = ["--steps", "6", "--ckpt-every", "3"]
    good = get_reference(Scenario(script=str(TARGET), args=args, reference_runs=2), tmp_path,
                         lambda _: None)
    assert good.deterministic is True and "matched bitwise" in good.detail
    bad = get_reference(Scenario(script=str(TARGET), args=[*args, "--bug", "nondeterministic"],
                                 reference_runs=2), tmp_path, lambda _: None)
    assert bad.deterministic is False and "differ at step 1" in bad.detail
