"""The fault-free reference: cached by content, made once, proven deterministic on request."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from conftest import PLAIN, REPO, TARGET
from histories import Timeline

from torchchaos.errors import CannotJudge
from torchchaos.harness.reference import (
    _torchft_hint,
    argument_files,
    cache_key,
    get_reference,
    gpu_hint,
    relative_path_hint,
    restarted_and_trained,
)
from torchchaos.scenario.model import Scenario


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


def test_a_second_run_is_added_beside_the_first_which_stays_in_use(tmp_path):
    """A one-run entry asked for two (doctor, beside a chaos run under pytest -n) keeps
    its run-0: another harness's ranks may be reading it as their reference right then.
    It was removed and made again, and a chaos run beside it lost its reference."""
    one = get_reference(Scenario(script=str(PLAIN)), tmp_path, lambda _: None)
    history = one.run_dir / "_chaos" / "history" / "rank-0.jsonl"
    before = history.stat()
    said: list[str] = []
    two = get_reference(Scenario(script=str(PLAIN), reference_runs=2), tmp_path, said.append)
    assert two.run_dir == one.run_dir and two.deterministic is True, two.detail
    assert history.stat().st_ino == before.st_ino and history.stat().st_mtime == before.st_mtime
    assert not any("reference run 1/2" in line for line in said), said
    assert any("reference run 2/2" in line for line in said), said


def test_a_meta_json_cut_short_is_run_again_naming_it(tmp_path):
    """A meta.json cut short (a full disk, a copy interrupted) once failed every later run
    on that cache with an internal error that named no file; it is said and rebuilt."""
    scenario = Scenario(script=str(PLAIN))
    first = get_reference(scenario, tmp_path, lambda _: None)
    meta = first.run_dir.parent / "meta.json"
    meta.write_text(meta.read_text()[:len(meta.read_text()) // 2])
    said: list[str] = []
    again = get_reference(scenario, tmp_path, said.append)
    assert said[0].startswith(f"reference: cached run {meta.parent} is damaged: {meta} does"
                              " not parse ("), said
    assert said[0].endswith("; running it again") and "reference run 1/1" in said[1]
    assert json.loads(meta.read_text())["runs"] == 1 and again.history().steps()
    assert [p.name for p in meta.parent.iterdir() if p.name.startswith(".")] == []  # no temp
    said.clear()
    get_reference(scenario, tmp_path, said.append)  # whole again: used as it is
    assert said == [f"reference: reusing cached run {meta.parent}"]


def test_a_reference_history_cut_in_half_is_rebuilt_not_judged_against(tmp_path):
    """Cached rank histories truncated to half their lines once read as a reference that
    stopped half way: a correct trainer FAILed ("job ran N step(s) more than the
    reference"). meta.json records each file's size and digest; the entry is rebuilt."""
    def run(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "torchchaos.cli", "run", "--out", str(tmp_path / name),
             "--cache-dir", str(tmp_path / "cache"), "--", str(TARGET), "--steps", "8",
             "--ckpt-every", "3"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path)

    first = run("first")
    assert first.returncode == 0, first.stdout + first.stderr
    histories = sorted((tmp_path / "cache").glob("ref-*/run-0/_chaos/history/rank-*.jsonl"))
    assert len(histories) == 2
    whole = {path: path.read_text() for path in histories}
    for path, text in whole.items():
        path.write_text(_half(text))
    second = run("second")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "verdict: PASS" in second.stdout and "more than the reference" not in second.stdout
    rank0 = histories[0]  # the first file found damaged
    assert (f"is damaged: {rank0} holds {len(_half(whole[rank0]))} bytes,"
            f" {len(whole[rank0])} when it was written; running it again") in second.stderr
    assert rank0.read_text().count("\n") == whole[rank0].count("\n")  # whole again


def _half(text: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[:len(lines) // 2])


@pytest.fixture(scope="module")
def nondeterministic_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the two tests of a job that is not deterministic: its two disagreeing
    reference runs are made once, by whichever test comes first."""
    return tmp_path_factory.mktemp("nondeterministic-cache")


def test_two_reference_runs_prove_or_disprove_determinism(tmp_path, nondeterministic_cache):
    args = ["--steps", "6", "--ckpt-every", "3"]
    good = get_reference(Scenario(script=str(TARGET), args=args, reference_runs=2), tmp_path,
                         lambda _: None)
    assert good.deterministic is True and "matched bitwise" in good.detail
    bad = Scenario(script=str(TARGET), args=[*args, "--bug", "nondeterministic"],
                   reference_runs=2)
    with pytest.raises(CannotJudge, match="^the target is not deterministic without faults:"
                                          " two fault-free runs differ at step 1 on rank"):
        get_reference(bad, nondeterministic_cache, lambda _: None)
    said: list[str] = []
    with pytest.raises(CannotJudge, match="differ at step 1"):  # cached: said again at once
        get_reference(bad, nondeterministic_cache, said.append)
    assert any("reusing cached run" in line for line in said)


def test_disagreeing_references_stop_the_command_before_any_run_with_faults(
        tmp_path, nondeterministic_cache):
    """`--reference-runs 2` on a job that is not deterministic: exit 2 after the two
    references (made, or cached by the test above), no chaos run."""
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--reference-runs", "2", "--fault",
         "kill:rank=1,step=4", "--out", str(out), "--cache-dir", str(nondeterministic_cache),
         "--", str(TARGET), "--steps", "6", "--ckpt-every", "3", "--bug", "nondeterministic"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "torchchaos: error: the target is not deterministic without faults: two fault-free"
        " runs differ at step 1")
    assert "chaos run" not in result.stderr and not (out / "chaos").exists()


def test_a_reference_whose_parameters_never_change_is_refused_up_front(tmp_path):
    with pytest.raises(CannotJudge, match=r"parameters never changed in 30 steps \(its loss"
                                          r" is 0.0 at every step\).*loss that trains"):
        get_reference(Scenario(script=str(PLAIN), args=["--zero-loss"]), tmp_path,
                      lambda _: None)
    get_reference(Scenario(script=str(PLAIN)), tmp_path, lambda _: None)  # the same, training


def test_the_cache_key_covers_the_files_the_arguments_name(tmp_path, monkeypatch):
    """A config edited between two runs makes a new reference; the key does not move
    when nothing the arguments name changed."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "train.yaml"
    config.write_text("lr: 0.1\n")
    forms = [["--config", "train.yaml"], ["--config=train.yaml"], [f"config={config}"]]
    keys = {str(f): cache_key(Scenario(script=str(TARGET), args=f)) for f in forms}
    (tmp_path / "unrelated.txt").write_text("x")
    assert keys == {str(f): cache_key(Scenario(script=str(TARGET), args=f)) for f in forms}
    config.write_text("lr: 0.2\n")
    for form in forms:
        assert cache_key(Scenario(script=str(TARGET), args=form)) != keys[str(form)], form
    assert argument_files(["--out", "{run_dir}/ckpt", "--steps", "6"]) == {}


def test_the_cache_key_covers_what_the_links_show(tmp_path):
    """An edited configurator.py, or a file added to a linked data folder, is a new
    reference; the key does not move when nothing linked changed."""
    (tmp_path / "configurator.py").write_text("lr = 0.1\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.bin").write_bytes(b"\0" * 64)
    links = [str(tmp_path / "configurator.py"), str(tmp_path / "data")]

    def key() -> str:
        return cache_key(Scenario(script=str(TARGET), links=links))

    first = key()
    (tmp_path / "unrelated.txt").write_text("x")
    assert key() == first
    (tmp_path / "configurator.py").write_text("lr = 0.2\n")
    second = key()
    assert second != first
    (tmp_path / "data" / "val.bin").write_bytes(b"\0" * 8)
    assert key() != second
    assert cache_key(Scenario(script=str(TARGET))) not in (first, second)


NANOGPT_LAYOUT = REPO / "tests" / "scripts" / "nanogpt_layout"


def _nanogpt_layout(folder: Path) -> None:
    """What nanoGPT's layout reads by fixed names, made in `folder`."""
    (folder / "data" / "tiny").mkdir(parents=True)
    tokens = bytes(i % 32 for i in range(4096))  # uint16 little-endian: token, 0
    (folder / "data" / "tiny" / "train.bin").write_bytes(
        b"".join(bytes([t, 0]) for t in tokens))
    (folder / "configurator.py").write_text((NANOGPT_LAYOUT / "configurator.py").read_text())


def test_a_job_that_opens_files_by_fixed_names_is_told_to_link_them_and_then_runs(tmp_path):
    """nanoGPT's layout (`exec(open('configurator.py').read())`, `data/<dataset>/`): each
    run starts in a new folder, so the first run names what to link; linked, a kill is
    judged and passes."""
    _nanogpt_layout(tmp_path)

    def run(*links: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "torchchaos.cli", "run", "--fault", "kill:rank=1,step=7",
             "--max-relaunches", "0", "--max-restarts", "1", *links, "--out",
             str(tmp_path / f"out{len(links)}"), "--cache-dir", str(tmp_path / "cache"), "--",
             str(NANOGPT_LAYOUT / "train.py"), "--max_iters=12"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path)

    unlinked = run()
    assert unlinked.returncode == 2, unlinked.stdout + unlinked.stderr
    assert unlinked.stderr.strip().endswith(
        "(the job runs in its run directory, not here: configurator.py exists here; pass it"
        f" as an absolute path, {tmp_path / 'configurator.py'}, or, where the script opens it"
        " by that name, --link configurator.py)"), unlinked.stderr
    assert relative_path_hint("No such file or directory: 'nowhere.py'") == ""
    linked = run("--link", "configurator.py", "--link", "data")
    assert linked.returncode == 0, linked.stdout + linked.stderr
    assert "verdict: PASS" in linked.stdout
    run_dir = tmp_path / "out4" / "chaos"
    assert (run_dir / "data").readlink() == tmp_path / "data"
    assert (run_dir / "out" / "ckpt.pt").is_file()  # what it wrote stays in its own folder
    assert not (tmp_path / "out").exists()
    # a job that writes into a linked folder: every run would find the others' checkpoints
    shared = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--fault", "kill:rank=1,step=7",
         "--link", "configurator.py", "--link", "data", "--out", str(tmp_path / "shared"),
         "--cache-dir", str(tmp_path / "cache"), "--", str(NANOGPT_LAYOUT / "train.py"),
         "--max_iters=12", "--out_dir=data/out"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert shared.returncode == 2, shared.stdout + shared.stderr
    assert ("the job saves its checkpoints into what --link shows every run (data/out,"
            in shared.stderr), shared.stderr
    assert not (tmp_path / "shared" / "chaos").exists()  # refused before any run with faults


def test_a_linked_file_read_at_start_is_no_checkpoint_load(tmp_path):
    """A restart of nanoGPT's layout reads the linked configurator.py before its
    checkpoint: a fault at the restart's first checkpoint read fires in the read of
    out/ckpt.pt, not of configurator.py (nanoGPT's own train.py, blind in
    bench/incident_attribution.py, raised in `exec(open('configurator.py'))`)."""
    _nanogpt_layout(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--fault", "kill:rank=1,step=7",
         "--fault", "raise:rank=0,phase=checkpoint_load,event=1", "--max-relaunches", "0",
         "--max-restarts", "1", "--link", "configurator.py", "--link", "data", "--out",
         str(out), "--cache-dir", str(tmp_path / "cache"), "--", str(NANOGPT_LAYOUT / "train.py"),
         "--max_iters=12"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    loads = [json.loads(line) for line in (out / "chaos" / "_chaos" / "history" /
                                           "rank-0.jsonl").read_text().splitlines()]
    read = [e["path"] for e in loads if e.get("ev") == "load"]
    assert read and set(read) == {"out/ckpt.pt"}, read
    log = (out / "chaos" / "_chaos" / "logs" / "launch-0-node-0.log").read_text()
    fired = log[log.index("torchchaos fault raise") - 2000:log.index("torchchaos fault raise")]
    assert "configurator.py" not in fired and "torch.load" in fired, fired


# nanoGPT's train.py under torchrun, the DDP tutorial's model.to(local_rank), a CUDA
# tensor, an NCCL process group
NEEDS_A_GPU = ["torch.cuda.set_device('cuda:0')", "torch.nn.Linear(2, 2).to(0)",
               "torch.zeros(1, device='cuda')",
               "torch.distributed.init_process_group('nccl', store=torch.distributed.HashStore(),"
               " rank=0, world_size=1)"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="these calls succeed on a GPU machine")
def test_a_script_that_needs_a_gpu_is_told_so_in_torchs_own_words():
    """The hint matches what this torch really raises, not a string we made up."""
    program = ("import torch, torch.distributed\n"
               f"for call in {NEEDS_A_GPU!r}:\n"
               "    try:\n        eval(call)\n        print('no error:', call)\n"
               "    except Exception as exc:\n        print(f'{type(exc).__name__}: {exc}')\n")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            timeout=120)
    said = result.stdout.splitlines()
    assert len(said) == len(NEEDS_A_GPU), result.stdout + result.stderr
    for call, error in zip(NEEDS_A_GPU, said):
        assert "needs a GPU and this machine has none" in gpu_hint(error), (call, error)
    assert gpu_hint("RuntimeError: CUDA out of memory") == ""


def test_a_torchft_job_that_hangs_at_start_is_told_about_the_shared_store(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torchft\n")
    hint = _torchft_hint(Scenario(script=str(script)))
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0" in hint and "torchft" in hint
    assert _torchft_hint(Scenario(script=str(TARGET))) == ""
    # a file beside the script that uses torchft, which the script does not import: no hint
    # (tests/scripts/plain_ddp.py beside torchft_ddp.py was told to set the variable)
    (tmp_path / "train.py").write_text("import torch\nimport helpers\n")
    (tmp_path / "other_job.py").write_text("import torchft\n")
    (tmp_path / "helpers.py").write_text("import os\n")
    assert _torchft_hint(Scenario(script=str(script))) == ""
    (tmp_path / "helpers.py").write_text("from torchft import Manager\n")  # imported there
    assert "torchft" in _torchft_hint(Scenario(script=str(script)))


def test_a_restart_that_trains_spoils_the_reference_one_that_only_exits_does_not():
    """torch 2.13's gloo may abort a worker in its teardown after the last step; torchrun
    restarts it and the new worker, with nothing left to train, exits. That reference is
    sound (seen with the Hugging Face Trainer: "at max_steps: nothing to resume"). A
    restart that trains again is not: its steps would overwrite the first ones."""
    done = Timeline()
    done.train(2, range(1, 11))
    done.add("boot", **done.proc(1, attempt=1))  # restarted after the end, trains nothing
    done.add("exit", step=10, **done.proc(1, attempt=1))
    assert restarted_and_trained(done.history()) is None
    again = Timeline()
    again.train(2, range(1, 6))
    again.train(2, range(6, 11), attempt=1, restored=5)  # a crash mid-run, trained again
    found = restarted_and_trained(again.history())
    assert found is not None and found["attempt"] == 1 and found["ev"] == "boot"
