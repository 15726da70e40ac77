"""A Hugging Face Trainer script written the way the Trainer docs show it.

Launched as ``torchrun --standalone --nproc-per-node 2 targets/hf_trainer_lm.py
[flags]``: ``TrainingArguments(use_cpu=True, ddp_backend="gloo")`` reads
torchrun's variables and the Trainer runs DDP over gloo through Accelerate. It
trains a tiny randomly initialised GPT-2 (``GPT2Config(n_layer=1, n_embd=32,
n_head=2, vocab_size=64, n_positions=32)``, built in code: nothing is
downloaded, dropout on as GPT-2 has it) on an in-memory dataset of seeded
random token sequences, saves ``out/checkpoint-N/`` every ``--ckpt-every``
steps (``save_steps``) and, on start, resumes with
``trainer.train(resume_from_checkpoint=True)`` when a ``checkpoint-N`` folder
exists (the ``get_last_checkpoint`` recipe of the examples' ``run_clm.py``).

What it deliberately does *not* do beyond the Trainer's defaults and the docs'
recipe: no check that the folder it resumes from is complete, no fsync, no
SIGTERM handler, no collective timeout. The only addition is the one the
harness needs of any target: deterministic kernels on one thread, so that a
fault-free run repeats bitwise. ``--fix commit`` adds what a user has to add
for a checkpoint that is whole and durable before resume may pick it (README,
"Real frameworks as targets").
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built in code: never reach out
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint  # noqa: E402

VOCAB, SEQ = 64, 16
COMMITTED = "COMMITTED"  # --fix commit: written once every rank's files are durable


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--out-dir", default="out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=64,
                   help="dataset size; with 2 ranks and batch 4 an epoch is samples/8 steps")
    p.add_argument("--fix", action="append", choices=("commit",), default=[],
                   help="commit: after every rank saved, fsync the checkpoint-N folder and"
                        f" mark it with {COMMITTED}; resume from the newest marked one")
    return p.parse_args()


class RandomTokens(Dataset):
    """`n` seeded random token sequences; a causal LM learns their unigram statistics."""

    def __init__(self, seed: int, n: int) -> None:
        g = torch.Generator().manual_seed(seed)
        # A skewed distribution, so the loss has somewhere to go.
        weights = torch.linspace(1.0, 0.05, VOCAB)
        self.tokens = torch.multinomial(weights, n * SEQ, replacement=True,
                                        generator=g).view(n, SEQ)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CommitCheckpoint(TrainerCallback):
    """--fix commit. The Trainer writes checkpoint-N/ in place, every rank its own
    rng_state_R.pth with no barrier, and fsyncs nothing: a folder that exists may be
    half written. After the save (on_save runs on every rank once its part is written),
    wait for every rank, make the files and the folder durable, then mark it."""

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if state.is_world_process_zero:
            for name in os.listdir(folder):
                fsync_path(os.path.join(folder, name))
            with open(os.path.join(folder, COMMITTED), "w") as f:
                f.write(f"{state.global_step}\n")
                f.flush()
                os.fsync(f.fileno())
            fsync_path(folder)
            fsync_path(args.output_dir)
        return control


def last_committed_checkpoint(out_dir: str) -> str | None:
    """The newest checkpoint-N folder marked by CommitCheckpoint."""
    done = [name for name in os.listdir(out_dir)
            if name.startswith(f"{PREFIX_CHECKPOINT_DIR}-")
            and os.path.isfile(os.path.join(out_dir, name, COMMITTED))]
    return (os.path.join(out_dir, max(done, key=lambda n: int(n.rsplit("-", 1)[1])))
            if done else None)


def main() -> None:
    args = parse_args()
    # Bitwise repeatable CPU runs: the harness compares against a fault-free run.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    training_args = TrainingArguments(
        output_dir=args.out_dir,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        warmup_steps=3,
        save_strategy="steps",
        save_steps=args.ckpt_every,
        seed=args.seed,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
    )
    set_seed(training_args.seed)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    model = GPT2LMHeadModel(config)
    commit = "commit" in args.fix
    trainer = Trainer(model=model, args=training_args,
                      train_dataset=RandomTokens(args.seed, args.samples),
                      callbacks=[CommitCheckpoint()] if commit else None)

    # The examples' recipe: resume when the output folder holds a checkpoint.
    resume: str | bool | None = None
    if os.path.isdir(args.out_dir):
        if commit:
            resume = last_committed_checkpoint(args.out_dir)
            # A resume from a checkpoint at max_steps trains one step more than max_steps
            # (the Trainer checks for the end only after a step): there is nothing left to do.
            if resume is not None and int(resume.rsplit("-", 1)[1]) >= args.steps:
                if trainer.is_world_process_zero():
                    print(f"{resume} is at max_steps: nothing to resume", flush=True)
                return
        elif get_last_checkpoint(args.out_dir) is not None:
            resume = True
    result = trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        print(f"done step {result.global_step} loss {result.training_loss!r}", flush=True)


if __name__ == "__main__":
    main()
