"""The field's fault kinds as specs: what they accept, what they refuse in one line, and
how an imported incident's fault becomes one of them rather than a stand-in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, TARGET

from torchchaos.errors import UsageError
from torchchaos.faults.exception import resolve
from torchchaos.faults.gpu import GpuError
from torchchaos.incident.attribute import Finding, Incident
from torchchaos.incident.mapping import Placement, exception_name, faults_for
from torchchaos.scenario.spec import parse_fault_spec

GOOD = [
    "crash:rank=1,step=5,signal=bus",
    "raise:rank=0,phase=checkpoint_save,save=2,event=3,type=OSError",
    "raise:rank=0,time=4,type=torch.OutOfMemoryError",
    "oom:rank=1,step=5,limit=128",
    "oom:rank=0,step=5,mode=raise",
    "abort:rank=1,step=5,after=0.2",
    "dataloader:rank=0,step=5,mode=stop,for=3,worker=1",
    "hang:rank=1,step=5,mode=gil,for=2",
]
BAD = {
    "crash:rank=1,step=5,signal=ill": "'ill' is not one of segv, abrt, bus",
    "raise:rank=0,step=5,type=NotAnError": "no built-in exception",
    "raise:rank=0,step=5,type=torch..Thing": "not a dotted path",
    "oom:rank=0,step=5,mode=swap": "'swap' is not one of kill, raise",
    "oom:rank=0,step=5,limit=0": "needs an integer >= 1",
    "dataloader:rank=0,step=5,for=3": "for= applies to mode=stop only",
    "dataloader:node=0,step=5": "node",
}


@pytest.mark.parametrize("spec", GOOD)
def test_each_kind_takes_its_parameters(spec):
    assert parse_fault_spec(spec).kind == spec.split(":")[0]


@pytest.mark.parametrize("spec, why", BAD.items())
def test_a_wrong_parameter_is_refused_with_the_reason(spec, why):
    with pytest.raises(UsageError, match=why.replace("(", r"\(").replace(".", r"\.")):
        parse_fault_spec(spec)


def test_an_exception_type_is_a_builtin_or_imported_by_its_path():
    assert resolve("KeyboardInterrupt") is KeyboardInterrupt
    import torch

    assert resolve("torch.OutOfMemoryError") is torch.OutOfMemoryError
    with pytest.raises(TypeError):
        resolve("torch.nn.Linear")


@pytest.mark.skipif(GpuError.unavailable_reason() is None, reason="this machine has a GPU")
def test_a_gpu_fault_without_a_gpu_is_one_line_and_exit_2_before_anything(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--fault", "gpu:rank=0,step=3",
         "--out", str(tmp_path / "out"), "--", str(TARGET), "--steps", "4"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "torchchaos: error: fault kind gpu needs a CUDA device (no /dev/nvidia* on this"
        " machine)"]
    assert not (tmp_path / "out").exists()


def _incident(kind: str, how: str, rank: int = 1) -> Incident:
    return Incident(Finding(kind=kind, rank=rank, role="other", phase="between_saves",
                            how=how, step_window=(6, None)), {})


# the incident's last step is 6: `step=6` fires once step 6 is done, as the incident did
@pytest.mark.parametrize("kind, how, spec", [
    ("oom", "OOM", "oom:rank=1,step=6"),
    ("oom", "allocation failed: torch.OutOfMemoryError: CUDA out of memory",
     "oom:rank=1,step=6,mode=raise"),
    ("exception", "ValueError: bad shape", "raise:rank=1,step=6,type=ValueError"),
    ("exception", "torch.distributed.DistBackendError: NCCL error",
     "raise:rank=1,step=6,type=RuntimeError"),
    ("crash", "SIGSEGV", "crash:rank=1,step=6,signal=segv"),
    ("crash", "SIGBUS", "crash:rank=1,step=6,signal=bus"),
    ("crash", "SIGILL", "crash:rank=1,step=6,signal=segv"),
])
def test_an_incident_replays_as_the_kind_that_makes_it(kind, how, spec):
    [(made, note)] = faults_for(_incident(kind, how), Placement(), same_script=True)
    assert str(made) == spec and note


def test_an_exception_line_names_its_type():
    assert exception_name("KeyError: 'model'") == "KeyError"
    assert exception_name("builtins.OSError: [Errno 5]") == "OSError"
    assert exception_name("torch.OutOfMemoryError: x") == "RuntimeError"
    assert exception_name("Traceback (most recent call last)") == "RuntimeError"


SLOW_START = """\
import threading, time
from torchchaos.faults.exception import _raise_in_main_thread
threading.Thread(target=_raise_in_main_thread, daemon=True,
                 args=(KeyboardInterrupt, lambda: print("raised", flush=True))).start()
end = time.monotonic() + 0.5
while time.monotonic() < end:  # the start-up still runs Python code when it fires
    pass
"""


def test_a_time_that_passed_during_start_up_interrupts_the_script_not_the_start_up(
        tmp_path):
    """A time trigger that is due when the agent arms it (a rank that started slowly on
    a busy machine) fires at once, while sitecustomize (or the warm launcher) still
    runs: the KeyboardInterrupt must wait for the script's first line, as a real one
    would hit the script. Raised in the start-up, it ended the interpreter before the
    script began (cold), or was swallowed by torchrun's fork wrapper with exit code 0 and
    the job hung (warm, seen under load)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_START)
    (tmp_path / "train.py").write_text("import time\nwhile True:\n    time.sleep(0.01)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=60)
    assert done.stdout.splitlines() == ["raised"], done.stderr
    assert done.returncode == -2, done.stderr  # python ends by SIGINT, as on Ctrl-C
    last_frame = [line for line in done.stderr.splitlines() if line.lstrip().startswith(
        "File ")][-1]  # where the interrupt landed
    assert 'train.py", line' in last_frame and "KeyboardInterrupt" in done.stderr, done.stderr
