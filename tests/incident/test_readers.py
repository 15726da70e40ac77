"""Each reader on the lines its tool writes: what it takes from them, with their source."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from torchchaos.incident.formats.checkpoints import rank_of, read_folder, step_of
from torchchaos.incident.formats.collectives import CollectiveErrors
from torchchaos.incident.formats.errorfile import ErrorFile
from torchchaos.incident.formats.flight import FlightRecorder
from torchchaos.incident.formats.kernel import KernelLog
from torchchaos.incident.formats.kubernetes import KubernetesStatus
from torchchaos.incident.formats.slurm import Sacct, SlurmOutput
from torchchaos.incident.formats.stack_dumps import Stacks
from torchchaos.incident.formats.torchrun import TorchrunLog
from torchchaos.incident.formats.trainlog import TrainingLog
from torchchaos.incident.readers import BadArtefact

DATA = Path(__file__).resolve().parents[1] / "data" / "incidents"


def read(reader, path: Path) -> list:
    data = path.read_bytes()
    assert reader.sniff(data, path.name), path
    return reader.read(data, path.name)


def test_torchrun_log_worker_failures_launcher_stops_and_the_summary():
    found = read(TorchrunLog(), DATA / "kill" / "launcher.log")
    failed = [o for o in found if o.what == "exit" and "local_rank" in o.extra
              and "root_cause" not in o.extra]
    assert [(o.rank, o.signal) for o in failed] == [(1, "SIGKILL")]
    assert any(o.reason == "stopped by the launcher" for o in found)
    summary = read(TorchrunLog(), DATA / "load" / "launcher.log")
    roots = [o for o in summary if o.extra.get("root_cause")]
    assert len(roots) == 1 and roots[0].extra["script"] == "incident_probe.py"
    assert roots[0].detail  # the root cause's own last line, not torchrun's banner


def test_the_launchers_stop_in_either_of_its_modes():
    lines = (b"W1128 11:08:04.721000 3436 site-packages/torch/distributed/elastic/"
             b"multiprocessing/api.py:937] Closing process 3447 via signal SIGTERM\n"
             b"W1128 10:52:12.721000 29670 site-packages/torch/distributed/elastic/"
             b"multiprocessing/api.py:1028] Sending process 29674 closing signal SIGTERM\n"
             b"W1128 13:59:16.129000 16673 site-packages/torch/multiprocessing/spawn.py:165]"
             b" Terminating process 16676 via signal SIGTERM\n")
    found = TorchrunLog().read(lines, "launch.log")
    assert [(o.pid, o.signal, o.reason) for o in found] == [
        (3447, "SIGTERM", "stopped by the launcher"), (29674, "SIGTERM", "stopped by the launcher"),
        (16676, "SIGTERM", "stopped by the launcher")]


def test_rank_tagged_tracebacks_keep_their_rank_and_last_line():
    errors = [o for o in read(TorchrunLog(), DATA / "raise" / "launcher.log")
              if o.what == "error" and o.rank == 1]
    assert errors[0].detail == "RuntimeError: loss scaler state is inconsistent"
    assert errors[0].frames[-1].startswith("fail (incident_probe.py:")


def test_error_file_message_frames_and_attempt_from_its_path():
    path = DATA / "raise" / "torchrun" / "attempt_0" / "1" / "error.json"
    (error,) = ErrorFile().read(path.read_bytes(), "torchrun/attempt_0/1/error.json")
    assert (error.rank, error.attempt) == (1, 0)
    assert error.detail.startswith("RuntimeError: loss scaler")
    assert error.source.key == "message.message"


def test_gloo_and_nccl_collective_lines():
    gloo = read(CollectiveErrors(), DATA / "hang" / "launcher.log")
    assert any(o.what == "collective_timeout" and o.rank == 0 for o in gloo)
    nccl = read(CollectiveErrors(), DATA / "from_schemas" / "nccl_watchdog" / "launcher.log")
    timeouts = [o for o in nccl if o.what == "collective_timeout"]
    assert sorted(o.rank for o in timeouts) == [0, 1, 3]
    assert {(o.seq, o.collective) for o in timeouts} == {(20001, "all_reduce")}


def test_py_spy_dump_names_the_frame_each_rank_is_in():
    stacks = {o.rank: o for path in sorted((DATA / "hang" / "stacks").iterdir())
              for o in read(Stacks(), path)}
    assert stacks[0].phase == "collective"  # waiting in the all-reduce
    assert stacks[1].frames[-1].startswith("fail (")  # the sleeping rank, in its own code


def test_faulthandler_dump_of_a_segfault():
    found = [o for o in read(Stacks(), DATA / "segv" / "launcher.log") if o.what == "exit"]
    assert found and found[0].signal == "SIGSEGV"
    assert found[0].frames[-1].startswith("string_at (")  # innermost last: ctypes' read
    assert found[0].frames[-2].startswith("fail (incident_probe.py:")



@pytest.mark.parametrize("name, rank", [
    ("launch-0-node-0.log", None),  # a launcher's log: its number is the node's
    ("rank-1.txt", 1), ("stacks_1.txt", 1), ("pyspy.3.dump", 3),
    ("logs/run/attempt_0/1/stderr.log", 1),  # torchrun --log-dir: the worker's folder
])
def test_a_faulthandler_dump_takes_a_rank_only_from_a_name_that_says_one(name, rank):
    dump = (DATA / "segv" / "launcher.log").read_bytes()
    found = [o for o in Stacks().read(dump, name) if o.what == "exit"]
    assert [o.rank for o in found] == [rank]


def test_torchruns_folder_per_worker_gives_its_untagged_lines_their_rank_and_attempt():
    """torchrun --log-dir --redirects 3: each worker's stdout.log and stderr.log, in
    attempt_N/<local rank>/, carry no rank tag (a rank's print, an error before the
    process group was up)."""
    run = next((DATA / "torchrun_log_dir" / "logs").iterdir())
    shown = f"logs/{run.name}/attempt_0/0/stdout.log"
    steps = TrainingLog().read((run / "attempt_0" / "0" / "stdout.log").read_bytes(), shown)
    assert [(o.rank, o.attempt, o.step) for o in steps] == [(0, 0, 10), (0, 0, 20), (0, 0, 30)]
    shown = f"logs/{run.name}/attempt_1/0/stderr.log"
    data = (run / "attempt_1" / "0" / "stderr.log").read_bytes()
    assert TorchrunLog().sniff(data, shown)
    errors = [o for o in TorchrunLog().read(data, shown) if o.what == "error"]
    assert [(o.rank, o.attempt) for o in errors] == [(0, 1)]
    assert "Gloo connectFullMesh failed" in errors[0].detail


def test_kernel_oom_lines():
    (kill,) = read(KernelLog(), DATA / "oom" / "kernel.log")
    assert kill.what == "oom_kill" and kill.pid and kill.extra["scope"] == "cgroup"


def test_training_log_steps_saves_and_resumes():
    found = read(TrainingLog(), DATA / "kill" / "launcher.log")
    assert [o.step for o in found if o.what == "resume"] == [4]
    assert {o.step for o in found if o.what == "save"} >= {4, 8, 12}
    assert max(o.step for o in found if o.what == "step") == 12


@pytest.mark.parametrize(("line", "rank"), [
    ("[rank: 1] Received SIGTERM: 15", 1),                 # Lightning
    ("got signal 15, exiting", None),                      # a script's own handler
    ("[rank0]: caught SIGTERM, saving and exiting", 0),
    ("SIGTERM received: checkpointing", None)])
def test_a_sigterm_the_script_says_it_got(line, rank):
    found = TrainingLog().read(line.encode() + b"\n", "launch.log")
    assert [(o.what, o.signal, o.rank) for o in found] == [("signal", "SIGTERM", rank)]


@pytest.mark.parametrize("line", ["Received 15 batches from the loader", "got 15 samples"])
def test_a_count_of_15_is_no_signal(line):
    assert not any(o.what == "signal" for o in TrainingLog().read(line.encode(), "a.log"))


def test_lightnings_restore_line_is_a_resume():
    line = b"Restoring states from the checkpoint path at /job/ckpt/last.ckpt\n"
    assert [o.what for o in TrainingLog().read(line, "launch.log")] == ["resume"]


@pytest.mark.parametrize(("line", "what", "step"), [
    ("2026-11-28 13:47:03,011 | INFO | rank=0 | restored state from runs/ckpt/global_step_10,"
     " continuing at global_step=10", "resume", 10),
    ("  Continuing training from checkpoint, will skip to saved global_step", "resume", None),
    ("successfully loaded checkpoint from /ckpt at iteration 400", "resume", 400),
    ("resumed from ckpt/step-000010.pt at step 10", "resume", 10),
    ("2026-11-28 13:50:11,573 | INFO | rank=0 | checkpoint global_step=10 committed in 0.005s",
     "save", 10),
    ("saving checkpoint to ckpt/step-10.pt", "save", 10),
    ("global_step=12 loss=3.3760 lr=1.0e-03 dt=9.5ms", "step", 12),
    ("2026-11-28 15:09:57,805 ignite_trainer INFO: Epoch[1] Iteration[12/20] Loss: 2.3271",
     "step", 12),                                               # Ignite
    ("Epoch [1/10], Step [100/600], Loss: 0.2153", "step", 100),  # the tutorials'
    ("trainer INFO: Epoch[1] Complete. Time taken: 00:00:00.060", None, None),
    ("2026-11-28 13:47:59,447 | INFO | rank=0 | no usable checkpoint under runs/ckpt,"
     " training from scratch (global_step=0)", "no_checkpoint", None),
    ('.fit(ckpt_path="last") is set, but there is no last checkpoint available. No'
     " checkpoint will be loaded.", "no_checkpoint", None),       # Lightning
    ("could not find a valid checkpoint in /ckpt, starting fresh", "no_checkpoint", None),
    ("[trainer] 2026-11-28 14:05:00,376 - INFO - Finished loading the checkpoint in 0.55"
     " seconds; resuming after step 10.", "resume", 10),
    ("[trainer] 2026-11-28 14:05:00,376 - INFO - Loading the checkpoint at step 10.", None,
     None),                                                     # begun: not yet resumed
    ("loading checkpoint from /ckpt/step-10", None, None),
    ("Continuing without a checkpoint", None, None),
    ("Restored tokenizer from the hub cache", None, None),
    ("continuing at lr 1.0e-03", None, None),
    # pytorch/examples' DDP tutorial: a checkpoint is a "snapshot", counted by epoch
    ("Epoch 1 | Training snapshot saved at snapshot.pt", "save", None),
    ("Resuming training from snapshot at Epoch 1", "resume", None),
    # torch.cuda.memory's snapshots, in its tutorial's words and others: no checkpoint
    ("Saving snapshot to local file: profile.pickle", None, None),
    ("Saved memory snapshot to snapshot.pt", None, None),
    ("Memory-snapshot saved: mem_rank0.pt", None, None),
    ("Writing snapshot of CUDA memory at step 20 to mem_rank0.pt", None, None),
    ("Saved profiler snapshot to trace.pt.trace.json", None, None),
    # a save announced, and a load of what was saved: no save done
    ("Checkpoints will be saved to ckpt/ every 500 steps", None, None),
    ("Loading model snapshot saved at snapshot.pt", None, None)])
def test_resume_and_save_lines_in_other_teams_words(line, what, step):
    found = [(o.what, o.step) for o in TrainingLog().read(line.encode() + b"\n", "launch.log")]
    if what:
        assert found == [(what, step)], found
    else:
        assert not [w for w, _ in found if w in ("resume", "save")], found


def test_torchchaos_own_wrappers_of_torch_load_and_save_tell_the_phase():
    """A fault injected at a load raises inside the agent's wrapper, before torch's own
    frames: the wrapper is the load (a script that loads inline, in `main`)."""
    from torchchaos.incident.observations import phase_of_frames

    frames = ["main (logging_trainer.py:152)", "load (iowatch.py:345)", "emit (iowatch.py:158)",
              "fire (exception.py:126)"]
    assert phase_of_frames(frames) == "load"
    assert phase_of_frames(["main (train.py:9)", "whole (torchchaos/rank/iowatch.py:330)"]) \
        == "save"
    assert phase_of_frames(["main (train.py:9)", "load (mylib/io.py:3)"]) is None


def test_a_rank_held_by_the_hang_fault_at_a_collective_has_not_entered_it():
    """A replay of a hang holds the rank in a stand-in for `dist.all_reduce`, called by
    Ignite's wrappers that are named all_reduce (the replay of ignite/08, whose peer
    waited in torch's all_reduce): the held rank is outside every collective, so the
    replay's import names it as the hung one. A hold inside a save still says save."""
    from torchchaos.incident.observations import phase_of_frames

    site = "/usr/lib/python3.11/site-packages"
    ignite = f"{site}/ignite/distributed"
    outer = ["main (ignite_trainer.py:161)", "training.<locals>.train_step (ignite_trainer.py:87)",
             f"all_reduce ({ignite}/utils.py:353)",
             f"ComputationModel.all_reduce ({ignite}/comp_models/base.py:226)",
             f"_NativeDistModel._do_all_reduce ({ignite}/comp_models/native.py:449)"]
    held = outer + ["_arm_hold.<locals>.held_collective (/work/main/faults/hang.py:153)",
                    "_hold (/work/main/faults/hang.py:173)"]
    waiting = outer + [f"all_reduce ({site}/torch/distributed/distributed_c10d.py:3252)"]
    assert phase_of_frames(held) is None
    assert phase_of_frames(waiting) == "collective"
    stopped_in_save = ["main (train.py:9)", "save_checkpoint (train.py:40)",
                       f"_stop ({site}/torchchaos/faults/hang.py:128)"]
    assert phase_of_frames(stopped_in_save) == "save"


