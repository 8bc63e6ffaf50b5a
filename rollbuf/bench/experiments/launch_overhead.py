"""Where the full call's time goes at small shapes, on a CUDA GPU (PERF.md P2: ≤ 8 µs at 4096 × 128).

    python -m rollbuf.bench --experiment launch-overhead [--out DIR] [--device cpu]

For GAE fp32 4096 × 128 (terminations + truncations) and V-trace at the same shape, each timed as
the median of ``triton.testing.do_bench`` (full call, host included) and, for the kernel, CUDA-graph
replay (device time):

1. ``rollbuf.gae(...)``: the whole call (validation, problem, strategy, argument marshalling, launch
   of the cached compiled kernel: ``rollbuf.kernels.LEAN_LAUNCH``), and the same call through
   Triton's JIT launch (``LEAN_LAUNCH = False``);
2. ``scan_kernel[grid](*args, **constexprs)`` with the arguments the call recorded: Triton's JIT
   path alone (binder, specialization of ~70 arguments, cache lookup, launcher);
3. the ``CompiledKernel`` that path returned, launched directly (``compiled[grid](*args)``: no
   binder, no specialization, no cache lookup) — what a cached launcher could reach;
4. a 4-argument Triton kernel (copy of one fp32 row block) through its JIT path: the floor of a
   Triton launch on this host;
5. ``torch.empty`` of the two outputs alone.

``--device cpu`` runs step 1 and the argument recording under the interpreter (a dry run of the
script's logic; nothing is timed that means anything there).
"""

from __future__ import annotations

import argparse
import csv
import os

import torch


