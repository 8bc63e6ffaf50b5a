set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.tcache ROLLBUF_COMMIT=$1
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_compile.py tests/test_autograd.py -m gpu 2>&1 | tee $OUT/gpu_tests.log | tail -2
timeout 110 python benchmarks/ab.py --out $OUT --variants "new=,warps4=ROLLBUF_K_NUM_WARPS_OVERRIDE=4,warps16=ROLLBUF_K_NUM_WARPS_OVERRIDE=16" --cases gae:16384x4096,gae:16384x1024,vtrace:16384x4096,retrace:16384x4096,gae:256x1048576:mask 2>&1 | tail -40
