"""Fault specs and schedules: what parses, and the one-line reason for what does not."""

from __future__ import annotations

import os

import pytest
from conftest import TARGET

from torchchaos.errors import UsageError
from torchchaos.faults.params import run_relative_dir
from torchchaos.faults.storage import _mountpoint, _slug
from torchchaos.scenario import model, schedule
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Trigger, parse_fault_spec


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
    ("kill:rank=0,step=2,color=red", "has no key 'color'; it takes rank= or node="),
    # a typo: the close key is suggested, and every key the kind takes is listed
    ("kill:rnak=1,step=3", "no key 'rnak' (did you mean 'rank'?); it takes rank= or node="
                           " (the target), step=, phase= (with save=, event=), time= or p="
                           " (the trigger), and its own code=, grace=, signal="),
    ("kill:rank=1,setp=3", "no key 'setp' (did you mean 'step'?)"),
    ("kil:rank=1,step=3", "unknown fault kind 'kil' (did you mean 'kill'?)"),
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
    ("bitflip:rank=0,step=2,bit=64", "bit 64 does not exist in any float dtype"),
    ("bitflip:rank=0,step=2,tensor=checkpoint,bit=9", "bit= is 0-7, got 9"),
    ("bitflip:rank=0,step=2,tensor=checkpoint,bit=sign", "bit= is 0-7, got sign"),
    ("storage:mode=eio,rank=0,step=2,dir=_chaos/x", "inside the run directory"),
    ("storage:mode=eio,rank=0,step=2,dir=./_chaos", "inside the run directory"),
    ("storage:mode=eio,rank=0,step=2,dir=/abs", "inside the run directory"),
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


def test_the_widest_bit_and_a_file_byte_bit_parse():
    assert parse_fault_spec("bitflip:rank=0,step=2,bit=63").params["bit"] == 63
    assert parse_fault_spec("bitflip:rank=0,step=2,tensor=checkpoint,bit=7").params["bit"] == 7


@pytest.mark.parametrize("given,folder,slug", [
    (".", ".", "0-rundir"), ("./", ".", "0-rundir"), ("ckpt/", "ckpt", "0-ckpt"),
    ("./out/ckpt", "out/ckpt", "0-out_ckpt"),
])
def test_the_run_dir_itself_is_a_storage_folder_with_a_sane_state_name(given, folder, slug):
    assert run_relative_dir(given) == folder
    assert parse_fault_spec(f"storage:mode=eio,rank=0,step=2,dir={given}").params["dir"] == folder
    assert _slug(0, folder) == slug


@pytest.mark.parametrize("dirs,ok", [
    ((".", "ckpt"), False), (("ckpt", "ckpt/sub"), False), (("ckpt", "./ckpt"), True),
    (("ckpt", "ckpt2"), True), (("a/b", "a/c"), True),
])
def test_storage_folders_must_not_nest(dirs, ok):
    faults = [f"storage:mode=eio,rank=0,step={n + 1},dir={d}" for n, d in enumerate(dirs)]
    if ok:
        Scenario.build(str(TARGET), faults=faults)
        return
    with pytest.raises(UsageError, match="cannot be combined: one folder is inside the other"):
        Scenario.build(str(TARGET), faults=faults)


def test_a_storage_folder_that_cannot_be_one_is_a_usage_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "snapshot.pt").write_bytes(b"a file")
    with pytest.raises(UsageError, match="dir=snapshot.pt: cannot be used as a folder"):
        _mountpoint(run, "snapshot.pt")
    with pytest.raises(UsageError, match="cannot be used as a folder"):
        _mountpoint(run, "snapshot.pt/ckpt")
    os.symlink(tmp_path, run / "out")  # e.g. copied in from a start_from folder
    with pytest.raises(UsageError, match="outside the run directory"):
        _mountpoint(run, "out")
    assert _mountpoint(run, ".") == run.resolve()
    assert _mountpoint(run, "ckpt") == run.resolve() / "ckpt"


def test_ranks_and_nodes_are_checked_against_the_job():
    with pytest.raises(UsageError, match="rank 4 does not exist"):
        Scenario.build(str(TARGET), faults=["kill:rank=4,step=1"], nproc=2, nodes=2)
    Scenario.build(str(TARGET), faults=["kill:rank=3,step=1"], nproc=2, nodes=2)
    with pytest.raises(UsageError, match="node 1 does not exist"):
        Scenario.build(str(TARGET), faults=["kill:node=1,step=1"])


def test_far_more_ranks_than_cores_need_force():
    ranks = 4 * len(os.sched_getaffinity(0))
    Scenario(script=str(TARGET), nproc=ranks).check_machine()
    crowded = Scenario(script=str(TARGET), nproc=ranks + 1)
    with pytest.raises(UsageError, match="pass --force"):
        crowded.check_machine()
    crowded.check_machine(force=True)


def test_force_is_bounded_by_what_the_machine_can_hold(monkeypatch):
    """--force lets ranks share cores; it does not fork past the machine's memory or its
    pids (100000 ranks were once started)."""
    with pytest.raises(UsageError, match=r"^--nproc 100000 x --nodes 1 = 100000 ranks: this"
                                         r" machine holds at most \d+ \(.*\), even with"
                                         r" --force; lower --nproc or --nodes$"):
        Scenario(script=str(TARGET), nproc=100000).check_machine(force=True)
    monkeypatch.setattr(model, "_memory_bytes", lambda: 1 << 30)  # 1 GiB: 5 ranks + agent
    Scenario(script=str(TARGET), nproc=5).check_machine(force=True)
    with pytest.raises(UsageError, match=r"at most 5 \(1024 MiB of memory at 150 MiB a rank"):
        Scenario(script=str(TARGET), nproc=6).check_machine(force=True)
    monkeypatch.setattr(model, "_tasks_left", lambda: (20, "pid_max"))  # 5 ranks or agents
    with pytest.raises(UsageError, match=r"at most 3 \(20 more tasks under pid_max at 4 a"):
        Scenario(script=str(TARGET), nproc=2, nodes=2).check_machine(force=True)
