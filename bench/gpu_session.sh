#!/bin/bash
# One call on a lent GPU machine (see bench/README.md, "A session with a GPU"): the CUDA backend
# checked against the CPU backend on the real device, then timed. Prepared here, run there as
#
#     bash bench/gpu_session.sh        (device tool: carry [".gpu"], timeout_s 470)
#
# .gpu/ (ignored by git) holds what travels with it: tiny.en packed by bench/carry_model.py, the
# bench's two clips as .npy, and wheels (`pip download` as the device README says) of soundfile,
# cffi and pycparser, which the machine's image lacks, and of numpy 2.4: its numba-cuda 0.30.4
# fails to compile any kernel under its numpy 2.5 (np.row_stack is gone). Every step has its own time limit and the next runs whatever the
# last did; logs go to $OUT (the device tool brings them back) and the summary to stdout.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NUMBA_CACHE_DIR=/tmp/numba-cache
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if ls .gpu/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/*.whl
    export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
step() { local limit=$1 log=$2; shift 2; echo "== $* (limit ${limit}s)"; local t=$SECONDS
         timeout "$limit" "$@" >"$OUT/$log" 2>&1; local rc=$?
         grep -v "^CASE .* ok$" "$OUT/$log" | tail -n 40; echo "== rc $rc, $((SECONDS - t)) s"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c "import sys, numpy, numba, numba_cuda, cuda.core; print(sys.version.split()[0], 'numpy', numpy.__version__,
'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cuda.core', cuda.core.__version__)"
nproc; grep -m1 'model name' /proc/cpuinfo

# 1. Random weights in tiny.en's and base's shapes: launch cost, encoder, decoder step, a fixed
#    100-token request, each checked against the CPU backend (compiles every CUDA kernel once).
step 170 random.log python3 bench/gpu.py --random --models tiny.en,base --kernels
# 2. Every op, GPU against CPU, at the simulator's test shapes and tolerance.
step 60 ops.log python3 tests/helpers/cudasim_check.py --gpu
# 3. Real speech: tiny.en (8-bit-rounded weights, the same on both backends), both clips, the
#    transcript compared with the CPU's, and a profile of the decoder step.
python3 bench/carry_model.py unpack .gpu/tiny.en-q8.npz /tmp/tiny.en-q8 >/dev/null
step 130 real.log python3 bench/gpu.py --models /tmp/tiny.en-q8 --work .gpu --profile
# 4. A whole random-weight model in float32 and int8 (tests/helpers/cudasim_model.py), GPU against CPU.
for k in cuda cpu; do timeout 40 python3 tests/helpers/cudasim_model.py $k 2>"$OUT/model-$k.err" | grep '^REPORT' | cut -c8- >"$OUT/model-$k.json"; done
python3 - "$OUT" <<'PY'
import json, sys
import numpy as np
g, c = (json.load(open(f"{sys.argv[1]}/model-{k}.json")) for k in ("cuda", "cpu"))
print("== random-weight model, GPU against CPU: states max |d|",
      float(np.abs(np.subtract(g["states"], c["states"])).max()),
      "| tokens", "same" if g["tokens"] == c["tokens"] else f"DIFFER {g['tokens']} {c['tokens']}",
      "| int8 tokens", g["int8_tokens"], c["int8_tokens"])
PY
