"""The bundled SDC trainee as a plain training script, for one chaos run per trial.

A bench script, not a target: it uses the campaign's own detectors and step seeding
(`torchchaos.sdc`), so that both ways run the same code.

`torchchaos detectors` runs many trials inside one job (`torchchaos.sdc.trials`). This
script runs the same training, step for step (the same trainee, the same per-step
seeds, the same detector watching after each backward), as an ordinary torchrun job, so
that a trial can also be run the old way, as a whole chaos run with a `bitflip` fault:
`bench/sdc_trials.py` runs a sample both ways and compares the verdicts and the cost.
A detection is reported to torchchaos (`torchchaos.api.report_detection`); the job goes
on, as the campaign's detectors do.

    torchchaos run --nproc 2 --fault bitflip:rank=1,step=10,tensor=param \\
        -- bench/targets/sdc_trainee_run.py --warmup 8 --steps 8 --detector replica:every=2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist

from torchchaos import api
from torchchaos.sdc import detectors
from torchchaos.sdc.trials import load_trainee, rerun_step, seed_step
from torchchaos.sdc.view import StepView


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--detector", default="replica:every=2")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    bundled = Path(__file__).resolve().parents[2] / "targets" / "sdc_trainee.py"
    trainee = load_trainee(str(bundled), dist.get_rank(), dist.get_world_size())
    detector = detectors.make(args.detector, trainee.guard)
    for number in range(1, args.warmup + args.steps + 1):
        seed_step(number)
        trainee.optimizer.zero_grad(set_to_none=True)
        batch = trainee.batch(number)
        loss = trainee.loss(trainee.model, batch)
        loss.backward()
        seen = StepView(number - args.warmup, float(loss.detach()), trainee.params,
                        lambda n=number, b=batch: rerun_step(trainee, n, b))
        fired = torch.tensor([float(detector.check(seen))])
        dist.all_reduce(fired, op=dist.ReduceOp.MAX)
        if fired.item() and number > args.warmup:
            api.report_detection("sdc", detector=args.detector, step=number)
        trainee.optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
