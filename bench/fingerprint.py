"""Cost of the agent's fingerprints: per training step, and raw throughput.

1. Per step, for the bundled reference model (TinyLM + AdamW): the time of one
   training step without fingerprints vs the fingerprints the agent takes on a
   full step (parameters twice, optimizer state twice, learning rates,
   gradients, RNG, batch) and on a light one (parameters, learning rates,
   batch).
2. Throughput of `digest_tensors` vs `torch.sum` over the same 64 MiB tensor
   (the memory-bandwidth bound it is measured against), and of the integer sums
   an accelerator's tensors get (`_device_sums`, also run on CPU tensors here).

    python bench/fingerprint.py
"""

from __future__ import annotations

import torch
from reference_step import ReferenceTraining, timed

from torchchaos.rank.fingerprint import _device_sums, digest_object, digest_rng, digest_tensors


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


def accelerator_path(device: str) -> None:
    """The integer sums an accelerator's tensors get (`_device_sums`), against the
    reductions they are made of: torch's sum of the same float32 and of its bits as
    int32 (on a CPU build torch's integer sum is not vectorised: there the int32 sum is
    the bound; on a GPU both are memory-bound)."""
    x = torch.randn(16 * 1024 * 1024, device=device)
    words = x.view(torch.int32)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gbs = x.numel() * 4 / 1e9
    figures = {}
    for name, run in (("float32 sum", x.sum), ("int32 sum", words.sum),
                      ("_device_sums", lambda: _device_sums(x))):
        figures[name] = gbs / timed(lambda run=run: (run(), sync()), 10)
    print(f"64 MiB on {device}, the accelerator path: " + ", ".join(
        f"{name} {value:.1f} GB/s" for name, value in figures.items())
        + f" ({figures['_device_sums'] / figures['int32 sum']:.0%} of the int32 sum)")


if __name__ == "__main__":
    per_step()
    throughput("cpu")
    accelerator_path("cpu")
    if torch.cuda.is_available():
        throughput("cuda")
        accelerator_path("cuda")
