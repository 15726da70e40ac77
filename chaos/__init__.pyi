"""The names `torchchaos` hands on, for type checkers: at run time `__init__.py`
loads each on first use (a training rank imports the package and must not pay for the
harness)."""

from torchchaos.api import report_checkpoint_committed, report_detection
from torchchaos.engine import run_scenario
from torchchaos.errors import CannotJudge, ChaosError, UsageError
from torchchaos.explore.stateful import chaos_machine
from torchchaos.faults.contract import FaultKind, HarnessKind
from torchchaos.report.report_file import Report
from torchchaos.scenario.files import load as load_scenario_file
from torchchaos.scenario.model import Scenario

__version__: str
__all__ = [
    "CannotJudge",
    "ChaosError",
    "FaultKind",
    "HarnessKind",
    "Report",
    "Scenario",
    "UsageError",
    "chaos_machine",
    "load_scenario_file",
    "report_checkpoint_committed",
    "report_detection",
    "run_scenario",
]
