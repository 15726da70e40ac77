"""Cost of the agent's fingerprints: per training step, and raw throughput.

1. Per step, for the bundled reference model (TinyLM + AdamW): the time of one
   training step without fingerprints vs the fingerprints the agent takes on a
   full step (parameters twice, optimizer state twice, learning rates,
   gradients, RNG, batch) and on a light one (parameters, learning rates,
   batch).
2. Throughput of `digest_tensors` vs `torch.sum` over the same 64 MiB tensor
   (the memory-bandwidth bound it is measured against).

    python bench/fingerprint.py
"""

from __future__ import annotations

import torch
from reference_step import ReferenceTraining, timed

from torchchaos.rank.fingerprint import digest_object, digest_rng, digest_tensors


def per_step() -> None:
    training = ReferenceTraining.create()
    params, optim = training.params, training.optim

    def lr() -> None:
        digest_object([[g.get("lr") for g in optim.param_groups]])

    def full() -> None:
        for _ in range(2):  # start of step and after the optimizer step
            digest_tensors(params)
            digest_object(optim.state_dict()["state"])
        lr()
        digest_tensors([p.grad for p in params])
        digest_rng()
        digest_tensors([training.tokens])

    def light() -> None:  # what a chaos run takes between its full windows
        lr()
        digest_tensors([training.tokens])
        digest_tensors(params)

    step_s, full_s, light_s = timed(training.step), timed(full), timed(light)
    count = sum(p.numel() for p in params)
    print(f"reference model: {count} parameters; training step {step_s * 1e3:.2f} ms,"
          f" full fingerprints {full_s * 1e3:.2f} ms ({full_s / step_s:.1%} of a step),"
          f" light {light_s * 1e3:.3f} ms ({light_s / step_s:.1%})")


def throughput(device: str) -> None:
    x = torch.randn(16 * 1024 * 1024, device=device)  # 64 MiB of float32
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def reduce() -> None:
        x.sum()
        sync()

    sum_s = timed(reduce, 20)
    fp_s = timed(lambda: digest_tensors([x]), 10)  # ends with the sums on the host
    gbs = x.numel() * 4 / 1e9
    print(f"64 MiB float32 on {device}: torch.sum {gbs / sum_s:.1f} GB/s, digest_tensors"
          f" {gbs / fp_s:.2f} GB/s ({sum_s / fp_s:.1%} of the sum bound)")


if __name__ == "__main__":
    per_step()
    throughput("cpu")
    if torch.cuda.is_available():
        throughput("cuda")
