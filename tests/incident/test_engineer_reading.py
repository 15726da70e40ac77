"""Issue 61: incidents read as an engineer reads them.

A checkpoint's bytes (a torn file, the pointer that names it, a DCP shard shorter than
its metadata, a file much shorter than its siblings), a hang a time limit ended (a
py-spy dump that could not suspend a stopped rank, a rank that got less far), the
script the artefacts name, and a replay's signature compared field by field. Each
artefact here is written by the real writer (torch.save, DCP, py-spy's own words) or
taken from a blind review's job (tests/data/incidents/blind/)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from torchchaos.incident.attribute import attribute
from torchchaos.incident.command import named_command, replay_arguments
from torchchaos.incident.formats import checkpoints
from torchchaos.incident.formats.stack_dumps import Stacks
from torchchaos.incident.gather import gather
from torchchaos.incident.signature import Signature

DATA = Path(__file__).resolve().parents[1] / "data" / "incidents"


def _imported(*paths: Path):
    gathered = gather(list(paths))
    return attribute(gathered.observations, gathered.sources), gathered


def _torn_zip(path: Path, like: Path) -> None:
    """A torch.save file cut at half, as a death inside the write leaves it."""
    data = like.read_bytes()
    path.write_bytes(data[:len(data) // 2])


# -- the checkpoint folder, read for its bytes ---------------------------------------------

def test_a_pointer_names_the_checkpoint_it_points_at(tmp_path):
    torch.save({"w": torch.ones(4)}, tmp_path / "model_10.pt")
    (tmp_path / "latest.txt").write_text("model_10.pt\n")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("10\n")
    (tmp_path / "notes.txt").write_text("a run of the new optimiser\n")
    (tmp_path / "latest").symlink_to("model_10.pt")
    found = {o.source.file: o.extra["target"] for o in checkpoints.read_folder(tmp_path, "c")
             if o.what == "pointer"}
    assert found == {"c/latest.txt": "c/model_10.pt", "c/latest": "c/model_10.pt",
                     "c/latest_checkpointed_iteration.txt": "c/model_10.pt"}


def test_a_dcp_shard_shorter_than_its_metadata_says_is_cut_short(tmp_path):
    import torch.distributed.checkpoint as dcp

    whole, torn = tmp_path / "step_10", tmp_path / "step_20"
    for folder in (whole, torn):
        dcp.save({"a": torch.randn(16), "b": torch.randn(64, 64)}, checkpoint_id=str(folder),
                 no_dist=True)
    shard = torn / "__0_0.distcp"
    data = shard.read_bytes()
    # cut inside its last item: the items before it end as a whole zip does, so only
    # the extent .metadata gives the shard tells it is short
    shard.write_bytes(data[:len(data) - 100])
    assert all(o.extra["loads"] for o in checkpoints.read_folder(whole, "a")
               if o.what == "checkpoint")
    (cut,) = [o for o in checkpoints.read_folder(torn, "b") if o.extra.get("loads") is False]
    assert cut.source.file == "b/__0_0.distcp" and f"{len(data) - 100:,} bytes, where" \
        f" .metadata gives it {len(data):,}" in cut.detail, cut.detail


def test_a_file_with_no_trailer_much_shorter_than_its_siblings_is_cut_short(tmp_path):
    """A legacy (pickle) torch.save has no trailer to check: its size against the same
    file of other steps tells it; the first save (no optimiser state yet) is not told."""
    for step in (10, 20, 30):
        folder = tmp_path / f"step_{step}"
        folder.mkdir()
        state = {"w": torch.ones(256 if step > 10 else 16)}  # the first is small
        torch.save(state, folder / "rank1.pt", _use_new_zipfile_serialization=False)
    newest = tmp_path / "step_30" / "rank1.pt"
    newest.write_bytes(newest.read_bytes()[:200])
    gathered = gather([tmp_path])
    told = {o.source.file: o.extra["loads"] for o in gathered.observations
            if o.what == "checkpoint"}
    assert told == {f"{tmp_path.name}/step_10/rank1.pt": True,
                    f"{tmp_path.name}/step_20/rank1.pt": True,
                    f"{tmp_path.name}/step_30/rank1.pt": False}, told


def test_a_resume_that_died_on_a_torn_file_is_the_torn_save_not_an_exception():
    """The pointer-first writer's relaunch, alone (its first launch's log went with the
    node): before issue 61 this was "exception of rank 1, load", which a correct writer
    reproduces as well as the buggy one."""
    case = DATA / "torn" / "pointer_first_resume_only"
    incident, _ = _imported(*[p for p in sorted(case.iterdir()) if p.name != "expected.json"])
    f = incident.finding
    assert (f.kind, f.phase, f.role, f.step_window) == ("torn_write", "mid_save", "writer",
                                                       (20, None)), f.rules
    rule = f.rules[0]
    assert "ckpt/model_000020.pt is 131,072 bytes" in rule and "latest.txt points at it" \
        in rule and "model_000010.pt of step 10 is 526,927" in rule, rule
    assert incident.restart_failure is not None and incident.restart_failure.bad_data
    assert incident.recovery.startswith("failed while loading")


# -- the hang a time limit ended -----------------------------------------------------------

FAILED_DUMP = """Process 15693: /usr/bin/python3.11 -u /job/train.py /job/out --steps 400
Python v3.11.7 (/usr/bin/python3.11)

