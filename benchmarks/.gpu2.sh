set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.tcache ROLLBUF_COMMIT=$1
C=gae:32768x8,gae:4096x128,gae:32768x128,gae:16384x1024,gae:16384x4096,gae:256x1048576,gae:1x1048576,gae:64x131072,vtrace:16384x4096,vtrace:4096x128,retrace:16384x4096,eligibility_traces:16384x4096,gae:256x1048576:mask,gae:4096x128:term+trunc:float32:time,gae:4096x4096:term+trunc:float32:time,gae:16384x4096:term+trunc:bfloat16
timeout 330 python benchmarks/ab.py --out $OUT --variants "new=,unit0=ROLLBUF_K_UNIT_STRIDE_OVERRIDE=0,gather=ROLLBUF_K_SHIFT_LOAD_OVERRIDE=False,chunk1024=ROLLBUF_K_MAX_CHUNK_OVERRIDE=1024" --cases $C 2>&1 | tail -22
timeout 50 python benchmarks/launch_overhead.py --out $OUT 2>&1 | tail -5
timeout 170 python -m pytest -q -p no:cacheprovider tests/test_kernels.py -m gpu -x 2>&1 | tee $OUT/gpu_tests.log | tail -3
