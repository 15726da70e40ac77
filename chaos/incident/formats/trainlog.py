"""The training script's own lines: its step counter, its saves, where it resumed from.

Read loosely, since every script words them its own way; only lines that name a step
(`step 12`, `iter 12:`, `global_step=12`, `it=12`), a checkpoint written (`saved
checkpoint ...`, `saving checkpoint to ...`, `checkpoint ... committed`), a resume
(`resumed from ckpt/step-10.pt at step 10`, `Resuming training from ...`, `restored
state from ...`, `continuing at global_step=20`, `continuing after step 80`), a resume
that found nothing (`no usable checkpoint under runs/ckpt`, `No checkpoint found in
...`) or a SIGTERM the script's handler says it got (`got signal 15, exiting`,
Lightning's `Received SIGTERM: 15`) count. A line tagged by torch or torchrun
([rank1]:, [default1]:) belongs to that rank, and so does one the script starts with
its rank (`rank 1 resumed from ...`, `[rank 1] step 12`, `[r1] it=12`); any other line
to no rank in particular (most scripts print from rank 0 only).
"""

from __future__ import annotations

import dataclasses
import re
import time

from torchchaos.incident.formats import records, text
from torchchaos.incident.observations import Observation, Source, worker_of
from torchchaos.incident.readers import Reader
from torchchaos.log_lines import EXCEPTION_LINE

# "step 12", "iter 12:", "global_step=12", and the tutorials' and Ignite's bracketed
# counters, "Step [12/100]", "Iteration[12/20]"
STEP = re.compile(r"\b(?:step|iter(?:ation)?|global_step|it(?==))(?:\b\s*[:=#\[]?\s*|[-_])"
                  r"(\d+)"  # and the terse "it=120"
                  r"|^\s*\|\s*(?:step|iter(?:ation)?|it)\s*\|\s*(\d+)\s*\|", re.I)  # "| it | 120 |"
# "resumed from ...", Lightning's "Restoring states from the checkpoint ...", "restored
# state from runs/ckpt/global_step_20", "continuing at global_step=20", the Trainer's
# "Continuing training from checkpoint", Megatron's "successfully loaded checkpoint",
# "Finished loading the checkpoint in 0.25 seconds; resuming after step 10" (a load
# begun, "Loading the checkpoint at step 10", is not yet a resume)
RESUME = re.compile(r"\bresum(?:ed|ing)\b.*\b(?:from|at|after)\b"
                    # a restore or a "continuing" of the training's own state, not of a
                    # tokenizer or a cache: the line names a checkpoint, a step or a state
                    r"|(?=.*(?:checkpoint|ckpt|step|iteration|\bstates?\b))"
                    r"(?:\brestor(?:ed|ing)\b.*\bfrom\b|\bcontinu(?:ed|ing) (?:training )?"
                    r"(?:from|at|after)\b)"
                    r"|\b(?:loaded|finished loading) (?:the )?checkpoint\b", re.I)
# the script looked for a checkpoint to resume from and found none: "no usable checkpoint
# under runs/ckpt", Lightning's "there is no last checkpoint available", "No checkpoint
# found in ...", "could not find a valid checkpoint"
NO_CHECKPOINT = re.compile(r"\bno (?:usable |valid |last |saved |existing )?checkpoints? "
                           r"(?:was |were |is )?(?:found|available|under|in)\b"
                           r"|\bcheckpoints? not found\b|\b(?:could not|couldn't|can't|cannot|"
                           r"did not|didn't) find (?:a |an |any )?(?:usable |valid |existing )?"
                           r"checkpoint", re.I)
# a checkpoint is also a "snapshot" where the line says it is the training's or the
# model's (the DDP tutorial's "Training snapshot saved at snapshot.pt"): a memory, a
# profiler's or a data set's snapshot is none
CHECKPOINT_WORD = r"(?:\bcheckpoint|\b(?:training|model|checkpoint|state)\s+snapshot\b)"
# a save said before it happens ("Checkpoints will be saved every 500 steps"), or a load
# of what was saved ("Loading model snapshot saved at ..."), is no save
NOT_A_SAVE = r"(?!.*\b(?:will|would|shall|to)\s+be\s+(?:saved|written)\b)(?!.*\bload(?:ing|ed)?\b)"
# a file a save writes, named in the line: "shard saved: ckpt/step_150/rank1.pt"
# (not a memory's or a profiler's snapshot, "mem_rank0.pt", "trace.pt.trace.json")
WEIGHTS_FILE = r"\S+\.(?:pt|pth|ckpt|safetensors|distcp)(?=$|[\s,;:)'\"])"
NOT_A_PROFILE = r"(?!.*\b(?:memory|profil\w*|trace|snapshot)\b)"
SAVE = re.compile(rf"^{NOT_A_SAVE}.*(?:\b(?:sav(?:ed|ing)|wrote|writing)\b.*{CHECKPOINT_WORD}"
                  rf"|{CHECKPOINT_WORD}\b.*\b(?:saved|written|committed)\b)"
                  rf"|^{NOT_A_SAVE}{NOT_A_PROFILE}.*(?:\b(?:saved|wrote|written)\b.*{WEIGHTS_FILE}"
                  rf"|{WEIGHTS_FILE}.*\b(?:saved|written)\b)", re.I)
