"""Python time of one estimator call on the triton path, the kernel launch stubbed out (any machine).

    python -m rollbuf.bench --experiment call-overhead [--shape NxT] [--profile] [--backward] [--device cuda]

The full call at 4096 × 128 (PERF.md P2: ≤ 8 µs) is our Python (validation, the problem, the
strategy, argument marshalling) plus Triton's launcher plus the kernel. This measures the first part
alone: every kernel launch (``rollbuf.kernels.host.Kernel.__call__``) is replaced by a no-op, the inputs are CPU tensors, and the call
is timed over many repetitions (median of 7 batches). ``--profile`` prints the top functions.
``--shape`` (default ``4096x128``): on the CPU the two output allocations of a large shape cost
more than all of the Python (the allocator maps fresh pages); ``64x32`` measures the Python alone.

``--device cuda``: the same with CUDA inputs (our Python on the GPU machine's host; nothing is
launched but the two output allocations).

``--backward``: the same for one forward + backward call (``torch.autograd.grad`` of every output
with respect to every floating input) on small ``4 × 8`` inputs, where the time is all host work,
with the number of aten ops (each a kernel launch on a GPU) and of scan-kernel launches per call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rollbuf.bench.experiments._common import interpreted

H = F = None  # rollbuf.kernels.host and rollbuf.functional, imported under the interpreter by main()


def _stub(self, grid, args, device):
    """Stands in for a kernel launch (``rollbuf.kernels.host.Kernel.__call__``): does nothing."""


def case(name, N=4096, T=128, device="cpu"):
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(N, T, generator=g).to(device), torch.randn(N, T, generator=g).to(device)
    k = (torch.rand(N, T, generator=g) < 0.01).to(device)
    tr = (torch.rand(N, T, generator=g) < 0.01).to(device)
    bv = torch.randn(N, T, generator=g).to(device)
    m = (torch.rand(N, T, generator=g) < 0.9).to(device)
    lp, tlp = r * 0.1, v * 0.1
    calls = {
        "gae": lambda: F.gae(0.99, 0.95, rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv,
                             backend="triton"),
        "gae (no truncations, [N] bootstrap)": lambda: F.gae(0.99, 0.95, rewards=r, values=v, terminated=k,
                                                              bootstrap_values=bv[:, -1], backend="triton"),
        "advantages (no truncations, [N] bootstrap)": lambda: F.advantages(
            0.99, 0.95, rewards=r, values=v, terminated=k, bootstrap_values=bv[:, -1], backend="triton"),
        "gae (mask)": lambda: F.gae(0.99, 0.95, rewards=r, values=v, terminated=k, truncated=tr,
                                    bootstrap_values=bv, mask=m, backend="triton"),
        "vtrace": lambda: F.vtrace(tlp, 0.99, log_probs=lp, rewards=r, values=v, terminated=k,
                                   truncated=tr, bootstrap_values=bv, backend="triton"),
    }
    return calls[name]


def timeit(fn, n=2000):
    fn()
    batches = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        batches.append((time.perf_counter() - t0) / n)
    return statistics.median(batches)


_VIEWS = {"detach", "view", "t", "as_strided", "alias", "unsqueeze", "squeeze", "select", "slice", "expand",
          "transpose", "permute", "_unsafe_view", "reshape", "promote_types"}


def backward_cases(N=4, T=8):
    g = torch.Generator().manual_seed(0)
    r, v, bv, lp, tlp, q, x = (torch.randn(N, T, generator=g) for _ in range(7))
    k = torch.rand(N, T, generator=g) < 0.1
    tr = torch.rand(N, T, generator=g) < 0.1
    kw = dict(terminated=k, truncated=tr, backend="triton")
    return {
        "gae": (lambda a: F.gae(0.99, 0.95, rewards=a[0], values=a[1], bootstrap_values=a[2], **kw), [r, v, bv]),
        "vtrace": (lambda a: F.vtrace(a[4], 0.99, log_probs=a[3], rewards=a[0], values=a[1], bootstrap_values=a[2],
                                      **kw), [r, v, bv, lp, tlp]),
        "retrace": (lambda a: F.retrace(a[5], a[4], 0.99, 0.95, log_probs=a[3], rewards=a[0], values=a[1],
                                        bootstrap_values=a[2], **kw), [r, v, bv, lp, tlp, q]),
        "eligibility_traces": (lambda a: F.eligibility_traces(a[0], 0.99, 0.95, **kw), [x]),
    }


def backward_table():
    from torch.utils._python_dispatch import TorchDispatchMode

    launches = [0]

    def counting(self, grid, args, device):
        launches[0] += 1

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func.overloadpacket.__name__ not in _VIEWS
            return func(*args, **(kwargs or {}))

    H.Kernel.__call__ = counting
    print("| estimator | fwd+bwd host µs | aten ops forward | aten ops backward | scan launches fwd + bwd |")
    print("|---|---|---|---|---|")
    for name, (fn, ins) in backward_cases().items():
        def fwd_bwd(fn=fn, ins=ins):
            xs = [t.detach().requires_grad_() for t in ins]
            out = fn(xs)
            outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
            torch.autograd.grad(outs, xs, [torch.ones_like(o) for o in outs], allow_unused=True)
            return xs, outs

        xs = [t.detach().requires_grad_() for t in ins]
        launches[0] = 0
        with Ops() as of:
            out = fn(xs)
        outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
        with Ops() as ob:
            torch.autograd.grad(outs, xs, [torch.ones_like(o) for o in outs], allow_unused=True)
        n_launch = launches[0]
        print(f"| {name} | {timeit(fwd_bwd, 300) * 1e6:.0f} | {of.n} | {ob.n - len(outs)} | {n_launch} |")


def main(argv=None):
    # CPU tensors accepted by backend="triton" (the launch itself is stubbed): the interpreter
    rc = interpreted("rollbuf.bench.experiments.call_overhead", argv)
    if rc is not None:
        return rc
    global H, F
    import rollbuf.kernels.host as H
    from rollbuf import functional as F

    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench --experiment call-overhead")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--device", default="cpu", help="where the inputs live (cuda: our Python on the GPU host)")
    ap.add_argument("--shape", default="4096x128", help="N x T of the inputs (default 4096x128)")
    args = ap.parse_args(argv)
    if args.backward:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; launch stubbed, CPU tensors 4 x 8\n")
        backward_table()
        return 0
    H.Kernel.__call__ = _stub
    names = ["gae", "gae (no truncations, [N] bootstrap)", "advantages (no truncations, [N] bootstrap)",
             "gae (mask)", "vtrace"]
    N, T = (int(x) for x in args.shape.lower().split("x"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; launch stubbed, {args.device} tensors "
          f"{N} x {T}\n")
    print("| call | our Python per call |")
    print("|---|---|")
    for name in names:
        fn = case(name, N, T, device=args.device)
        print(f"| {name} | {timeit(fn, 200 if 'mask' in name else 2000) * 1e6:.1f} µs |")
    if args.profile:
        import cProfile
        import pstats

        fn = case("gae", N, T, device=args.device)
        cProfile.runctx("for _ in range(5000): fn()", globals(), {"fn": fn}, "/tmp/rollbuf_call.prof")
        pstats.Stats("/tmp/rollbuf_call.prof").sort_stats("tottime").print_stats(18)

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