def record_launch(call):
    """Run ``call()`` once with ``scan_kernel`` wrapped: returns a dict of grid, args, kwargs, the
    ``CompiledKernel`` the launch returned, and the call's result."""
    import rollbuf.kernels as K
    import rollbuf.kernels.scan as S

    real, lean = S.scan_kernel, K.LEAN_LAUNCH
    K.LEAN_LAUNCH = False  # through scan_kernel[grid], where the recorder sits
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.update(grid=grid, args=args, kwargs=kwargs)
                seen["compiled"] = real[grid](*args, **kwargs)
                return seen["compiled"]
            return launch

    S.scan_kernel = Recorder()
    try:
        seen["result"] = call()
    finally:
        S.scan_kernel, K.LEAN_LAUNCH = real, lean
    return seen


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench --experiment launch-overhead")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    if args.device == "cpu":  # tensors on the CPU through backend="triton": Triton's interpreter
        from rollbuf.bench.experiments._common import interpreted

        rc = interpreted("rollbuf.bench.experiments.launch_overhead", argv)
        if rc is not None:
            return rc
    dev = args.device
    import triton
    import triton.language as tl

    import rollbuf.kernels as K
    from rollbuf import functional as F
    from rollbuf.kernels.scan import scan_kernel

    N, T = (4096, 128) if dev == "cuda" else (5, 37)  # the dry run: tiny, interpreted
    g = torch.Generator(device=dev).manual_seed(0)
    r, v, bv = (torch.randn(N, T, device=dev, generator=g) for _ in range(3))
    lp, tlp = (torch.randn(N, T, device=dev, generator=g) * 0.3 for _ in range(2))
    k = torch.rand(N, T, device=dev, generator=g) < 0.01
    tr = torch.rand(N, T, device=dev, generator=g) < 0.01
    calls = {
        "gae": lambda: F.gae(0.99, 0.95, rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv,
                             backend="triton"),
        "vtrace": lambda: F.vtrace(tlp, 0.99, log_probs=lp, rewards=r, values=v, terminated=k, truncated=tr,
                                   bootstrap_values=bv, backend="triton"),
    }
    if dev != "cuda":
        for name, call in calls.items():
            seen = record_launch(call)
            print(f"{name}: grid {seen['grid']}, {len(seen['args'])} positional + {len(seen['kwargs'])} keyword "
                  f"arguments recorded")
        return 0

    from triton.testing import do_bench

    from rollbuf.bench.experiments._common import provenance

    @triton.jit
    def _copy(x, y, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + o, tl.load(x + o, mask=o < n), mask=o < n)

    def us(fn):
        return do_bench(fn, warmup=50, rep=300, return_mode="median") * 1e3

    def loop_us(fn, n=2000):
        """Wall time per call of back-to-back calls, one sync at the end: the host's rate (each
        call here launches less device work than its host time, so the queue never backs up)."""
        import time

        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        return best

    rows = []
    prov = provenance()
    x, y = torch.randn(N * T, device=dev), torch.empty(N * T, device=dev)
    floor = us(lambda: _copy[(N * T // 1024,)](x, y, N * T, BLOCK=1024))
    floor_loop = loop_us(lambda: _copy[(N * T // 1024,)](x, y, N * T, BLOCK=1024))
    empty = us(lambda: (torch.empty(N, T, device=dev), torch.empty(N, T, device=dev)))
    for name, call in calls.items():
        seen = record_launch(call)
        grid, a, kw, compiled = seen["grid"], seen["args"], seen["kwargs"], seen["compiled"]
        full = us(call)
        K.LEAN_LAUNCH = False
        full_jit, full_jit_loop = us(call), loop_us(call)
        K.LEAN_LAUNCH = True
        jit = us(lambda: scan_kernel[grid](*a, **kw))
        # the compiled kernel's runner takes every parameter in declaration order, constexprs included
        names = scan_kernel.arg_names
        ordered = list(a) + [kw[n] for n in names[len(a):] if n in kw]
        runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]
        # the direct launch must write what the JIT path wrote: poison the recorded outputs, relaunch
        want = [o.clone() for o in seen["result"]]
        for o in seen["result"]:
            o.fill_(float("nan"))
        runner(*ordered)
        torch.cuda.synchronize()
        same = all(torch.equal(o, w) for o, w in zip(seen["result"], want))
        direct = us(lambda: runner(*ordered))
        row = dict(direct_launch_matches=same, estimator=name, N=N, T=T, full_call_us=full,
                   full_call_jit_us=full_jit, full_call_jit_loop_us=full_jit_loop, triton_jit_us=jit,
                   compiled_direct_us=direct, small_triton_kernel_us=floor, two_empty_us=empty,
                   full_call_loop_us=loop_us(call), triton_jit_loop_us=loop_us(lambda: scan_kernel[grid](*a, **kw)),
                   compiled_direct_loop_us=loop_us(lambda: runner(*ordered)), small_triton_kernel_loop_us=floor_loop,
                   n_args=len(ordered), **prov)
        rows.append(row)
        print(row, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "launch_overhead.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{prov}\n")
    print("do_bench median (back-to-back host loop, µs per call)\n")
    print("| estimator | full call µs | full call, JIT launch µs | Triton JIT launch µs | compiled kernel direct µs "
          "| 4-arg Triton kernel µs "
          "| 2 × torch.empty µs | kernel args |")
    print("|---|---|---|---|---|---|---|---|")
    for r_ in rows:
        print(f"| {r_['estimator']} | {r_['full_call_us']:.1f} ({r_['full_call_loop_us']:.1f}) | "
              f"{r_['full_call_jit_us']:.1f} ({r_['full_call_jit_loop_us']:.1f}) | "
              f"{r_['triton_jit_us']:.1f} ({r_['triton_jit_loop_us']:.1f}) | "
              f"{r_['compiled_direct_us']:.1f} ({r_['compiled_direct_loop_us']:.1f}) | "
              f"{r_['small_triton_kernel_us']:.1f} ({r_['small_triton_kernel_loop_us']:.1f}) | "
              f"{r_['two_empty_us']:.1f} "
              f"| {r_['n_args']} |")
    bad = [r_["estimator"] for r_ in rows if not r_["direct_launch_matches"]]
    print("direct launch wrote the same outputs as the JIT path" if not bad else f"DIRECT LAUNCH DIFFERS: {bad}")

    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
