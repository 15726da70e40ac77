#!/usr/bin/env bash
# A CPU copy of pytorch/examples' DDP tutorial script, distributed/ddp-tutorial-series/
# multigpu_torchrun.py: the torchrun script most DDP users start from (a Trainer class,
# `snapshot.pt` written in place in the working directory every `save_every` epochs,
# "Resuming training from snapshot at Epoch N", a line per epoch, none per step).
#
#   bash bench/ddp_tutorial_prepare.sh EXAMPLES_CHECKOUT [WORK_DIR]
#   DDP_TUTORIAL=WORK_DIR python bench/incident_attribution.py --make DIR --scripts ddp_tutorial
#
# The script is its authors' and not part of this repository. It always takes a GPU
# (cuda.set_device, NCCL, device_ids); on a machine without one, the copy gets the CPU
# path below. One more change, on every machine: its loss, `F.cross_entropy` of a model
# with one output, is 0 at every step (a softmax over one class), so its weights never
# change and torchchaos refuses to judge it ("the reference run's parameters never
# changed"); the copy takes `F.mse_loss` instead. Its saving, resuming and printing are
# as written.
set -euo pipefail
checkout=$(realpath "$1")
work=$(realpath -m "${2:-/tmp/ddp-tutorial}")
rm -rf "$work" && mkdir -p "$work"
cp "$checkout/distributed/ddp-tutorial-series/multigpu_torchrun.py" \
   "$checkout/distributed/ddp-tutorial-series/datautils.py" "$work/"
if ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  python - "$work/multigpu_torchrun.py" <<'PY'
import sys
from pathlib import Path
p = Path(sys.argv[1])
s = p.read_text()
for old, new in [
    ('    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n', ""),
    ('init_process_group(backend="nccl")', 'init_process_group(backend="gloo")'),
    ("self.model = model.to(self.gpu_id)", "self.model = model"),
    ("DDP(self.model, device_ids=[self.gpu_id])", "DDP(self.model)"),
    ('loc = f"cuda:{self.gpu_id}"', 'loc = "cpu"'),
    ("source = source.to(self.gpu_id)", "source = source"),
    ("targets = targets.to(self.gpu_id)", "targets = targets"),
    ("pin_memory=True", "pin_memory=False"),
]:
    assert old in s, old
    s = s.replace(old, new)
p.write_text(s)
PY
fi
sed -i 's/loss = F.cross_entropy(output, targets)/loss = F.mse_loss(output, targets)/' \
  "$work/multigpu_torchrun.py"
grep -q "F.mse_loss(output, targets)" "$work/multigpu_torchrun.py"
echo "prepared $work/multigpu_torchrun.py"
