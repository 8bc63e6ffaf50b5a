"""Where the full call's time goes at small shapes, on a CUDA GPU (≤ 8 µs at 4096 × 128 is the aim).

    python -m rollbuf.bench --experiment launch-overhead [--out DIR] [--device cpu]

For GAE fp32 4096 × 128 (terminations + truncations) and V-trace at the same shape, each timed as
the median of ``triton.testing.do_bench`` and as the back-to-back host rate (in parentheses):

1. ``rollbuf.gae(...)``: the whole call (validation, the problem, the cached launch);
2. ``rollbuf.kernels.run(p)`` on a prepared problem: the launch's signature lookup and the launch;
3. the launch's keyword launch on arguments prepared once (``Launch.launch``: Triton's JIT call,
   no allocation, no signature);
4. a 4-argument Triton kernel (copy of one fp32 row block) through its JIT path;
5. ``torch.empty`` of the two outputs alone.

``--device cpu`` runs step 1 to 3 once under the interpreter and prints the kernel's parameter
count (a dry run of the script's logic; nothing is timed that means anything there).
"""

from __future__ import annotations

import argparse
import csv
import inspect
import os

import torch



def problems(dev, N, T):
    from rollbuf.problem import Problem

    g = torch.Generator(device=dev).manual_seed(0)
    r, v, bv = (torch.randn(N, T, device=dev, generator=g) for _ in range(3))
    lp, tlp = (torch.randn(N, T, device=dev, generator=g) * 0.3 for _ in range(2))
    k = torch.rand(N, T, device=dev, generator=g) < 0.01
    tr = torch.rand(N, T, device=dev, generator=g) < 0.01
    base = dict(rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv, mask=None)
    from rollbuf import functional as F

    return {
        "gae": (lambda: F.gae(0.99, 0.95, **base, backend="triton"),
                Problem(family="lambda", outputs=("advantages", "returns"), fields=base, gamma=0.99, lam=0.95)),
        "vtrace": (lambda: F.vtrace(tlp, 0.99, log_probs=lp, **base, backend="triton"),
                   Problem(family="vtrace", outputs=("vs", "pg_advantages"),
                           fields=dict(base, log_probs=lp, target_log_probs=tlp), gamma=0.99)),
    }


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

    N, T = (4096, 128) if dev == "cuda" else (5, 37)  # the dry run: tiny, interpreted
    calls = problems(dev, N, T)
    if dev != "cuda":
        for name, (call, p) in calls.items():
            call()
            K.run(p)
            la = K.launch_for(p)
            args_, _, _, ws = la.prepare(*la.inputs(p))
            la.launch(args_, ws)
            n = len(inspect.signature(la.passes[0].jit.fn).parameters)
            print(f"{name}: grid {la.grid}, {n} kernel parameters, strategy {la.strategy}")
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
        """Wall time per call of back-to-back calls, one sync at the end: the host's rate."""
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
    floor = lambda: _copy[(N * T // 1024,)](x, y, N * T, BLOCK=1024)  # noqa: E731
    empty = lambda: (torch.empty(N, T, device=dev), torch.empty(N, T, device=dev))  # noqa: E731
    for name, (call, p) in calls.items():
        K.run(p)  # compiles
        la = K.launch_for(p)
        args_, outs, co, ws = la.prepare(*la.inputs(p))
        kern = la.passes[0]

        def prepared(la=la, args_=args_, ws=ws):
            la.launch(args_, ws)

        prepared()
        compiled = kern.binary  # what Triton's launch returned: registers and spills
        fns = {"full_call": call, "kernels_run": lambda p=p: K.run(p), "keyword_launch": prepared,
               "small_triton_kernel": floor, "two_empty": empty}
        row = dict(estimator=name, N=N, T=T, n_params=len(inspect.signature(kern.jit.fn).parameters),
                   regs=compiled.n_regs, spills=compiled.n_spills)
        for k_, fn in fns.items():
            row[f"{k_}_us"] = us(fn)
            row[f"{k_}_loop_us"] = loop_us(fn)
        row.update(prov)
        rows.append(row)
        print(row, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "launch_overhead.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{prov}\n")
    print("do_bench median (back-to-back host loop), µs per call\n")
    keys = ["full_call", "kernels_run", "keyword_launch", "small_triton_kernel", "two_empty"]
    print("| estimator | " + " | ".join(keys) + " | kernel parameters |")
    print("|---" * (len(keys) + 2) + "|")
    for r_ in rows:
        print(f"| {r_['estimator']} | " + " | ".join(f"{r_[k + '_us']:.1f} ({r_[k + '_loop_us']:.1f})" for k in keys)
              + f" | {r_['n_params']} |")


if __name__ == "__main__":
    main()
