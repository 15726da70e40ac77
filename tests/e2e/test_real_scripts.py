"""The real nanoGPT and the real PyTorch DDP tutorial, run as the README tells a new user.

Both need CUDA under torchrun (nanoGPT's DDP branch calls `torch.cuda.set_device`, the
tutorial moves its model with `.to(local_rank)`), so these are marked `gpu`, and they
need checkouts this repository does not carry (their code is theirs):

    TORCHCHAOS_NANOGPT_DIR=~/nanoGPT    # with data/shakespeare_char prepared
    TORCHCHAOS_EXAMPLES_DIR=~/examples  # github.com/pytorch/examples
    python -m pytest -m gpu tests/e2e/test_real_scripts.py

One rank each: two NCCL ranks cannot share one GPU. What is asserted is what each
script, unmodified, is known to do: nanoGPT runs and saves but does not resume by itself
(`init_from` is a flag a human flips), the tutorial draws its data unseeded. On a CPU
machine, tests/harness/test_reference.py checks that both get "needs a GPU" instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _checkout(variable: str) -> Path:
    where = os.environ.get(variable)
    if not where:
        pytest.skip(f"set {variable} to a checkout to run this")
    return Path(where).expanduser().resolve()


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _cuda(), reason="the real scripts need CUDA")]


def doctor(cwd: Path, out: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchchaos.cli", "doctor", "--quiet", "--nproc",
                           "1", "--out", str(out), "--cache-dir", str(out / "cache"), *words],
                          capture_output=True, text=True, timeout=1500, cwd=cwd)


def line(output: str, name: str) -> str:
    return next(text for text in output.splitlines() if text[6:].startswith(name))


def test_nanogpt_runs_saves_and_is_told_that_it_does_not_resume(tmp_path):
    checkout = _checkout("TORCHCHAOS_NANOGPT_DIR")
    if not (checkout / "data" / "shakespeare_char" / "train.bin").is_file():
        pytest.skip("run data/shakespeare_char/prepare.py in the nanoGPT checkout first")
    result = doctor(checkout, tmp_path / "runs", "--link", "configurator.py", "--link", "data",
                    "--", "train.py", str(checkout / "config" / "train_shakespeare_char.py"),
                    "--max_iters=40", "--eval_interval=10", "--eval_iters=2",
                    "--log_interval=1", "--compile=False", "--always_save_checkpoint=True")
    output = result.stdout + result.stderr
    assert line(output, "runs").startswith("ok"), output
    if line(output, "seeded").startswith("ok"):  # bitwise on this GPU: then the rest
        assert "into out-shakespeare-char/" in line(output, "saves"), output
        assert "started again from step 0" in line(output, "resumes"), output
    assert result.returncode == 1, output


def test_the_ddp_tutorial_runs_and_is_told_to_seed_its_data(tmp_path):
    tutorial = _checkout("TORCHCHAOS_EXAMPLES_DIR") / "distributed" / "ddp-tutorial-series"
    result = doctor(tutorial, tmp_path / "runs", "--", "multinode.py", "6", "2")
    output = result.stdout + result.stderr
    assert line(output, "runs").startswith("ok"), output
    assert line(output, "seeded").startswith("FAIL"), output
    assert "not deterministic" in line(output, "seeded"), output
    assert result.returncode == 1, output
