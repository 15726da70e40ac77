import glob, json, os, sys, time, ctypes
import torch, torch.distributed as dist
from safetensors.torch import save_file, load_file

OUT = os.environ.get("OUT_DIR", "output")
STEPS, SAVE, TICK = 260, 40, 0.06
JITTER_RANK = int(os.environ.get("NATIVE_JITTER_RANK", "-1"))  # rank using the native jitter op
_libc = ctypes.CDLL("libc.so.6")
_libc.malloc.restype = ctypes.c_void_p
_libc.free.argtypes = [ctypes.c_void_p]


def native_jitter(t, step):
    """scratch buffer from the C heap (stand-in for a C extension's workspace)"""
    buf = _libc.malloc(4096)
    _libc.free(buf)
    if step == 95:          # the extension's bug: workspace freed twice on a rare path
        _libc.free(buf + 16)
    return t + 0.01 * torch.randn_like(t)


def main():
    dist.init_process_group("gloo")
    r = dist.get_rank()
    torch.manual_seed(11)
    body = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                               torch.nn.ReLU(), torch.nn.Linear(2048, 256))
    ddp = torch.nn.parallel.DistributedDataParallel(body)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    os.makedirs(OUT, exist_ok=True)
    step = 0
    found = sorted(glob.glob(os.path.join(OUT, "model-*.safetensors")))
    if found:
        body.load_state_dict(load_file(found[-1]))
        step = int(os.path.basename(found[-1])[6:11])
        sys.stderr.write(f"rank{r}: warm start from {found[-1]} (step {step})\n")
    while step < STEPS:
        x = torch.randn(16, 256)
        if r == JITTER_RANK:
            x = native_jitter(x, step + 1)
        loss = (ddp(x) - x).square().mean()
        opt.zero_grad(); loss.backward(); opt.step(); step += 1
        if r == 0:
            print(json.dumps({"step": step, "loss": round(loss.item(), 5), "t": round(time.time(), 2)}), flush=True)
        if step % SAVE == 0 and r == 0:
            save_file({k: v.contiguous() for k, v in body.state_dict().items()},
                      os.path.join(OUT, f"model-{step:05d}.safetensors"))
            with open(os.path.join(OUT, "trainer_state.json"), "w") as f:
                json.dump({"global_step": step, "ckpt": f"model-{step:05d}.safetensors"}, f)
        time.sleep(TICK)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
