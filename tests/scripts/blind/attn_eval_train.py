"""Tiny self-attention LM, DDP/gloo. Rank 0 runs a long-context eval every EVAL_EVERY steps.
Logs go to logs/train.log (rank 0) and stdout."""
import logging, math, os, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CONFIG = dict(vocab=96, d=32, heads=4, train_len=32, eval_len=1 << 18, batch=8,
              steps=300, eval_every=80, save_every=50, out="out", tick=0.1)


class Attn(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h, self.qkv, self.o = h, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D // self.h)   # B,h,L,L
        return self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D))


class LM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c["vocab"], c["d"]); self.att = Attn(c["d"], c["heads"])
        self.head = nn.Linear(c["d"], c["vocab"])

    def forward(self, t):
        return self.head(self.att(self.emb(t)))


def main(c=CONFIG):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.makedirs("logs", exist_ok=True); os.makedirs(c["out"], exist_ok=True)
    handlers = [logging.StreamHandler(sys.stdout)]
    if rank == 0:
        handlers.append(logging.FileHandler("logs/train.log"))
    logging.basicConfig(level=logging.INFO, handlers=handlers,
                        format=f"[%(asctime)s][rank{rank}][%(levelname)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    lm = LM(c); model = nn.parallel.DistributedDataParallel(lm)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    g = torch.Generator().manual_seed(rank)
    for step in range(1, c["steps"] + 1):
        t = torch.randint(0, c["vocab"], (c["batch"], c["train_len"] + 1), generator=g)
        loss = F.cross_entropy(model(t[:, :-1]).flatten(0, 1), t[:, 1:].flatten())
        opt.zero_grad(); loss.backward(); opt.step()
        if step % 10 == 0:
            logging.info("step %d loss %.4f", step, loss.item())
        if step % c["save_every"] == 0 and rank == 0:
            torch.save({"lm": lm.state_dict(), "opt": opt.state_dict(), "step": step}, f'{c["out"]}/lm_{step:05d}.pt')
            logging.info("checkpoint %s/lm_%05d.pt", c["out"], step)
        if step % c["eval_every"] == 0:
            if rank == 0:
                logging.info("eval at step %d, context %d", step, c["eval_len"])
                with torch.no_grad():
                    e = torch.randint(0, c["vocab"], (1, c["eval_len"] + 1), generator=g)
                    el = F.cross_entropy(lm(e[:, :-1]).flatten(0, 1), e[:, 1:].flatten())
                logging.info("eval loss %.4f", el.item())
            dist.barrier()
        time.sleep(c["tick"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
