"""Sequence-model toy job with structured logging.

Each rank re-reads its shard manifest (manifests/rank<R>.txt) every
--refresh steps, so data can be added while the job runs.
"""
import argparse
import datetime
import logging
import os
import time

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger("train")


def setup_logging(rank):
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)-5s rank{rank} %(name)s: %(message)s",
    )


class TinyGRU(nn.Module):
    def __init__(self, vocab=64, hidden=48):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tok):
        h, _ = self.rnn(self.emb(tok))
        return self.out(h)


def read_manifest(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--refresh", type=int, default=30)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--out", default="run")
    args = ap.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
    rank = dist.get_rank()
    setup_logging(rank)
    log.info("world=%d steps=%d", dist.get_world_size(), args.steps)

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(TinyGRU())
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    os.makedirs(args.out, exist_ok=True)
    shards = read_manifest(f"manifests/rank{rank}.txt")
    log.info("manifest has %d shards", len(shards))

    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(1, args.steps + 1):
        t0 = time.time()
        tok = torch.randint(0, 64, (4, 24), generator=gen)
        logits = model(tok[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 64), tok[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.info("step=%d loss=%.4f dt=%.3f", step, loss.item(), time.time() - t0)
        if step % 100 == 0 and rank == 0:
            torch.save({"model": model.module.state_dict(), "step": step}, f"{args.out}/model_{step}.pt")
            log.info("saved %s/model_%d.pt", args.out, step)
        if step % args.refresh == 0:
            shards = read_manifest(f"manifests/rank{rank}.txt")
            log.info("refreshed manifest: %d shards", len(shards))
        time.sleep(max(0.0, args.interval - (time.time() - t0)))
    log.info("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