Error: Failed to get stack traces

Caused by:
    0: Failed to suspend process
    1: unexpected waitpid result PtraceEvent(Pid(15693), SIGSTOP, 128) to 15693

Stack backtrace:
   0: <E as anyhow::context::ext::StdError>::ext_context
"""


def test_a_dump_py_spy_could_not_take_of_a_stopped_process_is_read():
    (stack,) = Stacks().read(FAILED_DUMP.encode(), "stacks/rank1.txt")
    assert (stack.what, stack.rank, stack.pid, stack.frames) == ("stack", 1, 15693, ())
    assert stack.extra["stopped"] and stack.extra["dump_failed"]
    assert stack.extra["command"].endswith("/job/train.py /job/out --steps 400")


def test_a_stopped_rank_the_time_limit_ended_is_a_hang_of_that_rank():
    """A user's torchrun job on a real Slurm, rank 1 stopped after step 30, py-spy's
    dumps (rank 1's failed), the time limit: once a preemption of an unknown rank."""
    case = DATA / "slurm_real" / "user_stopped_rank_pyspy"
    incident, gathered = _imported(*[p for p in sorted(case.iterdir())
                                     if p.name != "expected.json"])
    f = incident.finding
    assert (f.kind, f.rank, f.how) == ("hang", 1, "stacks taken, ended by the time limit")
    assert any("could not suspend it" in r for r in f.rules), f.rules
    named = named_command(gathered.observations)
    assert named is not None and named.script.endswith("stopping_trainer.py")
    assert named.args[1:] == ["--steps", "400", "--stop-rank", "1", "--stop-at", "30"]
    assert "py-spy's process line" in named.source


def test_a_time_limit_on_untimed_steps_fits_a_hang_and_a_preemption(tmp_path):
    log = "step 1 loss 0.3\nstep 2 loss 0.2\nstep 3 loss 0.2\n" \
        "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-12-02T10:00:00 DUE TO" \
        " TIME LIMIT ***\n"
    (tmp_path / "slurm-7.out").write_text(log)
    incident, _ = _imported(tmp_path)
    f = incident.finding
    assert f.kind == "preempt" and f.alternatives == ["hang"], f.rules
    assert f.step_window == (3, None)  # the scheduler's line among the steps places it
    assert any("preempt or hang" in u for u in incident.unknowns)


def test_the_rank_that_printed_nothing_after_its_last_step_stopped_first(tmp_path):
    """The blind review's stopped_rank_timestamps, cut down: both ranks log step 30,
    rank 0 then logs one more line, rank 1 none; then 40 s of silence and the limit."""
    lines = [f"2026-12-02 13:48:{10 + n // 2:02d},{(n % 2) * 500:03d} INFO  rank{r} train:"
             f" step={n} loss=4.1" for n in range(1, 31) for r in (1, 0)]
    lines.append("2026-12-02 13:48:25,672 INFO  rank0 train: refreshed manifest: 2 shards")
    lines.append("slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-12-02T13:49:10 DUE TO"
                 " TIME LIMIT ***")
    (tmp_path / "job.log").write_text("\n".join(lines) + "\n")
    f = _imported(tmp_path)[0].finding
    assert (f.kind, f.rank) == ("hang", 1), f.rules
    # the same log where both ranks' last line is their step line: not known
    (tmp_path / "job.log").write_text("\n".join(lines[:-2] + lines[-1:]) + "\n")
    f = _imported(tmp_path)[0].finding
    assert (f.kind, f.rank) == ("hang", None), f.rules


# -- the blind review's wrong answers, cut down to their evidence --------------------------

def test_a_whole_job_killed_inside_an_atomic_save_is_a_node_down_mid_save(tmp_path):
    """torn_safe_writer: "[r0] it=120" lines, a save's ".tmp-x.part" leftover, and a
    relaunch that "restored step-80.pt -> continuing after step 80": once "no failure is
    told"."""
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    for step in (40, 80):
        torch.save({"w": torch.ones(8)}, ckpt / f"step-{step}.pt")
    (ckpt / ".tmp-3ki6r1l8.part").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    (ckpt / "LATEST").write_text("step-80.pt\n")
    first = "".join(f"[r0] it={n} loss=0.5\n[r1] it={n} loss=0.5\n" for n in range(1, 121))
    first = first.replace("[r0] it=41 ", "[r0] checkpoint step-40.pt written in 0.47s\n"
                          "[r0] it=41 ").replace("[r0] it=81 ", "[r0] checkpoint step-80.pt"
                                                 " written in 0.52s\n[r0] it=81 ")
    (tmp_path / "job-1.log").write_text(first)
    (tmp_path / "job-2.log").write_text("[r1] restored step-80.pt -> continuing after step 80\n"
                                        "[r0] restored step-80.pt -> continuing after step 80\n"
                                        "[r0] it=81 loss=0.4\n")
    incident, gathered = _imported(tmp_path)
    f = incident.finding
    assert (f.kind, f.phase, f.step_window[0]) == ("node", "mid_save", 120), f.rules
    assert "torn_write" in f.alternatives
    assert not gathered.passed_over
    assert incident.recovery.startswith("resumed: [r1] restored step-80.pt")


def test_a_table_row_names_its_step():
    """dcp_missing_metadata's log: "| it | 120 | 0.54" rows, once passed over."""
    from torchchaos.incident.formats.trainlog import TrainingLog

    found = [(o.what, o.step) for o in TrainingLog().read(b"| it | 120 | 0.54278\n", "j.log")
             if o.what != "rank_line"]
    assert found == [("step", 120)]


def test_the_blind_reviews_power_loss_is_one():
    """power_loss_shard: the log said the save of step 150 done and trained on; the
    relaunch died on its empty shard; once a kill mid-save, read off the relaunch's
    lost connection."""
    case = DATA / "blind" / "power_loss_shard"
    f = _imported(*[p for p in sorted(case.iterdir()) if p.name != "expected.json"])[0].finding
    assert (f.kind, f.phase, f.phase_seen) == ("power_loss", "between_saves", True), f.rules


# -- the script a replay runs --------------------------------------------------------------

def test_a_batch_script_names_the_command_and_its_paths_become_the_run_directorys(tmp_path):
    (tmp_path / "job.sbatch").write_text(
        "#!/bin/bash\n#SBATCH --time=00:01:00\ncd /job\n"
        "torchrun --standalone --nproc_per_node 2 \\\n"
        "    /job/train.py /job/out-$SLURM_JOB_ID --steps 400  # the run\n")
    (tmp_path / "slurm-3.out").write_text("step 1 loss 0.3\n")
    gathered = gather([tmp_path / "job.sbatch", tmp_path / "slurm-3.out"])
    named = named_command(gathered.observations)
    assert (named.script, named.args) == ("/job/train.py",
                                          ["/job/out-$SLURM_JOB_ID", "--steps", "400"])
    config = tmp_path / "config.yaml"
    config.write_text("lr: 1\n")
    kept, said = replay_arguments([*named.args, "--config", str(config)])
    assert kept == ["out", "--steps", "400", "--config", str(config)]
    assert said == ["/job/out-$SLURM_JOB_ID -> out (a path of the job's machine: the replay"
                    " writes only inside its run directory)"]


def test_the_import_replays_on_the_script_the_artefacts_name(tmp_path, capsys):
    """A traceback names the pointer trainer by its path (not its arguments): with
    no --script the replay runs it, and says so; a named script that is not on this
    machine is said, and the bundled target stands in."""
    from torchchaos.cli.main import main

    case = DATA / "torn" / "pointer_first_resume_only"
    log = (case / "job-2.log").read_text().replace("/work/main/tests/scripts/",
                                                   str(Path(__file__).parents[1] / "scripts")
                                                   + "/")
    here = tmp_path / "here"
    (here / "ckpt").mkdir(parents=True)
    (here / "job-2.log").write_text(log)
    for p in (case / "ckpt").iterdir():
        (here / "ckpt" / p.name).write_bytes(p.read_bytes())
    args = ". --steps 30 --save-every 10 --size-mb 0.5 --pointer-first"
    rc = main(["incident", "import", str(here), "-o", str(tmp_path / "a.chaos.yaml"),
               "--args", args, "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    out = out.out
    assert rc == 0 and "replaying on " + str(Path(__file__).parents[1] / "scripts" /
                                             "pointer_trainer.py") in out, out
    assert "(named by here/job-2.log:5, the traceback's <module> frame)" in out, out
    assert f"its arguments: {args} (--args)" in out
    (here / "job-2.log").write_text(log.replace(str(Path(__file__).parents[1]), "/nowhere"))
    rc = main(["incident", "import", str(here), "-o", str(tmp_path / "b.chaos.yaml"),
               "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    out = capsys.readouterr().out
    assert "replaying on the bundled target: the artefacts name /nowhere/scripts/" \
        "pointer_trainer.py" in out and "which is not on this machine" in out, out


# -- "reproduced" only when it was ---------------------------------------------------------

def test_a_replay_differs_in_each_field_it_does_not_share():
    torn = Signature("torn_write", "writer", "mid_save", fits=("kill", "node", "power_loss"),
                     recovery="failed while loading", rank=None, step=20)
    told_as_a_node = Signature("node", "node", "mid_save", fits=("power_loss", "torn_write"),
                               recovery="failed while loading")
    assert torn.differences(told_as_a_node) == []  # the kinds the artefacts fit meet
    hang = Signature("hang", "other", "between_saves", rank=1, step=15)
    preempt = Signature("preempt", "other", "between_saves", how="SIGTERM", rank=1, step=32,
                        recovery="resumed")
    assert hang.differences(preempt) == ["kind: the incident's 'hang', the replay's 'preempt'"]
    assert hang.differences(preempt, steps_kept=True) == [
        "kind: the incident's 'hang', the replay's 'preempt'",
        "step: the incident's 15, the replay's 32"]
    assert Signature.from_dict(json.loads(json.dumps(torn.to_dict()))) == torn


def test_a_hang_the_time_limit_ended_replays_at_its_step_bounded_as_the_limit_bounded_it():
    """On the script it came from, the stop is placed after the step the artefacts give
    (30, not the reference's choice), on the rank they name, and the replay calls it a
    hang after a minute rather than waiting out the job's hour-long collective timeout."""
    from torchchaos.incident.importing import import_artefacts
    from torchchaos.scenario.model import Scenario

    case = DATA / "slurm_real" / "user_stopped_rank_pyspy"
    script = Path(__file__).resolve().parents[1] / "scripts" / "stopping_trainer.py"
    imported = import_artefacts([p for p in sorted(case.iterdir()) if p.name != "expected.json"],
                                Scenario.build(str(script), args=[".", "--steps", "60"]),
                                None, lambda _m: None)
    assert [f.text for f in imported.file.scenario.faults] == ["hang:rank=1,step=30,mode=stop"]
    assert imported.file.scenario.hang_timeout == 60.0
    assert imported.file.incident["steps_kept"] is True
    assert any("time limit ended the hang" in line for line in imported.said)


def test_a_batch_script_that_names_the_script_by_path_keeps_the_incidents_steps():
    """The blind review's preemption: its batch script names the script by a path of the
    job's machine; the replay on a script of that name is the same script, so the
    SIGTERM lands after the incident's step 137, not the reference's choice (once 187)."""
    from torchchaos.incident.importing import import_artefacts
    from torchchaos.scenario.model import Scenario

    case = DATA / "blind" / "preempted_while_training"
    script = Path(__file__).resolve().parents[1] / "scripts" / "blind" / "sharded_ckpt_train.py"
    imported = import_artefacts([p for p in sorted(case.iterdir()) if p.name != "expected.json"],
                                Scenario.build(str(script), args=[]), None, lambda _m: None)
    assert imported.same_script and imported.incident.script == "sharded_ckpt_train.py"
    assert [f.text for f in imported.file.scenario.faults] == \
        ["kill:rank=1,step=137,signal=SIGTERM,grace=30"]
