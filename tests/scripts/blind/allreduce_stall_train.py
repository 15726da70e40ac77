# tiny conv net, gradient sync by DDP plus an explicit all_reduce of the loss each step
import os, signal, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist

STEPS = 400
SLEEP = 0.2
CKPT = "state"
STALL_RANK = int(os.environ.get("STALL_RANK", "-1"))   # debug knob: freeze this rank ...
STALL_AFTER = int(os.environ.get("STALL_AFTER", "30"))  # ... after this step


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x)); x = torch.relu(self.c2(x))
        return self.fc(torch.nn.functional.max_pool2d(x, 2).flatten(1))


dist.init_process_group("gloo", timeout=timedelta(hours=1))
rank = dist.get_rank(); ws = dist.get_world_size()
net = Net()
model = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
first = 1
if os.path.isdir(CKPT) and os.listdir(CKPT):
    last = sorted(os.listdir(CKPT))[-1]
    sd = torch.load(os.path.join(CKPT, last))
    net.load_state_dict(sd["net"]); opt.load_state_dict(sd["opt"]); first = sd["step"] + 1
    print("rank%d resumed from %s" % (rank, last), flush=True)
os.makedirs(CKPT, exist_ok=True)

torch.manual_seed(rank)
for step in range(first, STEPS + 1):
    x = torch.randn(8, 1, 16, 16)
    y = torch.randint(0, 10, (8,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    l = loss.detach().clone()
    dist.all_reduce(l)
    print("rank%d step %d/%d loss %.4f" % (rank, step, STEPS, l.item() / ws), flush=True)
    if step % 50 == 0 and rank == 0:
        torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": step},
                   os.path.join(CKPT, "step%05d.pt" % step))
        print("rank0 wrote checkpoint for step %d" % step, flush=True)
    if rank == STALL_RANK and step == STALL_AFTER:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(SLEEP)

dist.destroy_process_group()
print("rank%d done" % rank, flush=True)
