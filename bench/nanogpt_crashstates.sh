#!/usr/bin/env bash
# nanoGPT's train.py under `torchchaos crashpoints`, judged from one recording per save.
#
#   bash bench/nanogpt_crashstates.sh NANOGPT_CHECKOUT [WORK_DIR]
#
# nanoGPT is not part of this repository (its code is its authors'): pass a checkout of
# github.com/karpathy/nanoGPT. On a machine without a GPU its DDP branch cannot run
# (it always calls torch.cuda.set_device), so a copy in WORK_DIR gets the two-line CPU
# path below and nothing else; with a GPU, use the checkout as it is. The character data
# set is made from text on this machine (the Debian licence texts, 300 kB) with nanoGPT's
# own data/shakespeare_char/prepare.py, which only downloads when input.txt is missing.
#
# `--out_dir={run_dir}/out` makes nanoGPT store its run folder's absolute path in every
# checkpoint (its config dict), as it does wherever out_dir is given as an absolute path:
# the crash states are recovered where the recording ran (torchchaos.host.seen_at).
set -euo pipefail
checkout=$(realpath "$1")
work=$(realpath -m "${2:-/tmp/nanogpt-crashstates}")
rm -rf "$work" && mkdir -p "$work"
cp -r "$checkout" "$work/nanoGPT"
cd "$work/nanoGPT"
if ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  python - <<'EOF'
from pathlib import Path
p = Path("train.py")
s = p.read_text()
s = s.replace("    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n",
              "    if device != 'cpu':  # CPU path (torchchaos bench): upstream takes a GPU here\n"
              "        device = f'cuda:{ddp_local_rank}'\n        torch.cuda.set_device(device)\n")
s = s.replace("model = DDP(model, device_ids=[ddp_local_rank])",
              "model = DDP(model, device_ids=[ddp_local_rank] if device != 'cpu' else None)")
p.write_text(s)
EOF
  device=(--device=cpu --backend=gloo --dtype=float32)
else
  device=()
fi
cat /usr/share/common-licenses/* | head -c 300000 > data/shakespeare_char/input.txt
(cd data/shakespeare_char && python prepare.py >/dev/null)
time torchchaos crashpoints --out "$work/out" --cache-dir "$work/cache" \
  --link configurator.py --link data -- \
  "$work/nanoGPT/train.py" "$work/nanoGPT/config/train_shakespeare_char.py" "${device[@]}" \
  --compile=False --gradient_accumulation_steps=2 --n_layer=2 --n_head=2 --n_embd=32 --block_size=32 --batch_size=4 \
  --max_iters=30 --lr_decay_iters=30 --warmup_iters=2 --eval_interval=10 --eval_iters=2 \
  --log_interval=1 --always_save_checkpoint=True --dropout=0.0 --out_dir={run_dir}/out
