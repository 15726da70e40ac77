"""Fault specs and schedules: what parses, and the one-line reason for what does not."""

from __future__ import annotations

import pytest

from chaos import schedule
from chaos.errors import UsageError
from chaos.spec import Trigger, parse_fault_spec


def test_contract_examples_parse():
    kill = parse_fault_spec("kill:rank=1,step=30")
    assert (kill.kind, kill.target_type, kill.target, kill.trigger) == (
        "kill", "rank", "1", Trigger(step=30))
    term = parse_fault_spec("kill:rank=0,step=30,signal=SIGTERM,grace=5")
    assert term.params == {"signal": "SIGTERM", "grace": 5.0}
    node = parse_fault_spec("kill:node=0,step=30")
    assert node.target_type == "node"
    save = parse_fault_spec("kill:rank=0,phase=checkpoint_save,event=3,save=2")
    assert save.trigger == Trigger(phase="checkpoint_save", event=3, save=2)
    assert parse_fault_spec("kill:rank=one,time=2.5").trigger.time == 2.5
    assert parse_fault_spec("kill:rank=0,p=0.1,signal=term").params["signal"] == "SIGTERM"
    flip = parse_fault_spec("bitflip:rank=0,step=20,tensor=param,bit=30")
    assert flip.params == {"tensor": "param", "bit": 30}
    assert parse_fault_spec("bitflip:rank=1,step=3,bit=mant_low").params["bit"] == "mant_low"


@pytest.mark.parametrize("text,reason", [
    ("explode:rank=0,step=3", "unknown fault kind 'explode'"),
    ("kill", "needs exactly one trigger"),
    ("kill:rank=0", "needs exactly one trigger"),
    ("kill:rank=0,step=3,time=4", "needs exactly one trigger"),
    ("kill:rank=0,step=three", "step= needs an integer"),
    ("kill:rank=0,step=0", "step= must be >= 1"),
    ("kill:rank=0,step", "expected key=value"),
    ("kill:rank=0,rank=1,step=2", "rank= given twice"),
    ("kill:rank=0,node=1,step=2", "names both rank= and node="),
    ("kill:rank=-1,step=2", "rank= must be >= 0"),
    ("kill:rank=0,step=2,signal=SIGFOO", "unknown signal"),
    ("kill:rank=0,step=2,color=red", "has no parameter 'color'"),
    ("kill:rank=0,phase=checkpoint_sav", "unknown phase"),
    ("kill:rank=0,p=1.5", "p= must be >= 0 and <= 1"),
    (":rank=0", "malformed fault spec"),
    ("bitflip:rank=0,step=2,tensor=weights", "'weights' is not one of param"),
    ("bitflip:rank=0,step=2,bit=exponent", "neither a bit index nor one of sign"),
    ("bitflip:rank=0,step=2,bit=3,value=nan", "bit= or value=, not both"),
    ("bitflip:rank=0,step=2,value=zero", "'zero' is not one of nan"),
    ("bitflip:rank=0,step=2,tensor=checkpoint,name=w", "flips a bit of a file"),
    ("bitflip:rank=0,step=2,dir=ckpt", "tensor=checkpoint only"),
    ("bitflip:rank=0,step=2,tensor=checkpoint,dir=../x", "inside the run directory"),
    ("bitflip:rank=0,step=2,element=-1", "needs an integer >= 0"),
])
def test_bad_specs_give_one_line_reasons(text, reason):
    with pytest.raises(UsageError) as info:
        parse_fault_spec(text)
    assert reason in str(info.value)
    assert "\n" not in str(info.value)


def test_resolve_is_seeded_and_checks_ranges():
    specs = [parse_fault_spec("kill:rank=one,step=3"), parse_fault_spec("kill:node=0,step=5")]
    first = schedule.resolve(specs, seed=7, nproc=4, nodes=1)
    assert first == schedule.resolve(specs, seed=7, nproc=4, nodes=1)
    assert {f.index for s in range(20)
            for f in schedule.resolve(specs[:1], seed=s, nproc=4, nodes=1)} == {0, 1, 2, 3}
    with pytest.raises(UsageError, match="rank 2 does not exist"):
        schedule.resolve([parse_fault_spec("kill:rank=2,step=1")], 0, nproc=2, nodes=1)


def test_resolved_schedule_round_trips(tmp_path):
    specs = [parse_fault_spec("kill:rank=0,phase=checkpoint_save,event=3,signal=SIGTERM")]
    faults = schedule.resolve(specs, seed=1, nproc=2, nodes=1)
    schedule.save(faults, tmp_path / "schedule.json")
    assert schedule.load(tmp_path / "schedule.json") == faults