def test_a_line_the_script_starts_with_its_rank_is_that_ranks_even_glued_to_another():
    """Two ranks printing at once: each print is two writes (text, then newline), so the
    second rank's text lands on the first's line, as in tests/data/incidents/harness/
    oom_glued_resume_lines. A word that only begins with "rank" names none."""
    log = (b"rank 0 resumed from ckpt/step-0015.ptrank 1 resumed from ckpt/step-0015.pt\n\n"
           b"[rank 1] step 4 loss 0.3\nRank 2: saved checkpoint step 5\n"
           b"the ranking 3 step 9\n[rank0]: step 7\n")
    found = [(o.what, o.rank, o.step) for o in TrainingLog().read(log, "train.log")
             if o.what != "rank_line"]
    assert found == [("resume", 0, 15), ("resume", 1, 15), ("step", 1, 4), ("save", 2, 5),
                     ("step", None, 9), ("step", 0, 7)]


def test_pod_json_oom_killed_container_and_its_node():
    found = read(KubernetesStatus(), DATA / "from_schemas" / "k8s_oom" / "pod.json")
    (oom,) = [o for o in found if o.what == "oom_kill"]
    assert (oom.reason, oom.exitcode, oom.extra["node"]) == ("OOMKilled", 137, 2)
    assert str(oom.source) == "pod.json:status.containerStatuses[0].lastState.terminated"


