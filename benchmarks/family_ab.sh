#!/usr/bin/env bash
# The A/B behind this round's strategy-table choices for the losing cases of the peers grid at e61272d
# (docs/benchmarks.md, "Peers"): V-trace and GAE advantages with rows of 1024+ steps (one row per
# program, the whole row in one chunk, 8 or 16 warps, against the table), and the forward traces
# (the kernel that scans the trace itself without a mask, against the tree in .gpu_stage_old/); and
# the short rows of few environments still behind at f76f27e (rows per program and warps).
#   bash benchmarks/family_ab.sh [PART...]  (vtrace advantages traces short many flip vwarps fold walk short8 retrace; default all; after
#                                            benchmarks/gpu_session.sh's wheel install; OUT = results;
#                                            AB_OLD=1: also the traces, and with fold its cases, with the tree
#                                            in .gpu_stage_old/)
set -u
OUT=${OUT:-out}
W="ROLLBUF_K_MAX_CHUNK=4096+ROLLBUF_K_BLOCK_N=1"
V="default=,whole8=$W+ROLLBUF_K_NUM_WARPS=8,whole16=$W+ROLLBUF_K_NUM_WARPS=16"
s() { local e=$1 m=$2; shift 2; local out=""; for x in "$@"; do out="$out${out:+,}$e:$x:$m"; done; echo "$out"; }
VT="$(s vtrace term-only 128x1024 512x1024 2048x1536 128x2048 128x4096 512x2048 2048x1024 2048x2048 8192x2048 2048x4096 8192x4096),$(s vtrace term+trunc 512x4096 2048x2048 8192x2048 8192x4096 16384x4096)"
ADV="$(s advantages term-only 128x512 2048x512 128x1024 2048x1024 8192x1024 128x4096 512x4096),$(s gae term-only 128x4096 512x4096),$(s lambda_returns term-only 128x4096 512x4096),$(s discounted_returns term-only 128x4096 512x4096),$(s monte_carlo_returns term-only 128x4096 512x4096)"
TR="$(s eligibility_traces term-only 128x512 512x512 128x1024 128x4096 512x4096 2048x4096 8192x4096),$(s episodic_sums term-only 128x512 512x512)"
# short rows of few environments (latency-bound, 0.79-0.96x rl-triton at f76f27e): rows per program x warps
SHORT="$(s advantages term-only 128x128 128x512 512x128 512x512 2048x512 8192x512),$(s vtrace term-only 128x128 128x1024 512x1024 2048x512),$(s eligibility_traces term-only 128x512 512x512 128x1024)"
# rows of 2049-4096 steps with many environments (walked by the table; the naive kernel holding them whole with
# 16 warps ran 8192x4096 at 151 µs for advantages against rollbuf's 179.5 at 6f21364): held whole against the table
MANY="$(s advantages term-only 2048x4096 8192x4096 16384x4096),$(s advantages term+trunc 8192x4096 16384x4096),$(s gae term-only 2048x4096 8192x4096),$(s lambda_returns term-only 8192x4096)"
# the backward scans with each chunk held in reverse (the scan in lane order: Triton's reverse scan
# flips every element across the warp with five chained shuffles each way), short rows and long
FLIP="$(s advantages term-only 128x128 128x512 512x512 2048x512 8192x512 4096x128 16384x128 32768x8 32768x32 128x1024 512x1024 512x4096 2048x2048 8192x1024 8192x4096 256x131072 1x1048576),$(s advantages mask 4096x128 2048x2048),$(s gae term-only 4096x128 2048x512 8192x4096),$(s lambda_returns term-only 4096x128 2048x2048),$(s vtrace term-only 128x512 4096x128 2048x512 8192x512 512x1024 2048x2048 8192x4096 32768x16),$(s vtrace term+trunc 4096x128 2048x2048 256x131072),$(s retrace term-only 4096x128 2048x2048)"
# V-trace without truncations where it trails rl-triton at e73a589 (0.88-0.95x; rows held whole with 8
# warps at 1024 steps, 16 from 2048; rl-triton runs 8 at 1024 and 16 at 2048): warps against the table
VW="$(s vtrace term-only 2048x512 8192x512 2048x1024 8192x1024 2048x2048 8192x2048)"
VS="default=,w2=ROLLBUF_K_NUM_WARPS=2,w8=ROLLBUF_K_NUM_WARPS=8,bn1=ROLLBUF_K_BLOCK_N=1,bn1w2=ROLLBUF_K_BLOCK_N=1+ROLLBUF_K_NUM_WARPS=2"
# the carry folded into the scan's first map (no map applied after the scan; the scan's multiplicative
# components dead after it, Triton's flips of a reverse scan included), with the absent truncations'
# local term, the flag selects and the unmasked outputs' selects gone: this tree against the one in
# .gpu_stage_old/ (part fold, AB_OLD=1), and TD(λ) rows of 4096 steps held whole against the table
FOLD="$(s advantages term-only 4096x128 16384x128 2048x512 512x1024 512x4096 2048x2048 8192x4096 32768x8 1x1048576),$(s gae term-only 4096x128 2048x2048 8192x4096),$(s advantages mask 4096x128 2048x2048),$(s vtrace term-only 4096x128 32768x16 2048x1024 2048x2048 8192x2048),$(s vtrace term+trunc 2048x2048),$(s vtrace mask 4096x128 2048x2048),$(s retrace term-only 2048x2048),$(s eligibility_traces term-only 512x512 8192x4096)"
FOLD_MANY="$(s advantages term-only 8192x4096 16384x4096),$(s gae term-only 8192x4096)"
# walked rows of many chunks (the fold puts each chunk's scan on the chain from chunk to chunk): env-major
# rows longer than 4096 steps with many environments, and time-major tiles; this tree against .gpu_stage_old/
WALK="$(s advantages term-only 1024x16384 4096x8192),$(s retrace term-only 2048x2048),$(s gae term-only 1024x16384),$(s vtrace term-only 1024x16384),$(s vtrace term+trunc 2048x8192),$(s retrace term-only 1024x16384),$(s eligibility_traces term-only 1024x16384),$(s advantages term-only 4096x128 16384x128 2048x2048 | sed 's/:term-only/:term-only:float32:time/g'),$(s vtrace term-only 4096x128 | sed 's/:term-only/:term-only:float32:time/g')"
# rows of 8-16 steps with many environments (the naive kernel, 64 rows x 2 warps, ran GAE advantages
# 32768x8 at 2.47 µs against the table's 32 rows x 4 warps at 2.63 at 7bce722): rows per program x warps
SHORT8="$(s advantages term-only 4096x8 8192x8 16384x8 32768x8 16384x16 32768x16),$(s gae term-only 32768x8 32768x16),$(s lambda_returns term-only 32768x8),$(s vtrace term-only 32768x8 32768x16),$(s eligibility_traces term-only 32768x8)"
V8="default=,bn64w2=ROLLBUF_K_BLOCK_N=64+ROLLBUF_K_NUM_WARPS=2,bn64w4=ROLLBUF_K_BLOCK_N=64+ROLLBUF_K_NUM_WARPS=4,bn32w2=ROLLBUF_K_BLOCK_N=32+ROLLBUF_K_NUM_WARPS=2,bn128w4=ROLLBUF_K_BLOCK_N=128+ROLLBUF_K_NUM_WARPS=4"
# Retrace's rows of 1024-2048 steps (2048x2048 1.10x slower after the fold, tree against tree at 7bce722):
# warps, 1024-step chunks and the neighbour's re-load against the table (one row per program, one
# 2048-step chunk, 8 warps)
RT="$(s retrace term-only 512x2048 2048x2048 8192x2048 2048x1024 8192x1024),$(s retrace term+trunc 2048x2048)"
VR="default=,w4=ROLLBUF_K_NUM_WARPS=4,w16=ROLLBUF_K_NUM_WARPS=16,mc1024=ROLLBUF_K_MAX_CHUNK=1024,gather=ROLLBUF_K_SHIFT_LOAD=False"
run() { local label=$1; shift; echo "== ab $label"; python3 -m rollbuf.bench --experiment ab --out "$OUT/$label" "$@" 2>&1 | tail -25; }
for part in ${@:-vtrace advantages traces short many flip vwarps fold walk short8 retrace}; do
  case $part in
    vtrace) run vtrace --cases "$VT" --variants "$V" ;;
    advantages) run advantages --cases "$ADV" --variants "$V" ;;
    traces) run traces --cases "$TR" --variants "$V" ;;
    short) run short --cases "$SHORT" --variants "$VS" ;;
    many) run many --cases "$MANY" --variants "$V" ;;
    vwarps) run vwarps --cases "$VW" --variants "default=,w4=ROLLBUF_K_NUM_WARPS=4,w8=ROLLBUF_K_NUM_WARPS=8,w16=ROLLBUF_K_NUM_WARPS=16" ;;
    fold) run fold --cases "$FOLD"; run fold_many --cases "$FOLD_MANY" --variants "$V"
      if [ -d .gpu_stage_old ] && [ -n "${AB_OLD:-}" ]; then
        echo "== ab fold_old"; (cd .gpu_stage_old && python3 -m rollbuf.bench --experiment ab --out "$OUT/fold_old" --cases "$FOLD" 2>&1 | tail -40)
      fi ;;
    short8) run short8 --cases "$SHORT8" --variants "$V8" ;;
    retrace) run retrace --cases "$RT" --variants "$VR" ;;
    walk) run walk --cases "$WALK"
      if [ -d .gpu_stage_old ] && [ -n "${AB_OLD:-}" ]; then
        echo "== ab walk_old"; (cd .gpu_stage_old && python3 -m rollbuf.bench --experiment ab --out "$OUT/walk_old" --cases "$WALK" 2>&1 | tail -25)
      fi ;;
    flip) run flip --cases "$FLIP" --variants "table=ROLLBUF_K_FLIP=False,flip=ROLLBUF_K_FLIP=True,default=" ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
if [ -d .gpu_stage_old ] && [ -n "${AB_OLD:-}" ] && [[ " ${*:-traces} " == *" traces "* ]]; then
  echo "== ab traces_old"
  (cd .gpu_stage_old && python3 -m rollbuf.bench --experiment ab --out "$OUT/traces_old" --cases "$TR" 2>&1 | tail -15)
fi
