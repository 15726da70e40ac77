"""The agent sees each step's top-level module calls, and only those, without torch's
global module hooks (which would send every module call down torch's slow path).

The agent patches torch for good once installed, so each case runs in a process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    os.environ.update(RANK="0", LOCAL_RANK="0")
    import torch
    from torch.nn.modules import module as nn_module
    from torchchaos import env
    from torchchaos.rank.agent import Agent
    from torchchaos.rank.fingerprint import digest_tensors

    run = Path(sys.argv[1])
    (run / "_chaos" / "weights").mkdir(parents=True)
    Agent({**os.environ, env.RUN_DIR: str(run)}).install()

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x, fail=False):
            if fail:
                raise ValueError("a forward that fails")
            return self.linear(x).relu()

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()
            self.head = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.head(self.inner(x))

    torch.manual_seed(0)
    model, loss_module = Outer(), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(3, 4), torch.randn(3, 1)
    expected = []
    for step in range(3):
        opt.zero_grad()
        if step == 1:  # a failed forward, caught by the script, leaves no call under way
            try:
                model.inner(x, fail=True)
            except ValueError:
                pass
        out = model(x)
        loss = loss_module(out, y)
        loss.backward()
        opt.step()
        # the top-level calls' arguments: the model's, then the loss module's
        top = ([x] if step != 1 else [x, x]) + [out, y]
        expected.append(digest_tensors(top))
    print(json.dumps({"expected": expected,
                      "global_hooks": len(nn_module._global_forward_pre_hooks)
                      + len(nn_module._global_forward_hooks)}))
    os._exit(0)
""")


def test_only_top_level_calls_make_the_batch_and_no_global_hook_is_installed(tmp_path: Path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout.splitlines()[-1])
    history = tmp_path / "_chaos" / "history" / "rank-0.jsonl"
    steps = [e for e in map(json.loads, history.read_text().splitlines()) if e["ev"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3]
    assert [e["fp"]["batch"] for e in steps] == told["expected"]
    assert told["global_hooks"] == 0