def test_pytorchjob_conditions():
    found = read(KubernetesStatus(), DATA / "from_schemas" / "pytorchjob" / "job.json")
    assert [o.what for o in found] == ["restart", "job_state"]
    assert found[1].reason == "Failed"


@pytest.mark.parametrize("path,state", [
    ("slurm_real/node_failure/sacct.txt", "NODE_FAIL"),  # a real job's, -D -P
    ("from_schemas/slurm_oom/sacct.txt", "OUT_OF_MEMORY")])  # no memory limit here: docs'
def test_sacct_parsable_and_in_columns(path, state):
    found = read(Sacct(), DATA / path)
    assert found[0].reason == state


@pytest.mark.parametrize("line, what, reason", [
    ("slurmstepd: error: *** JOB 4242 ON gpu-a CANCELLED AT 2024-05-01T12:05:09 DUE TO NODE"
     " FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", "node_lost", "NODE_FAIL"),
    ("srun: error: Node failure on gpu-b", "node_lost", "NODE_FAIL"),
    ("slurmstepd: error: *** STEP 4242.0 ON gpu-a CANCELLED AT 2024-05-01T12:05:09 DUE TO"
     " PREEMPTION ***", "node_lost", "PREEMPTED"),
    ("slurmstepd: error: *** JOB 4242 ON gpu-a CANCELLED AT 2024-05-01T12:05:09 DUE TO TIME"
     " LIMIT ***", "job_state", "TIMEOUT"),
    ("slurmstepd: error: *** JOB 4242 ON gpu-a CANCELLED AT 2024-05-01T12:05:09 ***",
     "job_state", "CANCELLED"),
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks"
     " have been OOM Killed.", "oom_kill", "OUT_OF_MEMORY"),
    ("slurmstepd: error: Detected 2 oom-kill event(s) in step 4242.batch cgroup. Some of your"
     " processes may have been killed by the cgroup out-of-memory handler.", "oom_kill",
     "OUT_OF_MEMORY"),
])
def test_slurms_lines_in_a_jobs_output(tmp_path, line, what, reason):
    out = tmp_path / "slurm-4242.out"
    out.write_text(f"step 100 loss 3.9\n{line}\n")
    (found,) = read(SlurmOutput(), out)
    assert (found.what, found.reason, found.source.line) == (what, reason, 2)
    if line.startswith("srun"):
        assert found.host == "gpu-b"


