"""The eager call of long rows on a CUDA GPU: where the time around the kernel goes.

    python3 benchmarks/long_call.py --out DIR      (the repository root on PYTHONPATH)

At 1 × 2^20, 64 × 32768 and 1 × 2^24 steps (fp32 GAE advantages, bool terminations at 2%, the [N]
window-end values), in one run: the eager ``functional.advantages`` call (wall per call, back to back,
synchronised before and after each batch of calls), its device time (a CUDA graph of 20 copies, CUDA
events, per copy), the call with its kernel launches replaced by nothing (rollbuf's own host code,
allocations included), and how many kernel passes one call launches. CSV ``DIR/long_call.csv``; a
table printed last.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

import torch

SHAPES = ((1, 1 << 20), (64, 32768), (1, 1 << 24))


def wall(fn, calls=200, repeats=7):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def device(fn, copies=20):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(copies):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / copies)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out"), help="the results folder")
    args = ap.parse_args()
    from rollbuf import functional as F
    from rollbuf.kernels import host

    rows = []
    real = host.Kernel.__call__
    for N, T in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        r = torch.randn(N, T, device="cuda", generator=g)
        v = torch.randn(N, T, device="cuda", generator=g)
        k = torch.rand(N, T, device="cuda", generator=g) < 0.02
        last = torch.randn(N, device="cuda", generator=g)

        def call(r=r, v=v, k=k, last=last):
            return F.advantages(0.99, 0.95, rewards=r, values=v, terminated=k, bootstrap_values=last)

        passes = []
        def counting(self, grid, arguments, dev, passes=passes):
            passes.append(grid)
            return real(self, grid, arguments, dev)

        host.Kernel.__call__ = counting
        try:
            call()
        finally:
            host.Kernel.__call__ = real
        eager, dev = wall(call), device(call)
        host.Kernel.__call__ = lambda self, grid, arguments, dev: None
        try:
            own = wall(call)
        finally:
            host.Kernel.__call__ = real
        rows.append(dict(n=N, t=T, eager_us=eager, device_us=dev, host_without_launch_us=own, passes=len(passes),
                         grids=" ".join(map(str, passes)), gpu=torch.cuda.get_device_name(),
                         torch=torch.__version__, triton=__import__("triton").__version__))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / "long_call.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"long rows, {rows[0]['gpu']}, torch {rows[0]['torch']}, triton {rows[0]['triton']}: µs per call")
    print(f"{'N x T':>14} {'eager':>9} {'device':>9} {'own host':>9} passes")
    for r_ in rows:
        print(f"{r_['n']:>5} x {r_['t']:<7} {r_['eager_us']:9.1f} {r_['device_us']:9.1f} "
              f"{r_['host_without_launch_us']:9.1f} {r_['passes']} ({r_['grids']})")


if __name__ == "__main__":
    main()
