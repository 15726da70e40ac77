"""Every event a history holds: its name, who writes it, and its fields.

A history is JSON lines, one stream per rank (`_chaos/history/rank-R.jsonl`),
one per node's harness, and the fault filesystem's. Every event has `ev` (its
name) and `t` (`time.monotonic()`); a rank's stream adds `rank`, `pid`,
`launch` (the harness's relaunch count) and `attempt` (torchrun's restart
count) to each. The fields below are the rest. `tests/rundir/test_events.py` keeps
this table and the code in step: an event written or read anywhere in
`chaos/` or `faults/` is listed here, and every one listed is written.

A plug-in fault kind may record events of its own; name them after the kind
(`mykind`, `mykind_error`) so they never meet a future built-in name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EventSpec:
    writer: str  # "rank" (the agent, or a fault firing in a rank), "harness", "faultfs"
    fields: str  # the fields besides the common ones, each with what it means
    summary: str


def _e(writer: str, summary: str, fields: str = "") -> EventSpec:
    return EventSpec(writer, fields, summary)


EVENTS: dict[str, EventSpec] = {
    # -- a rank's life (torchchaos.rank.agent)
    "boot": _e("rank", "the agent armed in a fresh worker", "node, local_rank"),
    "restore": _e("rank", "the first step started from this reference step",
                  "restored (step or None), match (exact|params|None), fp, loads,"
                  " collective_timeout (seconds the job set, where it set one)"),
    "step": _e("rank", "an optimizer step completed",
               "step (global), local, aligned, loss, fp (digests; see chaos.rank.fingerprint)"),
    "rollback": _e("rank", "a running process went back to an earlier step",
                   "from_step, restored, match"),
    "exception": _e("rank", "the target raised out of its main",
                    "type, message, step, before_first_step, after_load"),
    "exit": _e("rank", "the process exits normally", "step"),
    "teardown": _e("rank", "the script called destroy_process_group(); clean: no exception"
                   " was on its way (a hang from here on, after the last step, is at exit)",
                   "step, clean"),
    "stopped": _e("rank", "the rank stopped at TORCHCHAOS_STOP_AT_STEP", "step"),
    "snapshot": _e("rank", "the folder's entries at a step (working-directory snapshot)",
                   "step, entries"),
    "detection": _e("rank", "the target reported a detection (torchchaos.api.report_detection)",
                    "what, details, step"),
    "committed": _e("rank", "the target reported a committed checkpoint", "step"),
    "weights_deviation": _e("rank", "final weights' largest drift from the reference's",
                            "step, value (None: shapes differ or no reference weights)"),
    "sync": _e("rank", "a collective the rank entered (recording runs only)",
               "op, group (world|sub)"),
    # -- checkpoint I/O seen in a rank (torchchaos.rank.iowatch, chaos.rank.saves)
    "file": _e("rank", "a file operation of the target under the run directory",
               "op, path, save, index, and the operation's own (size, mode, ...)"),
    "save_begin": _e("rank", "a checkpoint save began", "save, after_step, background"),
    "save_end": _e("rank", "a checkpoint save ended", "save, ended, events, last_step, last_t"),
    "save_left": _e("rank", "the script entered a collective of its own after a save: it went"
                    " on from the save's events so far", "save, events, op"),
    "load": _e("rank", "a checkpoint load", "load, path, index"),
    # -- faults
    "fault": _e("rank", "a scheduled fault fired",
                "id, kind, spec, target, params, step"),
    "fault_error": _e("rank", "a fault could not act", "id, error"),
    "fault_applied": _e("rank", "the storage fault acted on a write",
                        "id, size, kept, torn, reply"),
    "bitflip": _e("rank", "bits flipped in a tensor or a file (model: miscompute for a"
                  " wrong matrix product)",
                  "id, tensor, bit, bit_class, offset, file, when, step"),
    "bitflip_error": _e("rank", "a bit flip found nothing to flip", "id, name, error"),
    "defect_carried": _e("rank", "a process started on a device a persistent miscompute made"
                         " defective, and carries the defect", "id, device"),
    "hang_begin": _e("rank", "a fault froze the rank (hang; dataloader:mode=stop;"
                     " gpu:error=hang)",
                     "id, mode, where, seconds, step, device"),
    "hang_end": _e("rank", "a hang fault let go", "id, mode, seconds, how"),
    "hang_error": _e("rank", "a hang fault could not act", "id, error"),
    "straggler": _e("rank", "a straggler fault slowed steps", "id, delay, steps"),
    "crash": _e("rank", "a crash fault is about to crash the rank natively", "id, signal, step"),
    "raised": _e("rank", "a raise fault raises in this thread (or the training thread's)",
                 "id, type, where, thread, step"),
    "oom": _e("rank", "an oom fault limits the rank's memory (then allocates) or makes an"
              " allocation fail", "id, mode, by, limit, cgroup, device, bytes, note, step"),
    "dataloader_worker": _e("rank", "a dataloader fault killed or stopped a worker process",
                            "id, mode, pid, workers, step"),
    "abort": _e("rank", "an abort fault aborts the rank's process group now", "id, after, step"),
    "gpu_error": _e("rank", "a gpu fault makes a CUDA error now", "id, error, device, step"),
    # -- the harness (torchchaos.harness)
    "launch": _e("harness", "a node's torchrun was launched (warm: its ranks forked from a"
                 " launcher with torch imported)", "launch, pids, warm"),
    "workers": _e("harness", "a node's worker processes (multi-node)", "launch, pids"),
    "rank_exit": _e("harness", "a worker process ended", "rank, pid, launch, attempt, step"),
    "job_exit": _e("harness", "a launch of the job ended", "launch, codes, stopped"),
    "hang": _e("harness", "no progress for the hang timeout",
               "seconds, timeout, stacks_dir, after_exit, at_exit"),
    "deadline": _e("harness", "the run's deadline killed the job", "seconds"),
    "gave_up": _e("harness", "the runner stopped a job whose resume died twice the same way"
                  " (torchchaos.harness.repeats)", "reason"),
    "reaped": _e("harness", "processes the job left running were killed", "pids"),
    "nemesis_begin": _e("harness", "a harness fault was put in force",
                        "id, kind, window, seconds, and what the kind says of the cut"),
    "nemesis_end": _e("harness", "a harness fault was healed", "id, kind, window"),
    "slurm_fault": _e("harness", "Slurm acted on a slurm fault (torchchaos.harness.scheduler)",
                      "id, event, said, step, and what Slurm did (node, signal, urgent_job)"),
    "scheduler_end": _e("harness", "the scheduler ended the job without it completing",
                        "state, restarts, said"),
    "slurm_power_loss": _e("harness", "the machines lost power between two tries of the job",
                           "id, dropped"),
    # -- the fault filesystem (torchchaos.faults.faultfs)
    "fs_mount": _e("faultfs", "the fault filesystem is mounted", "pid"),
    "fs_unmount": _e("faultfs", "the fault filesystem is unmounted", "status"),
    "fs_armed": _e("faultfs", "a storage fault is armed", "the fault's parameters"),
    "fs": _e("faultfs", "a changing operation reached the filesystem",
             "op, path, pid, tgid, blob=[offset, size] (recording), trunc, excl,"
             " unlinked (a file unlinked while open, by the name it was opened with), ..."),
    "fs_read": _e("faultfs", "a lookup, listing or read (recording runs only)", "op, path, pid"),
    "fs_crash": _e("faultfs", "a power loss: what was not durable is gone",
                   "fault, killed, lose_unsynced, removed, reverted_files, restored, source"),
    "fs_bitrot": _e("faultfs", "bits flipped in a durable file", "fault, file, bits, pattern"),
}
