#!/usr/bin/env bash
# One device call on the lent GPU: install the carried wheels, then run the named steps in order.
#   bash benchmarks/gpu_session.sh STEP...      (ROLLBUF_COMMIT names the commit; OUT the results folder)
# Steps: kernels (gate + GAE/V-trace timings + host + V-trace tile sweep, benchmarks/kernels_h200.py), host (the
# host time at 4096x128 and its parts), host-path (benchmarks/host_path.py: the eager calls' host time on
# rl-triton's grid, a CUDA graph of nine calls, replays), host-ab (the host time of this tree and of .gpu_stage_old/'s, alternated; the old rows name the commit
# written in .gpu_stage_old/COMMIT),
# old (the same
# timings of rollbuf's public calls from the tree in .gpu_stage_old/; new-quick: the same from this tree), peers[:i/k[:budget]] (the peers
# grid, python -m rollbuf.bench --grid peers), ab (benchmarks/family_ab.sh), tests (the CUDA kernel test
# matrix, every case (RB_EXHAUSTIVE=1: the default run's covering slices and the rest, tests/conftest.py),
# cut at $TESTS_TIMEOUT_S seconds, or at $TESTS_DEADLINE, so that the summary comes back).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_rl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/.peers/rl-triton-0.1.3/src
export TORCH_CUDA_ARCH_LIST=9.0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    kernels) python3 benchmarks/kernels_h200.py --out "$OUT" --part gate,time,vtrace,host,vsweep 2>&1 | tee "$OUT/kernels.log" ;;
    host) python3 benchmarks/kernels_h200.py --out "$OUT" --part host,hostparts 2>&1 | grep -v "^ " | tail -40 ;;
    host-ab) for i in 1 2; do  # the host part of this tree and of .gpu_stage_old/'s, alternated, twice
        python3 benchmarks/kernels_h200.py --out "$OUT/host_new$i" --part host 2>&1 | tail -2
        ROLLBUF_COMMIT=$(cat .gpu_stage_old/COMMIT 2>/dev/null || echo old-tree) \
        PYTHONPATH=/tmp/site:$PWD/.gpu_stage_old python3 benchmarks/kernels_h200.py --out "$OUT/host_old$i" \
          --impl old --part host 2>&1 | tail -2; done
      python3 - "$OUT" <<'PY'
import csv, glob, sys, collections
t = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/host_*/kernels_*.csv")):
    for r in csv.DictReader(open(f)):
        if r["part"] == "host":
            t[(r["competitor"], r["impl"])].append(float(r["us"]))
for (c, impl), v in sorted(t.items()):
    print(f"host-ab {c:40s} {impl:4s} " + " ".join(f"{x:6.1f}" for x in v))
PY
      ;;
    host-path) python3 benchmarks/host_path.py --out "$OUT" 2>&1 | tee "$OUT/host_path.log" | tail -70 ;;
    kernels-quick) python3 benchmarks/kernels_h200.py --out "$OUT" --part time,vtrace,host 2>&1 | tee "$OUT/kernels.log" ;;
    new-quick) python3 benchmarks/kernels_h200.py --out "$OUT" --quick --part time,vtrace 2>&1 | tee "$OUT/kernels.log" | tail -40 ;;
    old) PYTHONPATH=/tmp/site:$PWD/.gpu_stage_old:$PWD/.peers/rl-triton-0.1.3/src python3 benchmarks/kernels_h200.py --out "$OUT" --impl old --quick \
           --part time,vtrace 2>&1 | tail -40 ;;
    peers*) IFS=: read -r _ label budget <<<"$step"  # peers:LABEL:BUDGET_S, extra arguments in $PEERS_ARGS
      python3 -m rollbuf.bench --grid peers ${PEERS_ARGS:-} ${budget:+--budget-s $budget} --out /tmp/peers \
        > /tmp/peers.log 2>&1; echo "peers rc=$?"; grep -v "it/s\]\|s/it\]" /tmp/peers.log | tail -40
      cp /tmp/peers/results.csv "$OUT/peers_${label}.csv" 2>/dev/null; cp /tmp/peers.log "$OUT/peers_${label}.log" ;;
    ab*) IFS=: read -r _ parts <<<"$step"  # ab or ab:PART,PART (benchmarks/family_ab.sh)
      bash benchmarks/family_ab.sh ${parts//,/ } 2>&1 | tee "$OUT/ab.log" ;;
    tests) limit=${TESTS_TIMEOUT_S:-540}  # or what is left before $TESTS_DEADLINE (seconds since the epoch)
      [ -n "${TESTS_DEADLINE:-}" ] && limit=$(( TESTS_DEADLINE - $(date +%s) )) && [ "$limit" -lt 1 ] && limit=1
      echo "tests: $limit s"; RB_EXHAUSTIVE=1 timeout "$limit" python3 -m pytest -v -n 14 -p no:cacheprovider -rfE tests/test_kernels.py tests/test_kernel_launch.py \
             tests/test_compile.py tests/test_autograd.py tests/test_windows.py tests/test_edge_cases.py \
             tests/test_new_estimator.py tests/test_lookback_order.py tests/test_rollout.py tests/test_repeated_calls.py tests/test_identities.py tests/test_validation.py tests/test_aot.py tests/test_no_sync.py ${TESTS_EXTRA:-} > "$OUT/gpu_tests.log" 2>&1; echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| (FAILED|ERROR) " "$OUT/gpu_tests.log" | head -30; tail -3 "$OUT/gpu_tests.log" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== step $step: $(( $(date +%s) - t0 )) s"
done
