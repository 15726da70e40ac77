"""miscompute: wrong matrix products, by pattern, rate, operand and device.

In-process, on real torch tensors: each pattern changes exactly what it says (one
element; 32 consecutive ones from a multiple of 32; K adjacent bits of one element),
the dispatch mode corrupts only the chosen family of products and only as often as
asked, a data-dependent defect trips only on its operands, and a defect written down
for a device is carried by that device only. End to end (a restart on the same
device carries it, a defect that does not persist is gone): tests/e2e/test_e2e_sdc.py.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch
from conftest import REPO, TARGET

from torchchaos.faults import miscompute
from torchchaos.faults.contract import FireContext, ResolvedFault, Trigger


def _fault(**params: object) -> ResolvedFault:
    return ResolvedFault("f0-miscompute", "miscompute", "rank", 0, Trigger(step=1),
                         dict(params), "miscompute:rank=0,step=1", seed=7)


class _Steps:
    def step(self) -> int:
        return 3


def _armed(events: list[dict], **params: object):
    ctx = FireContext(0, 0, 0, lambda ev, **f: events.append({"ev": ev, **f}), None, "",
                      _Steps())  # type: ignore[arg-type]
    return miscompute.arm(_fault(**params), ctx, "host/slot0")


def _changed(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    return torch.nonzero((a != b).reshape(-1)).reshape(-1).tolist()


def _bits_changed(a: torch.Tensor, b: torch.Tensor, index: int) -> list[int]:
    x = int(a.reshape(-1).view(torch.int32)[index]) ^ int(b.reshape(-1).view(torch.int32)[index])
    return [k for k in range(32) if (x >> k) & 1]


@pytest.mark.parametrize("pattern, elements", [("element", 1), ("warp", 32), ("burst", 1)])
def test_each_pattern_changes_what_it_says(pattern, elements):
    out = torch.randn(8, 40)
    clean = out.clone()
    done = miscompute.corrupt(out, {"pattern": pattern, "bit": "mant_high"},
                              random.Random(1))
    changed = _changed(clean, out)
    assert len(changed) == elements and done["elements"] == elements
    assert changed == list(range(changed[0], changed[0] + elements))
    if pattern == "warp":
        assert changed[0] % 32 == 0
    wanted = 4 if pattern == "burst" else 1
    assert len(_bits_changed(clean, out, changed[0])) == wanted == len(done["bits"])


def test_a_nan_is_the_rare_case_still_there():
    out = torch.randn(4, 4)
    miscompute.corrupt(out, {"value": "nan"}, random.Random(2))
    assert int(torch.isnan(out).sum()) == 1


def test_linear_layers_compute_wrong_on_every_call_and_only_they():
    layer = torch.nn.Linear(16, 16)
    x, a, b = torch.randn(4, 16), torch.randn(2, 4, 4), torch.randn(2, 4, 4)
    clean_linear, clean_bmm = layer(x).detach(), torch.bmm(a, b)
    events: list[dict] = []
    mode = _armed(events, op="mm")
    try:
        wrong = [layer(x).detach() for _ in range(3)]
        batched = torch.bmm(a, b)
    finally:
        mode.__exit__(None, None, None)
    assert all(_changed(clean_linear, w) for w in wrong)
    assert torch.equal(batched, clean_bmm)  # the other family computes right
    assert [e["name"] for e in events] == ["aten.addmm"] * 3
    assert events[0]["model"] == "miscompute" and events[0]["step"] == 4


def test_every_nth_call_is_wrong():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    clean = a @ b
    events: list[dict] = []
    mode = _armed(events, op="mm", every=3)
    try:
        results = [torch.mm(a, b) for _ in range(9)]
    finally:
        mode.__exit__(None, None, None)
    assert [bool(_changed(clean, r)) for r in results] == [False, False, True] * 3


def test_a_data_dependent_defect_trips_only_on_its_operands():
    """Bit 31 of the first operand's first element is its sign: a negative first
    element trips the defect, a positive one never does."""
    b = torch.randn(8, 8)
    tripping, quiet = torch.randn(8, 8), torch.randn(8, 8)
    tripping[0, 0], quiet[0, 0] = -1.0, 1.0
    events: list[dict] = []
    mode = _armed(events, op="mm", when_bit=31)
    try:
        hit, missed = torch.mm(tripping, b), torch.mm(quiet, b)
    finally:
        mode.__exit__(None, None, None)
    assert _changed(tripping @ b, hit) and not _changed(quiet @ b, missed)


def test_a_defect_stays_with_its_device(tmp_path):
    fault = _fault(pattern="warp")
    miscompute.write_defect(tmp_path, fault, "node-1/slot0")
    assert miscompute.defects_on(tmp_path, "node-1/slot0") == [fault]
    assert miscompute.defects_on(tmp_path, "node-1/slot1") == []
    assert miscompute.defects_on(tmp_path, "node-0/slot0") == []


def test_a_container_is_a_machine_of_its_own(monkeypatch):
    cid = "ab" * 32
    line = f"7:freezer:/torchchaos-docker-0123456789ab/{cid}\n"
    assert miscompute.machine_id(line) == f"container-{cid[:12]}"
    monkeypatch.setenv("NCCL_HOSTID", "torchchaos-run-node-1")  # a simulated node
    assert miscompute.machine_id("7:freezer:/\n") == "torchchaos-run-node-1"


@pytest.mark.parametrize("spec, words", [
    ("miscompute:rank=1,step=4,every=2,rate=5", "every= or rate="),
    ("miscompute:rank=1,step=4,bits=3", "bits= goes with pattern=burst"),
    ("miscompute:rank=1,step=4,pattern=burst,value=nan", "value= does not apply"),
    ("miscompute:rank=1,step=4,pattern=stripe", "pattern"),
])
def test_a_miscompute_that_cannot_be_is_refused_in_one_line(tmp_path, spec, words):
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--nproc", "2", "--out",
         str(tmp_path / "o"), "--fault", spec, "--", str(TARGET)], capture_output=True,
        text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(bool(__import__("glob").glob("/dev/nvidia[0-9]*")), reason="has CUDA")
def test_the_cuda_path_is_refused_without_cuda(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--nproc", "2", "--out",
         str(tmp_path / "o"), "--fault", "miscompute:rank=1,step=4,device=cuda", "--",
         str(TARGET)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert "needs a CUDA device" in done.stderr, done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_products_compute_wrong_through_the_same_code():
    """The same mode on CUDA tensors (a GPU runner: `-m gpu`)."""
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    clean = a @ b
    events: list[dict] = []
    mode = _armed(events, op="mm", device="cuda", pattern="warp")
    try:
        wrong = torch.mm(a, b)
    finally:
        mode.__exit__(None, None, None)
    assert len(_changed(clean, wrong)) == 32 and events[0]["device"].startswith("cuda")


def test_the_same_operands_give_the_same_wrong_result():
    """A rerun on the defective device reproduces the corruption bit for bit; other
    operands are hit elsewhere (seeded operands: the draws are fixed)."""
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(16, 16, generator=gen) for _ in range(3))
    events: list[dict] = []
    mode = _armed(events, op="mm", rate=100, pattern="element")
    try:
        first, again = torch.mm(a, b), torch.mm(a, b)
        torch.mm(c, b)
    finally:
        mode.__exit__(None, None, None)
    assert torch.equal(first, again) and _changed(a @ b, first)
    assert [e["index"] for e in events[:2]] == [events[0]["index"]] * 2
    assert (events[2]["index"], events[2]["bit"]) != (events[0]["index"], events[0]["bit"])
