"""Classifier over 'encoded' records, decoded in DataLoader workers by a native helper.

    torchrun --nproc_per_node 2 decode_loader_train.py --epochs 1
"""
import argparse, ctypes, os, time
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DataLoader, DistributedSampler

libc = ctypes.CDLL(None)


class EncodedRecords(Dataset):
    """Record i is a 32-float feature vector; record 2345 has a corrupt header
    (base pointer 0), which the native decoder happily dereferences."""
    N = 4000

    def __len__(self):
        return self.N

    def _native_decode(self, i):
        base = 0 if i == 2345 else None  # corrupt record: header base is NULL
        if base is not None:
            ctypes.string_at(base + 0x10, 16)  # native decoder reads hdr at base+16
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g)

    def __getitem__(self, i):
        x = self._native_decode(i)
        return x, int(x[:4].sum() > 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--bs", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--save-dir", default="weights")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = EncodedRecords()
    sampler = DistributedSampler(ds, shuffle=False)
    dl = DataLoader(ds, batch_size=a.bs, sampler=sampler, num_workers=a.workers)
    clf = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    model = torch.nn.parallel.DistributedDataParallel(clf)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    os.makedirs(a.save_dir, exist_ok=True)
    step = 0
    for ep in range(a.epochs):
        sampler.set_epoch(ep)
        for x, y in dl:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            step += 1
            print(f"[rank {rank}] epoch {ep} step {step} loss={loss.item():.4f}", flush=True)
            if step % 60 == 0 and rank == 0:
                torch.save(clf.state_dict(), os.path.join(a.save_dir, f"clf-{step}.pt"))
                print(f"[rank {rank}] saved {a.save_dir}/clf-{step}.pt", flush=True)
            time.sleep(0.08)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
