"""The CPU path: the vectorised ``torch`` backend against the sequential reference loop.

    python -m rollbuf.bench --experiment cpu-torch [--n 8 --t 32768] [--out results.csv]

Each estimator on a random rollout with terminations, truncations and a bootstrapped window end;
median of 5 calls of the torch backend, one call of the reference loop; relative L2 error between
them. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import platform
import statistics
import time

import torch


from rollbuf.bench import suite  # noqa: E402
from rollbuf.testing import make_rollout, run_estimator  # noqa: E402

ESTIMATORS = suite.ESTIMATORS
PARAMS = suite.PARAMS


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench --experiment cpu-torch")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--t", type=int, default=32768)
    ap.add_argument("--out", default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    f = make_rollout(args.n, args.t, seed=0, p_terminated=0.01, p_truncated=0.01, p_masked=0.0)
    f["mask"] = None  # no mask, as most trainers call it
    rows = []
    for name in ESTIMATORS:
        p = PARAMS[name]
        run_estimator(name, f, backend="torch", **p)  # warm-up
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fast = run_estimator(name, f, backend="torch", **p)
            times.append(time.perf_counter() - t0)
        t_fast = statistics.median(times)
        t0 = time.perf_counter()
        ref = run_estimator(name, f, backend="reference", **p)
        t_ref = time.perf_counter() - t0
        fast = fast if isinstance(fast, tuple) else (fast,)
        ref = ref if isinstance(ref, tuple) else (ref,)
        err = max(((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
                  for a, b in zip(fast, ref))
        rows.append(dict(estimator=name, N=args.n, T=args.t, torch_ms=t_fast * 1e3, reference_ms=t_ref * 1e3,
                         speedup=t_ref / t_fast, rel_err=err, threads=torch.get_num_threads(),
                         cpu=platform.processor() or platform.machine(), torch=torch.__version__))
        print(f"{name:22s} torch {t_fast * 1e3:8.1f} ms  reference {t_ref * 1e3:8.0f} ms  "
              f"{t_ref / t_fast:6.1f}x  err {err:.1e}", flush=True)
    if args.out:
        with open(args.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print("\n| estimator | torch ms | reference ms | speedup | rel. error |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['estimator']} | {r['torch_ms']:.1f} | {r['reference_ms']:.0f} | {r['speedup']:.1f}× | {r['rel_err']:.1e} |")

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
