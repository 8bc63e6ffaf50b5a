"""The device clocks of the benchmarks: :func:`graph_time`, the replay of a CUDA graph, and
:func:`kernel_times`, each kernel's device time from the profiler.

A module of its own, importing nothing of ``benchmarks``, so that :mod:`benchmarks.competitors`
(the naive kernel's choice of tiling) and :mod:`benchmarks.suite` (the scoreboard's device time)
both use it without importing each other.
"""

from __future__ import annotations

import statistics

import torch

__all__ = ["graph_time", "kernel_times"]


def graph_time(fns, reps=10):
    """(device s per call, spread): one CUDA graph of one call per rotated input set, replayed
    ``reps`` times in each of 6 timed batches (median; spread = relative gap of the halves)."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compilation, allocations) outside the capture
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    g.replay()
    times = []
    for _ in range(6):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e-3 / (reps * len(fns)))
    dev = statistics.median(times)
    return dev, abs(statistics.median(times[:3]) - statistics.median(times[3:])) / dev


def kernel_times(fn, reps=10, warmup=1) -> dict:
    """Device µs per call of each kernel ``fn`` launches (by kernel name, in the order first seen):
    ``warmup`` calls, then ``reps`` under ``torch.profiler``, its CUDA events summed per name."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per: dict = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name] = per.get(e.name, 0.0) + e.device_time / reps
    return per