def test_a_log_without_slurms_lines_is_not_slurms():
    assert not SlurmOutput().sniff(b"step 1 loss 2.0\nsaved checkpoint ckpt/step-1.pt\n", "x")


def test_flight_recorder_pickle_as_torch_writes_it_and_json():
    pickled = DATA / "raise" / "fr" / "rank0"
    (rank0,) = read(FlightRecorder(), pickled)
    assert rank0.rank == 0 and rank0.collective in ("all_reduce", "barrier")
    (rank2,) = read(FlightRecorder(), DATA / "from_schemas" / "nccl_watchdog"
                    / "fr_trace_rank_2.json")
    assert (rank2.rank, rank2.seq) == (2, 20000)


def test_a_flight_dump_that_would_run_code_is_refused():
    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    data = pickle.dumps({"pg_config": {}, "entries": [Boom()]})
    assert FlightRecorder().sniff(data, "rank0")
    with pytest.raises(BadArtefact, match="not plain data"):
        FlightRecorder().read(data, "rank0")


def test_checkpoint_folder_a_cut_file_a_leftover_and_a_good_one(tmp_path):
    good = (DATA / "kill" / "ckpt" / "step-0004.pt").read_bytes()
    (tmp_path / "step-0004.pt").write_bytes(good)
    (tmp_path / "step-0008.pt").write_bytes(good[: len(good) // 2])
    (tmp_path / "step-0012.pt.tmp").write_bytes(good)
    found = {o.source.file.split("/")[-1]: o for o in read_folder(tmp_path, "ckpt")}
    assert found["step-0004.pt"].extra["loads"] is True
    assert found["step-0008.pt"].extra["loads"] is False
    assert "cut short" in found["step-0008.pt"].detail
    assert found["step-0012.pt.tmp"].extra["temp"] is True


@pytest.mark.parametrize(("name", "rank"), [
    ("__1_0.distcp", 1), ("__0_3.distcp", 0),              # DCP: __{rank}_{n}
    ("rank_1.pt", 1), ("model_rank3.pt", 3), ("optim-rank-2.pt", 2), ("rank1.safetensors", 1),
    ("mp_rank_01_model_states.pt", None),                  # a tensor-parallel index
    ("zero_pp_rank_3_mp_rank_00_optim_states.pt", None),   # indices inside groups
    ("step-000010.pt", None), ("rng_state_1.pth", None), ("crankshaft3.pt", None),
    (".metadata", None)])
def test_a_checkpoint_file_names_the_global_rank_that_wrote_it_or_none(name, rank):
    assert rank_of(name) == rank


@pytest.mark.parametrize(("path", "step"), [
    ("ckpt/step-0030.pt", 30), ("ckpt/epoch=1-step=10.ckpt", 10), ("ckpt/ckpt_100.pt", 100),
    ("ckpt/step-000010/__1_0.distcp", 10), ("ckpt/step-000010/.metadata", 10),  # DCP
    ("checkpoints/step_20/rank_1.pt", 20), ("out/checkpoint-15/rng_state_1.pth", 15),
    ("ckpt2/step-0010.pt", 10), ("ckpt/step-0012.pt.tmp", 12),
    ("ckpt/last.ckpt", None), ("ckpt/model_rank1.pt", None), ("ckpt/.tmp-mli_i8pq", None),
    ("mp_rank_00/model_optim_rng.pt", None), ("ckpt/mp_rank_00_model_states.pt", None),
    ("global_step100/mp_rank_00_model_states.pt", 100)])  # DeepSpeed
def test_a_checkpoint_files_step_is_never_a_rank_a_shard_or_random_letters(path, step):
    assert step_of(Path(path)) == step


def test_dcp_shards_tell_the_ranks_of_the_job():
    found = read_folder(DATA / "harness" / "dcp_oom_under_record" / "ckpt" / "step-000020",
                        "ckpt/step-000020")
    assert sorted(o.rank for o in found if o.rank is not None) == [0, 1]


def test_an_error_file_cut_short_is_said_so(tmp_path):
    text = (DATA / "raise" / "torchrun" / "attempt_0" / "1" / "error.json").read_bytes()
    with pytest.raises(BadArtefact, match="cut off"):
        ErrorFile().read(text[: len(text) // 2], "error.json")
    assert json.loads(text)  # the whole one is JSON


def test_two_ranks_untagged_tracebacks_interleaved_keep_the_error_line():
    """As the bundled target's two ranks printed them into one log (seen in a replay)."""
    log = b"\n".join([
        b"Traceback (most recent call last):",
        b"Traceback (most recent call last):",
        b'  File "/work/targets/launch.py", line 123, in run',
        b'  File "/work/targets/launch.py", line 123, in run',
        b"    main()",
        b'  File "/usr/lib/python3/torch/serialization.py", line 1520, in load',
        b"RuntimeError: PytorchStreamReader failed reading zip archive: not a ZIP archive.",
        b"RuntimeError: PytorchStreamReader failed reading zip archive: not a ZIP archive.",
    ])
    errors = [o for o in TorchrunLog().read(log, "job.log") if o.what == "error"]
    assert errors[0].detail.startswith("RuntimeError: PytorchStreamReader")
    assert errors[0].phase == "load"


# tests/scripts/jsonlog_trainer.py's records, each "ts" and "level" left out
JSON_LOG = "".join(json.dumps(record) + "\n" for record in [
    {"rank": 0, "event": "run_start", "steps": 20},
    {"rank": 0, "event": "ckpt_not_found", "step": 0},
    {"rank": 0, "event": "train_step", "step": 5, "loss": 3.2},
    {"rank": 0, "event": "ckpt_save_begin", "path": "ckpts/ckpt-000005.pt", "step": 5},
    {"rank": 0, "event": "ckpt_save_end", "path": "ckpts/ckpt-000005.pt", "step": 5},
    {"rank": 1, "event": "ckpt_resume", "path": "ckpts/ckpt-000005.pt", "step": 5},
    {"rank": 1, "event": "sigterm", "step": 7, "signal": 15},
    {"rank": 0, "event": "ckpt_load_failed", "step": 5}]).encode()


def test_a_structured_log_reads_as_the_sentences_its_records_stand_for(tmp_path):
    """tests/scripts/jsonlog_trainer.py's records: a file that opens with "{" was taken
    for one JSON document, and nothing in it was read."""
    (tmp_path / "launch-0-node-0.log").write_bytes(JSON_LOG)
    found = read(TrainingLog(), tmp_path / "launch-0-node-0.log")
    assert [(o.what, o.rank, o.step) for o in found] == [
        ("no_checkpoint", 0, None), ("step", 0, 5), ("save", 0, 5), ("save", 0, 5),
        ("resume", 1, 5), ("signal", 1, None),
        ("step", 0, 5)]  # a failure's record (ckpt_load_failed) is kept as it is said
    assert found[2].detail.startswith("saving checkpoint ckpts/ckpt-000005.pt")
    assert found[3].detail.startswith("saved checkpoint")


@pytest.mark.parametrize("document", [
    b'{"step": 10, "files": ["__0_0.distcp"]}\n',                # a manifest, one line
    b'{\n  "step": 10,\n  "loss": 3.2\n}\n',                      # pretty-printed
    b'{"step": 10}\n{"step": 11\n'])                             # the second line is cut
def test_a_json_document_is_no_structured_log(document):
    assert not TrainingLog().sniff(document, "state.json")



def test_a_scripts_own_save_function_is_a_save():
    """A peer that waits in the barrier of the script's `save_ckpt` waits inside a save
    (the import looks for a save frame anywhere on a peer's stack)."""
    from torchchaos.incident.observations import phase_of_frames

    assert phase_of_frames(["main (jsonlog_trainer.py:182)",
                            "save_ckpt (jsonlog_trainer.py:125)"]) == "save"
    assert phase_of_frames(["_save_checkpoint (trainer.py:3)"]) == "save"
    assert phase_of_frames(["save_metrics (train.py:3)"]) is None


def test_a_step_line_that_ends_saying_saved_is_the_step_and_its_save_done():
    """bench/targets/adamw_trainer.py prints a step's line only at its saves."""
    from torchchaos.incident.formats.trainlog import TrainingLog

    log = b"step 10 loss 2.2366 saved\nstep 11 loss 2.2 (3 samples saved to disk later)\n"
    found = [(o.what, o.step, o.source.line) for o in TrainingLog().read(log, "t.log")]
    assert found == [("step", 10, 1), ("save", 10, 1), ("step", 11, 2)], found


def test_a_stack_dump_is_no_launchs_log():
    """py-spy's dumps taken during a hang (stacks/rank-0.txt, rank-1.txt) are read for
    their stacks, and are not compared as a launch and its relaunch."""
    from torchchaos.incident.gather import gather

    gathered = gather([Path(__file__).resolve().parents[1] / "data" / "incidents" / "hang"])
    logs = [o.source.file for o in gathered.observations if o.what == "log_file"]
    assert logs == ["hang/launcher.log"], logs


@pytest.mark.parametrize("line, finished", [
    ("Training done for this job.", True), ("done at step 15", True), ("Done!", True),
    ("Reached time budget (3h50m), exiting cleanly.", True),
    ("Training completed. Do not forget to share your model on huggingface.co/models =)", True),
    ("`Trainer.fit` stopped: `max_steps=20` reached.", True),
    ("Engine run complete. Time taken: 00:00:01", True),
    ("Finished epoch 3", False), ("done loading data", False), ("Epoch 3 complete", False),
])
def test_the_scripts_word_that_the_run_finished(tmp_path, line, finished):
    log = tmp_path / "train.log"
    log.write_text(f"step 10 loss 2.0\n{line}\n")
    found = read(TrainingLog(), log)
    ended = [o for o in found if o.what == "job_state"]
    assert bool(ended) == finished, found
    assert all(o.reason == "finished" and o.source.line == 2 for o in ended)


def test_a_log_with_a_stray_nul_is_still_a_log():
    """torch's DataLoader worker writes a NUL after its segfault message; a log holding
    one was refused before as binary ("nothing torchchaos can read")."""
    from torchchaos.incident.formats import text

    log = (b"step 35 loss 1.0\nERROR: Unexpected segmentation fault encountered in worker.\n"
           b"\x00[rank1]: RuntimeError: DataLoader worker (pid 30905) is killed by signal:"
           b" Segmentation fault.\n")
    assert text.is_text(log)
    assert "\x00" not in text.decode(log)
    assert not text.is_text(b"PK\x03\x04" + b"\x00" * 40 + b"data.pkl")  # torch.save's zip
    assert not text.is_text(b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94.")  # a pickle


def test_a_step_counter_that_starts_again_each_epoch_is_counted_from_the_start(tmp_path):
    """The tutorials' "Epoch [3/10], Step [200/500]" is step 1200 of the run; read before
    as step 200, and the window placed after epoch 2's step 500. Ignite's iteration,
    which counts on across epochs, is left as it is."""
    log = tmp_path / "train.log"
    log.write_text("".join(f"Epoch [{e}/10], Step [{s}/500], Loss: 2.0\n"
                           for e in (1, 2, 3) for s in (100, 500) if (e, s) != (3, 500)))
    steps = [o.step for o in read(TrainingLog(), log) if o.what == "step"]
    assert steps == [100, 500, 600, 1000, 1100]
    log.write_text("Epoch[1] Iteration[10/20] Loss: 2.3\nEpoch[2] Iteration[11/20] Loss: 2.2\n")
    assert [o.step for o in read(TrainingLog(), log) if o.what == "step"] == [10, 11]


SLURM_REAL = Path(__file__).resolve().parents[1] / "data" / "incidents" / "slurm_real"


def test_scontrol_show_job_gives_the_state_the_reason_and_the_times_of_a_real_job() -> None:
    from torchchaos.incident.formats.slurm import ScontrolJob

    path = SLURM_REAL / "time_limit_hang" / "scontrol.txt"
    reader = ScontrolJob()
    assert reader.sniff(path.read_bytes(), path.name)
    (said,) = reader.read(path.read_bytes(), path.name)
    assert (said.what, said.reason, said.source.line) == ("job_state", "TIMEOUT", 4)
    assert said.extra["scheduler_reason"] == "TimeLimit" and said.extra["time_limit"] == 60
    assert said.time is not None and said.extra["start"] is not None
    assert said.time - said.extra["start"] == said.extra["run_time"]  # 00:01:27


def test_slurmctlds_log_says_which_node_failed_and_which_job_it_requeued() -> None:
    from torchchaos.incident.formats.slurm import SlurmctldLog

    path = SLURM_REAL / "node_failure" / "slurmctld.log"
    said = SlurmctldLog().read(path.read_bytes(), path.name)
    assert [(o.reason, o.host) for o in said] == [("NODE_FAIL", "n2"), ("NODE_DOWN", "n2")]
    timed = SlurmctldLog().read(
        (SLURM_REAL / "time_limit_hang" / "slurmctld.log").read_bytes(), "slurmctld.log")
    assert [(o.what, o.reason) for o in timed] == [("job_state", "TIMEOUT")]


def test_a_loggers_leading_time_is_read_and_its_rank_too() -> None:
    from torchchaos.incident.formats.trainlog import TrainingLog

    line = b"2026-12-02 03:24:00,642 [rank 1] INFO step 1 loss 0.04961\n"
    said, last = TrainingLog().read(line, "slurm-1.out")
    assert (said.what, said.rank, said.step) == ("step", 1, 1)
    assert (last.what, last.rank, last.extra) == ("rank_line", 1, {"last": True})
    assert said.time is not None and abs(said.time % 1 - 0.642) < 1e-6
