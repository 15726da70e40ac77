"""MLP trainer with crash-safe checkpoints.

Config via env: TRAIN_STEPS, CKPT_EVERY, CKPT_ROOT, STEP_SLEEP.
Checkpoints go to CKPT_ROOT/step-<n>.pt, written to a temp file, fsynced and
renamed; CKPT_ROOT/LATEST is then swapped atomically.
"""
import os, sys, time, tempfile
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def log(msg):
    sys.stdout.write(f"[r{os.environ.get('RANK', '?')}] {msg}\n"); sys.stdout.flush()


def atomic_write(path, writer):
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
            f.flush(); os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try: os.fsync(dfd)
    finally: os.close(dfd)


class Trainer:
    def __init__(self):
        self.steps = int(os.environ.get("TRAIN_STEPS", 240))
        self.every = int(os.environ.get("CKPT_EVERY", 40))
        self.root = os.environ.get("CKPT_ROOT", "checkpoints")
        self.pause = float(os.environ.get("STEP_SLEEP", 0.1))
        dist.init_process_group(backend="gloo")
        self.rank = dist.get_rank()
        torch.manual_seed(7)
        self.net = nn.Sequential(nn.Linear(64, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 10))
        self.model = DistributedDataParallel(self.net)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.step = 0
        os.makedirs(self.root, exist_ok=True)

    def maybe_resume(self):
        latest = os.path.join(self.root, "LATEST")
        if not os.path.exists(latest):
            log("no checkpoint, fresh start")
            return
        fname = open(latest).read().strip()
        blob = torch.load(os.path.join(self.root, fname), map_location="cpu", weights_only=True)
        self.net.load_state_dict(blob["net"]); self.opt.load_state_dict(blob["opt"])
        self.step = int(blob["step"])
        log(f"restored {fname} -> continuing after step {self.step}")

    def save(self):
        if self.rank == 0:
            fname = f"step-{self.step}.pt"
            blob = {"net": self.net.state_dict(), "opt": self.opt.state_dict(), "step": self.step}
            t = time.time()
            atomic_write(os.path.join(self.root, fname), lambda f: torch.save(blob, f))
            atomic_write(os.path.join(self.root, "LATEST"), lambda f: f.write(fname.encode()))
            log(f"checkpoint {fname} written in {time.time() - t:.2f}s")
        dist.barrier()

    def batch(self):
        g = torch.Generator().manual_seed(self.step * 10 + self.rank)
        x = torch.randn(32, 64, generator=g)
        return x, (x[:, :10] > 0).long().argmax(1)

    def run(self):
        self.maybe_resume()
        while self.step < self.steps:
            x, y = self.batch()
            loss = F.cross_entropy(self.model(x), y)
            self.opt.zero_grad(set_to_none=True); loss.backward(); self.opt.step()
            self.step += 1
            if self.step % 10 == 0 or self.rank == 0:
                log(f"it={self.step} loss={loss.item():.4f}")
            if self.step % self.every == 0:
                self.save()
            time.sleep(self.pause)
        log("finished")
        dist.destroy_process_group()


if __name__ == "__main__":
    Trainer().run()
