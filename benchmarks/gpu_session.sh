#!/usr/bin/env bash
# One session on a GPU machine with no package index: install the carried wheels, then run the named
# steps in order, each a call of `python -m benchmarks` (docs/benchmarks.md) or the CUDA test matrix.
#   bash benchmarks/gpu_session.sh STEP...      (OUT: the results folder; ROLLBUF_COMMIT names the commit)
# Steps:
#   grid:NAME[:LABEL[:BUDGET_S]]  python -m benchmarks scoreboard --grid NAME (extra arguments in $GRID_ARGS),
#                                 results.csv copied to $OUT/NAME_LABEL.csv
#   host                          python -m benchmarks host
#   host-path                     python3 benchmarks/host_path.py: the eager calls' host time on rl-triton's grid,
#                                 a CUDA graph of nine calls against their device time, graph replays
#   backward | memory | llm       python -m benchmarks backward | memory | llm --device cuda
#   llm-groups                    python -m benchmarks llm-groups (verl's vectorized GRPO/RLOO against rollbuf)
#   long-call                     python3 benchmarks/long_call.py: the eager call of long rows split into its parts
#   llm-agents                    python -m benchmarks llm-agents: OTB, TIR-OTB, GiGPO, turn-level against their loops
#   frameworks                    python -m benchmarks frameworks: the frameworks' advantage code against rollbuf's calls
#   wall | wall-sweep             python -m benchmarks wall [--sweep]: every estimator at 2^24 elements against a copy
#   wall-window                   python -m benchmarks wall --window: the split-row cases under the look-back's windows
#   wall-one-row                  python -m benchmarks wall --one-row: one row of 2^16-2^24 steps, default vs three passes
#   ab:TREE1,TREE2,...            python3 benchmarks/device_ab.py TREE1 TREE2 ...: device time of several trees
#   tests                         the CUDA test matrix, every case (RB_EXHAUSTIVE=1, tests/conftest.py), cut at $TESTS_TIMEOUT_S seconds (or at $TESTS_DEADLINE,
#                                 seconds since the epoch) so that the summary comes back
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_rl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/.peers/rl-triton-0.1.3/src
export TORCH_CUDA_ARCH_LIST=9.0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    grid:*) IFS=: read -r _ grid label budget <<<"$step"
      python3 -m benchmarks scoreboard --grid "$grid" ${GRID_ARGS:-} ${budget:+--budget-s $budget} --out "/tmp/$grid" \
        > "/tmp/$grid.log" 2>&1; echo "scoreboard rc=$?"; grep -v "it/s\]\|s/it\]" "/tmp/$grid.log" | tail -40
      cp "/tmp/$grid/results.csv" "$OUT/${grid}_${label:-run}.csv" 2>/dev/null; cp "/tmp/$grid.log" "$OUT/${grid}_${label:-run}.log" ;;
    host) python3 -m benchmarks host --out "$OUT" 2>&1 | tail -20 ;;
    host-path) python3 benchmarks/host_path.py --out "$OUT" 2>&1 | tee "$OUT/host_path.log" | tail -70 ;;
    backward|memory) python3 -m benchmarks "$step" --out "$OUT" 2>&1 | tail -40 ;;
    llm) python3 -m benchmarks llm --device cuda --out "$OUT" ${LLM_ARGS:-} 2>&1 | tail -10 ;;
    llm-groups) python3 -m benchmarks llm-groups --out "$OUT" 2>&1 | tail -20 ;;
    llm-agents) python3 -m benchmarks llm-agents --out "$OUT" 2>&1 | tee "$OUT/llm_agents.log" | tail -12 ;;
    frameworks) python3 -m benchmarks frameworks --out "$OUT" 2>&1 | tee "$OUT/frameworks.log" | tail -10 ;;
    wall) python3 -m benchmarks wall --out "$OUT" 2>&1 | tee "$OUT/wall.log" | tail -85 ;;
    wall-sweep) python3 -m benchmarks wall --sweep --out "$OUT" 2>&1 | tee "$OUT/wall.log" | tail -40 ;;
    wall-window) mkdir -p "$OUT/window" && python3 -m benchmarks wall --window --out "$OUT/window" 2>&1 \
      | tee "$OUT/window/wall.log" | tail -40 ;;
    wall-one-row) mkdir -p "$OUT/one_row" && python3 -m benchmarks wall --one-row --out "$OUT/one_row" 2>&1 \
      | tee "$OUT/one_row/wall.log" | tail -40 ;;
    long-call) python3 benchmarks/long_call.py --out "$OUT" 2>&1 | tee "$OUT/long_call.log" | tail -12 ;;
    ab:*) IFS=, read -r -a trees <<<"${step#ab:}"
      OUT="$OUT" python3 benchmarks/device_ab.py "${trees[@]}" 2>&1 | tee "$OUT/device_ab.log" | tail -24 ;;
    tests) limit=${TESTS_TIMEOUT_S:-540}
      [ -n "${TESTS_DEADLINE:-}" ] && limit=$(( TESTS_DEADLINE - $(date +%s) )) && [ "$limit" -lt 1 ] && limit=1
      echo "tests: $limit s"; RB_EXHAUSTIVE=1 timeout "$limit" python3 -m pytest -v -n 14 -p no:cacheprovider -rfE tests/test_kernels.py \
        tests/test_kernel_launch.py tests/test_compile.py tests/test_autograd.py tests/test_windows.py tests/test_edge_cases.py \
        tests/test_new_estimator.py tests/test_lookback_order.py tests/test_rollout.py tests/test_repeated_calls.py \
        tests/test_identities.py tests/test_validation.py tests/test_aot.py tests/test_no_sync.py ${TESTS_EXTRA:-} > "$OUT/gpu_tests.log" 2>&1; echo "pytest rc=$?"
      grep -E "^(FAILED|ERROR)| (FAILED|ERROR) " "$OUT/gpu_tests.log" | head -30; tail -3 "$OUT/gpu_tests.log" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== step $step: $(( $(date +%s) - t0 )) s"
done
