"""The agent tells optimizer.step(closure) from a plain step, as torch's hooks call it."""

from __future__ import annotations

import torch
from torch.optim import optimizer as optim_module

from torchchaos.rank.agent import _has_closure


def test_a_closure_is_seen_whether_passed_by_position_or_by_name():
    seen: list[bool] = []
    handle = optim_module.register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append(_has_closure(args, kwargs)))
    try:
        weight = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([weight], lr=0.1)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = (weight * weight).sum()
            loss.backward()
            return loss

        weight.grad = torch.ones(2)
        opt.step()
        opt.step(closure)
        opt.step(closure=closure)
    finally:
        handle.remove()
    assert seen == [False, True, True]  # the hooks' args start with the optimizer itself
