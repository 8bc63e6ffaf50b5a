"""Time-major ``[T, N]`` buffers: the strategy sweep behind ``strategy(..., time_contiguous=False)``.

    ROLLBUF_COMMIT=$(git rev-parse --short HEAD) python benchmarks/time_major.py [--out DIR]

CleanRL/SB3 store rollouts ``[T, N]`` and pass the ``[N, T]`` views. For each shape and estimator
this times (device time, CUDA-graph replay over input sets rotated past the L2), after a float64
gate: the env-major ``[N, T]`` call (the reference point), the time-major call with the default
strategy and outputs written ``[N, T]`` (``OUTPUT_LAYOUT_OVERRIDE="env"``) or in the input's layout,
and (GAE) every (split, block_n, block_t) variant of the time-major tile. Table last, CSV under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_kernels import L2_BYTES, copy_bandwidth, estimator_call, make_inputs, provenance  # noqa: E402

import rollbuf.kernels as K  # noqa: E402
from rollbuf.bench.suite import graph_time  # noqa: E402

SHAPES = [(32768, 8), (16384, 128), (4096, 128), (1024, 1024), (16384, 1024), (4096, 4096), (512, 4096),
          (128, 4096)]
ESTIMATORS = ["gae", "vtrace"]
OUTPUTS = {"gae": 2, "lambda_returns": 1, "vtrace": 2, "retrace": 1}
READS = {"gae": ("rewards", "values", "terminated", "truncated"),
         "lambda_returns": ("rewards", "values", "terminated", "truncated"),
         "vtrace": ("rewards", "values", "terminated", "truncated", "log_probs", "target_log_probs"),
         "retrace": ("rewards", "values", "terminated", "truncated", "log_probs", "target_log_probs", "q_values")}


def variants(T, sweep):
    yield "default", dict()
    yield "default, [N, T] outputs", dict(layout="env")
    if not sweep:  # the tile sweep is GAE's; V-trace shows whether the defaults carry over
        return
    for split, bn, bt in itertools.product((False, True), (16, 32, 64), (16, 32, 64, 128)):
        if bt > max(T, 16) or (split and bt >= T):
            continue
        yield f"{'split' if split else 'walk'} {bn}x{bt}", dict(split=split, block_n=bn, block_t=bt)


def _outs(res):
    return tuple(res) if isinstance(res, tuple) else (res,)


_CHOICES = contextlib.ExitStack()


def set_knobs(**kw):
    """The kernels' choices (``rollbuf.kernels.forced``) for the calls that follow."""
    _CHOICES.close()
    _CHOICES.enter_context(K.forced(**kw))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sweep", default="gae", help="estimators whose tile variants are swept (comma-separated)")
    ap.add_argument("--estimators", default=",".join(ESTIMATORS))
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the logic on tiny shapes (interpreter)")
    args = ap.parse_args()
    sweep = set(args.sweep.split(","))
    estimators = args.estimators.split(",")
    dev = args.device
    shapes = SHAPES if dev == "cuda" else [(5, 37), (3, 300)]
    prov = provenance() if dev == "cuda" else {"device": "cpu"}
    bw = copy_bandwidth() if dev == "cuda" else 1e9
    rows = []
    for (N, T), name in itertools.product(shapes, estimators):
        sets_env = []
        nb = N * T * sum(1 if k in ("terminated", "truncated") else 4 for k in READS[name])
        nb += N * T * 4 * OUTPUTS[name]
        n_sets = max(2, min(8, -(-3 * L2_BYTES // nb)))
        for s in range(n_sets):
            sets_env.append(make_inputs(N, T, torch.float32, True, seed=s, device=dev))
        sets_tm = [{k: (v.mT.contiguous().mT if v is not None else None) for k, v in f.items()} for f in sets_env]
        set_knobs()
        ref = [o.double() for o in _outs(estimator_call(name, sets_env[0])())]

        def measure(label, sets, **knobs):
            set_knobs(**knobs)
            fns = [estimator_call(name, f) for f in sets]
            got = _outs(fns[0]())
            err = max(((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, ref))
            row = dict(estimator=name, N=N, T=T, variant=label, rel_err=err, out_stride=str(tuple(got[0].stride())),
                       **prov)
            if err < 1e-5:
                if dev == "cuda":
                    t, spread = graph_time(fns, reps=max(1, min(10, int(2e6 // (N * T)))))
                else:  # dry run: one interpreted call, not a measurement
                    t0 = time.perf_counter()
                    fns[0]()
                    t, spread = time.perf_counter() - t0, 0.0
                row.update(device_us=t * 1e6, spread=spread, pct_copy=100 * nb / t / bw)
            else:
                row.update(status="wrong")
            set_knobs()
            rows.append(row)
            return row

        env = measure("env-major", sets_env)
        for label, knobs in variants(T, name in sweep):
            measure(label, sets_tm, **knobs)
        shape_rows = [r for r in rows if r["estimator"] == name and r["N"] == N and r["T"] == T]
        best = min((r for r in shape_rows if r["variant"] not in ("env-major",) and "device_us" in r),
                   key=lambda r: r["device_us"])
        print(f"{name} {N}x{T}: env {env.get('device_us', float('nan')):.1f} µs; best time-major {best['variant']} "
              f"{best['device_us']:.1f} µs", flush=True)
        del sets_env, sets_tm, ref
        if dev == "cuda":
            torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(os.path.join(args.out, "time_major.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(f"\n{prov}; copy {bw / 1e9:.0f} GB/s\n")
    print("| estimator | N × T | env-major µs (% copy) | time-major default, [N,T] out | time-major default "
          "| best time-major variant | µs (% copy) |")
    print("|---|---|---|---|---|---|---|")
    for (N, T), name in itertools.product(shapes, estimators):
        rs = {r["variant"]: r for r in rows if r["estimator"] == name and r["N"] == N and r["T"] == T}
        ok = [r for r in rs.values() if "device_us" in r and r["variant"] != "env-major"]
        best = min(ok, key=lambda r: r["device_us"])

        def cell(r):
            return f"{r['device_us']:.1f} ({r['pct_copy']:.0f}%)" if r and "device_us" in r else "wrong"

        print(f"| {name} | {N} × {T} | {cell(rs.get('env-major'))} | {cell(rs.get('default, [N, T] outputs'))} "
              f"| {cell(rs.get('default'))} | {best['variant']} | {cell(best)} |")
    wrong = [r for r in rows if r.get("status") == "wrong"]
    print(f"\n{len(wrong)} wrong variant(s)" + "".join(f"\n  {r['estimator']} {r['N']}x{r['T']} {r['variant']} "
                                                   f"{r['rel_err']:.1e}" for r in wrong))


if __name__ == "__main__":
    main()
