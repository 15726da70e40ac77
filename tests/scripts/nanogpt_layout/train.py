"""A job laid out the way nanoGPT is: globals overridden by `configurator.py`, which the
script opens by that fixed relative name; token data memory-mapped from
`data/<dataset>/train.bin`, also relative; checkpoints in `out/ckpt.pt`. Under torchchaos
each run starts in a new folder, so both must be shown there (`--link configurator.py
--link data`). Resuming follows the README: `init_from` is decided by whether a checkpoint
exists, and the checkpoint carries the RNG state the batches are drawn from."""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

out_dir = "out"
dataset = "tiny"
max_iters = 12
eval_interval = 4  # a checkpoint every eval_interval steps
batch_size = 4
block_size = 8
learning_rate = 0.05
exec(open("configurator.py").read())  # the pattern under test

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(1337 + rank)
data = np.memmap(os.path.join("data", dataset, "train.bin"), dtype=np.uint16, mode="r")
vocab = int(data.max()) + 1


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64))
                     for i in ix])
    return x, y


torch.manual_seed(0)  # the same initial weights on every rank
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
torch.manual_seed(1337 + rank)
ckpt_path = os.path.join(out_dir, "ckpt.pt")
init_from = "resume" if os.path.exists(ckpt_path) else "scratch"
iter_num = 0
if init_from == "resume":
    checkpoint = torch.load(ckpt_path, weights_only=False)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
    torch.set_rng_state(checkpoint["rng"][rank])
model = DDP(model)

while iter_num < max_iters:
    if iter_num % eval_interval == 0 and iter_num > 0:
        states = [None] * dist.get_world_size()
        dist.all_gather_object(states, torch.get_rng_state())
        if rank == 0:
            os.makedirs(out_dir, exist_ok=True)
            checkpoint = {"model": model.module.state_dict(),
                          "optimizer": optimizer.state_dict(), "iter_num": iter_num,
                          "rng": states}
            torch.save(checkpoint, ckpt_path + ".tmp")
            os.replace(ckpt_path + ".tmp", ckpt_path)
        dist.barrier()
    x, y = get_batch()
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    iter_num += 1
    if rank == 0:
        print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)

# leave without tearing down: torch 2.13's gloo can abort or hang a rank in the teardown
# of a process group under a live DDP model (README, Known limits; targets/launch.py), and
# its partner then dies on a reset connection
dist.barrier()
sys.stdout.flush()
os._exit(0)
