"""Where the time of one triton fwd+bwd call goes, on a CUDA GPU (host vs device, per op).

    python -m rollbuf.bench --experiment profile-backward [--estimator gae] [--n 4096] [--t 128]

Prints the host time of the call (no sync), the call with a sync, the CUDA-graph-free device time
(``do_bench``), a ``torch.profiler`` table (top ops by self CPU time, with launches and syncs), and
the top Python functions by own time (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from rollbuf.bench.experiments._common import make_inputs
from rollbuf.bench.experiments.backward import GRAD, PARAMS, fields
from rollbuf.testing import run_estimator


def main(argv=None):
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench --experiment profile-backward")
    ap.add_argument("--estimator", default="gae")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--t", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    name, dev = args.estimator, args.device
    f = fields(name, make_inputs(args.n, args.t, torch.float32, True, seed=1, device=dev))
    keys = GRAD[name]

    def fwd_bwd():
        xs = [f[k].detach().requires_grad_() for k in keys]
        out = run_estimator(name, dict(f, **dict(zip(keys, xs))), backend="triton", **PARAMS[name])
        out = out if isinstance(out, tuple) else (out,)
        return torch.autograd.grad(out, xs, [torch.ones_like(o) for o in out], allow_unused=True)

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for _ in range(5):
        fwd_bwd()
    sync()
    n = 50
    t0 = time.perf_counter()
    for _ in range(n):
        fwd_bwd()
    host = (time.perf_counter() - t0) / n
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fwd_bwd()
        sync()
    synced = (time.perf_counter() - t0) / n
    bench = do_bench(fwd_bwd, warmup=10, rep=50, return_mode="median") * 1e3 if dev == "cuda" else float("nan")
    print(f"{name} {args.n}x{args.t}: host loop {host * 1e6:.0f} µs/call, with sync {synced * 1e6:.0f} µs, "
          f"do_bench {bench:.0f} µs")
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(10):
            fwd_bwd()
        sync()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        fwd_bwd()
    sync()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(20)

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