# a step's line that ends saying its checkpoint was saved: "step 10 loss 2.2366 saved"
SAVED_AT_END = re.compile(r"\bsaved[.!]?\s*$", re.I)
# a handler's word that the rank got a SIGTERM: Lightning's "Received SIGTERM: 15", a
# script's own "got signal 15, exiting"
SIGTERM_SAID = re.compile(r"\b(?:received|got|caught)\s+(?:signal\s*:?\s*(?:SIGTERM|15)\b"
                          r"|SIGTERM\b)|\bSIGTERM\s+(?:received|caught)", re.I)
# the script's word that the run ended as it meant to: "Training done for this job.",
# "done at step 15", "Reached time budget, exiting cleanly.", the Trainer's "Training
# completed.", Lightning's "`Trainer.fit` stopped: `max_steps=20` reached.", Ignite's
# "Engine run complete.", torchrun's "worker group successfully finished" (an epoch's
# "Epoch 3 complete" ends no run)
FINISHED = re.compile(r"^\W*(?:all\s+)?(?:done|finished)(?:\s+at\s+(?:step|iter\w*)\b|\W*$)"
                      r"|\b(?:training|run|job)\s+(?:is\s+)?(?:done|finished|completed?|ended)\b"
                      r"|\bfinished training\b|\bexit(?:ing|ed)?\s+(?:cleanly|normally)\b"
                      r"|`?Trainer\.fit`? stopped\b|\bworker group successfully finished\b",
                      re.I)
# the time `logging` (and most loggers) put first: "2026-12-02 03:24:00,409 ...",
# "[2026-12-02T03:24:00.409Z] ..."; read as local time where it names no zone
LEADING_TIME = re.compile(r"^\s*\[?(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)([.,]\d+)?"
                          r"(?:Z|[+-]\d\d:?\d\d)?\]?\s+")
# a line the script starts with its own rank (torch's "[rank1]:" tag is read first)
OWN_RANK = re.compile(r"^\s*(?:(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+)?"
                      r"(?:\[?rank[ _=#:]?|\[r(?=\d+\]))(\d+)\]?(?=[\s:,\]]|$)",
                      re.I)  # after a level ("INFO  rank1 train: ..."); the terse "[r1] ..."
# where another rank's line starts glued to the end of one ("...step-0015.ptrank 1 resumed")
GLUED = re.compile(r"(?<=\S)(?=\[?rank[ _=#:]?\d+\]?[\s:,\]])", re.I)
# a traceback's lines, glog lines (torch's C++ and torchrun's), a py-spy dump's header
NOT_OURS = re.compile(r'^\s*(File "|Traceback|\[?[EWI]\d{4} )|^Process \d+: |^Python v\d'
                      r"|^\s*(?:slurmstepd|srun|sbatch|salloc): ")  # Slurm's ("STEP 4242.0")


