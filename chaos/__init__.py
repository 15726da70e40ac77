"""torchchaos: real faults in real torchrun jobs, judged against a fault-free run.

What a user imports lives here; everything else is the engine (ARCHITECTURE.md
draws the packages). The names are loaded on first use: the agent imports this
package inside every training rank, and a rank must not pay for the harness.
Type checkers read the names' types from `__init__.pyi` beside this file.

    from torchchaos import Scenario, run_scenario
    report = run_scenario(Scenario.build("train.py", faults=["kill:rank=1,step=12"]),
                          out_dir, cache_dir)
    assert report.verdict == "pass", report.table()
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it
_PUBLIC = {
    "Scenario": "torchchaos.scenario.model",
    "run_scenario": "torchchaos.engine",
    "Report": "torchchaos.report.report_file",
    "report_detection": "torchchaos.api",
    "report_checkpoint_committed": "torchchaos.api",
    "load_scenario_file": "torchchaos.scenario.files",
    "chaos_machine": "torchchaos.explore.stateful",
    "FaultKind": "torchchaos.faults.contract",
    "HarnessKind": "torchchaos.faults.contract",
    "ChaosError": "torchchaos.errors",
    "UsageError": "torchchaos.errors",
    "CannotJudge": "torchchaos.errors",
}
_RENAMED = {"load_scenario_file": "load"}

__all__ = sorted(_PUBLIC)  # (listed for type checkers in __init__.pyi)

def __getattr__(name: str) -> Any:
    if name == "__version__":  # kept in torchchaos.version, the lowest floor's
        return importlib.import_module("torchchaos.version").__version__
    if name not in _PUBLIC:
        raise AttributeError(f"module 'torchchaos' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
