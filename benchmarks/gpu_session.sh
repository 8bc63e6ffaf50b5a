#!/usr/bin/env bash
# One device call of a GPU session, for the lent H200 (see benchmarks/NOTES.md). Usage, from the
# repository root on the GPU machine, with the tensordict/pyvers wheels carried in .whl/:
#
#   bash benchmarks/gpu_session.sh check   # GPU tests, backward, launch, memory         (~5 min)
#   bash benchmarks/gpu_session.sh grid    # masked GAE cases again (in-kernel window end) (~2 min)
#   bash benchmarks/gpu_session.sh layout  # time-major strategy sweep + checks            (~2 min)
#   bash benchmarks/gpu_session.sh experiments # PRESOLVE forced on and EARLY_LOADS against the default (~3 min)
#
# Everything it writes goes under $OUT (logs, CSVs). ROLLBUF_COMMIT names the commit in the CSVs.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.tcache TORCHINDUCTOR_CACHE_DIR=$PWD/.icache
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
case "${1:-check}" in
  check)
    timeout 240 python -m pytest -q -p no:cacheprovider tests/test_autograd.py tests/test_compile.py tests/test_docs.py \
      tests/test_kernels.py -m gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -5
    timeout 150 python -m pytest -q -p no:cacheprovider tests/test_autograd.py -k "triton or variants or equal" \
      2>&1 | tee -a "$OUT/gpu_tests.log" | tail -3
    timeout 200 python benchmarks/backward.py --out "$OUT" 2>&1 | tee "$OUT/backward.log" | tail -28
    timeout 90 python benchmarks/launch_overhead.py --out "$OUT" 2>&1 | tail -6  # P2: where the full call goes
    timeout 90 python benchmarks/memory.py --out "$OUT" 2>&1 | tail -17  # P4: extra memory per call, every strategy
    for e in gae vtrace; do  # host time and launches of one fwd+bwd call
      timeout 60 python benchmarks/profile_backward.py --estimator $e 2>&1 | grep -E "host loop|cudaLaunchKernel "
    done
    ;;
  grid)
    # the scoreboard is complete (2424 cases); the masked GAE cases measured before the window end
    # moved into the kernel (bc20951) are re-timed here, merged with --from-csv (later rows win)
    timeout 400 python -m rollbuf.bench --grid gpu --estimators gae --mixes mask \
      --competitors rollbuf-triton --budget-s 330 --out "$OUT" 2>&1 | tail -12
    ;;
  layout)
    timeout 300 python benchmarks/time_major.py --out "$OUT" 2>&1 | tail -24
    ;;
  experiments)
    # the two kernel knobs against the shipped table (measured at aab284d: PRESOLVE — three passes for
    # split rows — wins for one row only, now the default there; EARLY_LOADS loses); their CUDA tests first
    timeout 200 python -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "(presolve or early) and (gae or vtrace)" -x --tb=short 2>&1 | tail -4
    C=gae:1x16384,gae:1x1048576,gae:8x1048576,gae:64x1048576,gae:256x1048576,gae:256x131072,gae:1x16777216
    C=$C,vtrace:1x1048576,vtrace:256x131072,gae:256x1048576:mask,gae:512x4096:term+trunc:float32:time
    C=$C,gae:4096x128,gae:32768x128,gae:16384x1024,gae:16384x4096,vtrace:16384x4096,retrace:16384x4096
    timeout 380 python benchmarks/ab.py --out "$OUT" --cases $C \
      --variants "default=,presolve=ROLLBUF_K_PRESOLVE=True,early=ROLLBUF_K_EARLY_LOADS=True" 2>&1 | tail -24
    ;;
  *) echo "usage: $0 check|grid|layout|experiments"; exit 2 ;;
esac
