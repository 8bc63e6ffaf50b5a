"""The per-shape table of docs/benchmarks.md now lives in the benchmark CLI:

    python -m rollbuf.bench --experiment why [benchmarks/results/bench_gpu_*.csv ...]

This file only re-exports it for tests/test_docs.py, which loads it by path.
"""

from rollbuf.bench.experiments.why import default_csvs, main, report  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(main())