class TrainingLog(Reader):
    name = "trainlog"
    summary = "the script's own lines: steps, saves, resumes"

    def sniff(self, data: bytes, name: str) -> bool:
        head = data.lstrip()[:2]
        body = text.text_of(data)
        if body is None or head in (b"[{", b'["', b"[]"):
            return False  # a JSON document (a manifest, a config) is no log
        lines = body.splitlines()[:20000]
        if head[:1] == b"{" and not records.is_record_log(lines):
            return False  # one JSON document, not a record per line
        sentences = (_sentence(line)[0] for line in lines if not NOT_OURS.match(line))
        return any(p.search(sentence) for sentence in sentences
                   for p in (STEP, RESUME, SAVE, SIGTERM_SAID, NO_CHECKPOINT))

    def read(self, data: bytes, name: str) -> list[Observation]:
        found = []
        attempt, worker = worker_of(name) or (None, None)
        lines = text.decode(data).splitlines()
        counted = _steps_counted_per_epoch(lines)
        last_line: dict[int, int] = {}
        for number, line in enumerate(lines, 1):
            rank, body, _ = text.split_tag(line)
            body, said_rank = _sentence(body)
            rank = said_rank if rank is None else rank
            rank = worker if rank is None else rank  # torchrun --log-dir: the file's rank
            if NOT_OURS.match(body) or "torch/distributed" in body or \
                    EXCEPTION_LINE.match(body.strip()):
                continue  # an error's message may name a step; it is not the counter
            # two ranks' prints glued on one line (each print is two writes: its text,
            # then its newline) are read as the two lines they were
            body, when = _without_time(body)
            pieces = [body] if rank is not None else GLUED.split(body)
            for piece in pieces:
                own = OWN_RANK.match(piece) if rank is None else None
                said = _observed(piece, int(own.group(1)) if own else rank,
                                 Source(name, number), attempt)
                if when is not None:
                    said = [dataclasses.replace(o, time=when) for o in said]
                if number in counted:  # the step counted from the run's start
                    said = [dataclasses.replace(o, step=counted[number])
                            if o.step is not None else o for o in said]
                found += said
                if own:
                    last_line[int(own.group(1))] = number
        # each rank's last line of its own: one that got further than a peer tells
        found += [Observation("rank_line", Source(name, number), rank=rank,
                              extra={"last": True}) for rank, number in last_line.items()]
        return found


# the tutorials' "Epoch [3/10], Step [200/500]": a step counter that starts again each
# epoch, with the epoch's length (Ignite's "Epoch[2] Iteration[11/20]" counts on)
EPOCH_NUMBER = re.compile(r"\bepoch\s*[\[:=#]?\s*(\d+)", re.I)
STEP_IN_EPOCH = re.compile(r"\b(?:step|iter(?:ation)?)\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]", re.I)


def _steps_counted_per_epoch(lines: list[str]) -> dict[int, int]:
    """{line number: the step counted from the run's start} for a log whose step counter
    starts again each epoch (it falls as the epoch rises); {} for any other log."""
    seen = [(number, int(e.group(1)), int(s.group(1)), int(s.group(2)))
            for number, line in enumerate(lines, 1)
            if (e := EPOCH_NUMBER.search(line)) and (s := STEP_IN_EPOCH.search(line))]
    starts_again = any(b[1] > a[1] and b[2] < a[2] for a, b in zip(seen, seen[1:]))
    if not starts_again:
        return {}
    first = min(epoch for _, epoch, _, _ in seen)  # printed from 0 or from 1
    return {number: (epoch - first) * length + step
            for number, epoch, step, length in seen}


def _without_time(body: str) -> tuple[str, float | None]:
    """A line without the time its logger put first, and that time (None: it has none)."""
    m = LEADING_TIME.match(body)
    if m is None:
        return body, None
    try:
        seconds = time.mktime(time.strptime(f"{m.group(1)} {m.group(2)}", "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return body, None
    fraction = float(m.group(3).replace(",", ".")) if m.group(3) else 0.0
    return body[m.end():], seconds + fraction


def _sentence(line: str) -> tuple[str, int | None]:
    """A line as the patterns read it, and the rank it names: a structured log's JSON
    record as the sentence it stands for (`records`), any other line as it is."""
    record = records.record_of(line)
    return records.as_sentence(record) if record is not None else (line, None)


def _observed(body: str, rank: int | None, where: Source,
              attempt: int | None) -> list[Observation]:
    found = _progress(body, rank, where, attempt)
    if FINISHED.search(body):
        found.append(Observation("job_state", where, rank=rank, reason="finished",
                                 detail=body.strip()[:200], attempt=attempt))
    return found


def _progress(body: str, rank: int | None, where: Source,
              attempt: int | None) -> list[Observation]:
    if SIGTERM_SAID.search(body):
        return [Observation("signal", where, rank=rank, signal="SIGTERM",
                            detail=body.strip()[:200], attempt=attempt)]
    if NO_CHECKPOINT.search(body):  # before the step: "from scratch (global_step=0)"
        return [Observation("no_checkpoint", where, rank=rank, detail=body.strip()[:200],
                            attempt=attempt)]
    step = STEP.search(body)
    number = int(step.group(1) or step.group(2)) if step else None
    if RESUME.search(body):
        what = "resume"
    elif SAVE.search(body):
        what = "save"
    elif step:
        what = "step"
    else:
        return []
    detail = body.strip()[:200] if what != "step" else ""
    found = [Observation(what, where, rank=rank, step=number, detail=detail, attempt=attempt)]
    if what == "step" and SAVED_AT_END.search(body):  # the step's line, and its save done
        found.append(Observation("save", where, rank=rank, step=number,
                                 detail=body.strip()[:200], attempt=attempt))
    return found
