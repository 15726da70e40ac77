#!/usr/bin/env bash
# The checks a session with a GPU machine runs first, as one script with a deadline.
#
# Made for the device tool's machines (an image with CUDA PyTorch and no network):
# wheels the image lacks travel in .whl/ (and libfuse 3 as Debian packages in
# .whl/deb/), the package installs with no dependencies and no build isolation,
# then, each step bounded so that the logs of every finished step come back:
#
#   1. the machine: GPU, driver, torch, NCCL, cores, /dev/fuse
#   2. python -m pytest -m gpu (tests/e2e/test_gpu.py, CUDA bit flips and digests,
#      the gpu fault kind's errors: a sticky device-side assert, a CUDA OOM, a spinning
#      kernel; the two-replica tests and the spinning-kernel hangs, as 2 ranks sharing
#      one GPU over gloo where there is one GPU)
#   3. the real nanoGPT and PyTorch DDP tutorial (tests/e2e/test_real_scripts.py), from
#      checkouts placed untracked in the tree (the machine has no network): .checkouts/nanoGPT
#      with data/shakespeare_char prepared, .checkouts/examples; skipped where absent
#   4. bench/fingerprint.py (digest vs torch.sum on cuda)
#   5. bench/overhead.py on one NCCL rank
#   6. bench/crashstates_scale.py on the CPU (gloo) with this machine's cores: how far
#      warm recoveries hide start-up when cores are not the limit
#
# The wheels and packages, made here before the call (git ignores .whl/ through
# .git/info/exclude; name it in the device call's `carry`):
#
#     pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 -d .whl \
#         mfusepy py-spy jsonschema jsonschema-specifications referencing rpds-py
#     mkdir -p .whl/deb && (cd .whl/deb && apt-get download libfuse3-3 fuse3)
#
#     OUT=/tmp/gpu-check DEADLINE_S=470 [ONLY="pytest-gpu crashstates"] bash bench/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
END=$(( $(date +%s) + ${DEADLINE_S:-470} ))
export PYTHONUNBUFFERED=1

# Runs "$@" with at most CAP seconds, and never past the deadline; output to $OUT/NAME.txt.
step() {
    local name=$1 cap=$2; shift 2
    if [[ -n "${ONLY:-}" && " machine install $ONLY " != *" $name "* ]]; then return; fi
    local left=$(( END - $(date +%s) - 10 ))
    (( left < cap )) && cap=$left
    if (( cap < 15 )); then echo "== $name: skipped, deadline"; return; fi
    echo "== $name (at most ${cap}s): $*"
    local start=$(date +%s)
    timeout -k 5 "$cap" "$@" > "$OUT/$name.txt" 2>&1
    echo "== $name: exit $?, $(( $(date +%s) - start ))s"
    tail -n 25 "$OUT/$name.txt"
}

machine() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__,
        "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
        "nccl", torch.cuda.nccl.version())'
    echo "cores $(nproc)"; free -g | head -2; df -h /tmp | tail -1
    ls -l /dev/fuse; grep -w fuse /proc/filesystems
}

install() {
    if compgen -G ".whl/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl || return 1
    fi
    python3 -m pip install -q --no-deps --no-build-isolation --no-cache-dir . || return 1
    cd /tmp && python3 -c 'import torchchaos, mfusepy; print("torchchaos", torchchaos.__version__)'
}

# libfuse 3 and fusermount3 unpack beside the system, never into / (a package's ./bin/
# replaces the image's /bin -> usr/bin link and breaks /bin/sh); mfusepy is told the path.
for deb in .whl/deb/*.deb; do [ -e "$deb" ] && dpkg -x "$deb" /tmp/fuse3; done
export FUSE_LIBRARY_PATH=/tmp/fuse3/lib/x86_64-linux-gnu/libfuse3.so.3 PATH="$PATH:/tmp/fuse3/bin"
export -f machine install
step machine 30 bash -c machine
step install 120 bash -c install
step pytest-gpu 260 python3 -m pytest -m gpu -ra -p no:cacheprovider tests/e2e/test_gpu.py \
    tests/faults/test_bits.py tests/rank/test_fingerprint.py tests/e2e/test_e2e_hang.py
# the checkouts, made here before the call: fetch karpathy/nanoGPT and pytorch/examples
# into .checkouts/, and give nanoGPT's data/shakespeare_char/input.txt any text (its
# prepare.py downloads only a missing file), then run prepare.py there
if [[ -d .checkouts/nanoGPT && -d .checkouts/examples ]]; then
    step realscripts 200 env TORCHCHAOS_NANOGPT_DIR="$PWD/.checkouts/nanoGPT" \
        TORCHCHAOS_EXAMPLES_DIR="$PWD/.checkouts/examples" \
        python3 -m pytest -m gpu -ra -p no:cacheprovider tests/e2e/test_real_scripts.py
else
    echo "== realscripts: skipped, no .checkouts/nanoGPT and .checkouts/examples"
fi
(cd bench && step fingerprint 45 python3 fingerprint.py)
step overhead 120 python3 bench/overhead.py --sizes small large --repeats 2 --nproc 1
step crashstates 200 env CUDA_VISIBLE_DEVICES= python3 bench/crashstates_scale.py --sizes 1,300 \
    --points 2 --no-per-point
echo "== done, $(( END - $(date +%s) ))s before the deadline"
