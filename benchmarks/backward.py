"""``python -m benchmarks backward``: gradient (fwd+bwd) time next to the forward, on a CUDA GPU;
table last, ``backward.csv`` under ``--out``.

    python -m benchmarks backward [--out DIR] [--quick] [--device cpu]

Per case (``benchmarks.cases.BACKWARD_SHAPES``; fp32, 1% terminations and 1% truncations, every
floating input requiring grad):

* **forward**: the fused kernel alone (no input requires grad);
* **fwd+bwd**: forward with the inputs requiring grad, then ``torch.autograd.grad`` of the outputs
  with random output gradients, on the ``triton`` backend and on the ``torch`` backend;
* a correctness gate first: the triton gradients against float64 torch-backend gradients (steps
  whose importance ratio lies within 1e-5 of the clip point excluded: there fp32 and fp64 may clip
  differently and the gradient of ``min(ratio, 1)`` jumps);
* **% of copy** of the backward: the bytes a fused backward must move at least (the differentiable
  inputs and flags read, the output gradients read, the input gradients written) over its time
  (fwd+bwd minus forward), over the measured copy bandwidth.

Times are ``triton.testing.do_bench`` medians of the whole call (host included). ``--device cpu``
is a dry run of the logic at tiny shapes under Triton's interpreter, not a measurement.
"""

from __future__ import annotations

import argparse
import csv
import os

import torch

from benchmarks.cases import BACKWARD_ESTIMATORS, BACKWARD_SHAPES, DRY_SHAPES
from benchmarks.cases import PARAMS as _PARAMS
from benchmarks.suite import copy_bandwidth, interpreted, provenance
from rollbuf.testing import run_estimator

PARAMS = {name: _PARAMS[name] for name in BACKWARD_ESTIMATORS}


def make_inputs(N, T, dtype, trunc, seed, device="cuda") -> dict:
    """Random ``[N, T]`` fields: rewards, values, 1% terminated, 1% truncated (or None), a finite
    bootstrap value at every step (so that gradients reach every slot), log-probabilities,
    Q-values; ``x`` = rewards."""
    g = torch.Generator(device=device).manual_seed(seed)
    r = torch.randn(N, T, device=device, generator=g).to(dtype)
    v = torch.randn(N, T, device=device, generator=g).to(dtype)
    k = torch.rand(N, T, device=device, generator=g) < 0.01
    tr = (torch.rand(N, T, device=device, generator=g) < 0.01) if trunc else None
    bv = torch.randn(N, T, device=device, generator=g).to(dtype)
    lp = (torch.randn(N, T, device=device, generator=g) * 0.3).to(dtype)
    tlp = (lp.float() + torch.randn(N, T, device=device, generator=g) * 0.1).to(dtype)
    q = torch.randn(N, T, device=device, generator=g).to(dtype)
    return dict(rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv, log_probs=lp,
                target_log_probs=tlp, q_values=q, x=r)


GRAD = {"gae": ("rewards", "values", "bootstrap_values"), "lambda_returns": ("rewards", "values", "bootstrap_values"),
        "vtrace": ("rewards", "values", "bootstrap_values", "log_probs", "target_log_probs"),
        "retrace": ("rewards", "values", "bootstrap_values", "log_probs", "target_log_probs", "q_values"),
        "eligibility_traces": ("x",)}


def fields(name, f):
    if name == "eligibility_traces":
        return dict(x=f["x"], terminated=f["terminated"], truncated=f["truncated"])
    return {k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values", "log_probs",
                              "target_log_probs", "q_values")}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks backward", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for backward.csv")
    ap.add_argument("--quick", action="store_true", help="the two smallest shapes only")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the logic (kernel interpreted)")
    args = ap.parse_args(argv)
    if args.device == "cpu":  # tensors on the CPU through backend="triton": Triton's interpreter
        rc = interpreted("backward", argv)
        if rc is not None:
            return rc
    dev = args.device
    if dev == "cuda":
        from triton.testing import do_bench
    else:  # the dry run: one interpreted call each, not a measurement
        def do_bench(fn, warmup=0, rep=0, return_mode="median"):
            import time

            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    prov = provenance("cuda") if dev == "cuda" else dict(device="cpu")
    bw = copy_bandwidth() if dev == "cuda" else float("nan")
    rows = []
    shapes = BACKWARD_SHAPES[:2] if args.quick else BACKWARD_SHAPES
    if dev != "cuda":
        shapes = DRY_SHAPES
    for name, params in PARAMS.items():
        for N, T in shapes:
            f = fields(name, make_inputs(N, T, torch.float32, True, seed=1, device=dev))
            keys = GRAD[name]
            gen = torch.Generator(device=dev).manual_seed(2)

            def fwd(backend="triton", grad=False, dt=torch.float32, f=f, keys=keys, name=name, params=params):
                xs = [f[k].to(dt).requires_grad_(grad) for k in keys] if dt != torch.float32 else \
                    [f[k].detach().requires_grad_(grad) for k in keys]
                out = run_estimator(name, dict(f, **dict(zip(keys, xs))), backend=backend, **params)
                return xs, (out if isinstance(out, tuple) else (out,))

            _, outs = fwd()
            gouts = [torch.randn(o.shape, generator=gen, device=dev) for o in outs]

            def fwd_bwd(backend="triton", dt=torch.float32, gouts=gouts):
                xs, out = fwd(backend, True, dt)
                return torch.autograd.grad(out, xs, [g.to(o.dtype) for g, o in zip(gouts, out)], allow_unused=True)

            # gate: fp32 triton gradients against float64 torch-backend gradients, away from the
            # clip points of the importance ratios (there the fp32 and fp64 ratios can fall on
            # either side of the clip, and the gradient of min(ratio, 1) jumps)
            want = fwd_bwd("torch", torch.float64)
            got = fwd_bwd("triton")
            keep = torch.ones_like(f[keys[0]], dtype=torch.bool)
            if "log_probs" in f and name in ("vtrace", "retrace"):
                ratio = (f["target_log_probs"].double() - f["log_probs"].double()).exp()
                keep = (ratio - 1.0).abs() > 1e-5
            err = max((((b.double() - a) * keep).norm() / (a * keep).norm().clamp_min(1e-30)).item()
                      for a, b in zip(want, got) if a is not None and b is not None)
            del want, got
            ok = err < 1e-4
            row = dict(estimator=name, N=N, T=T, grad_rel_err=err, status="ok" if ok else "wrong", **prov)
            if ok:
                t_f = do_bench(fwd, warmup=10, rep=50, return_mode="median") * 1e-3
                t_fb = do_bench(fwd_bwd, warmup=10, rep=50, return_mode="median") * 1e-3
                t_fb_torch = do_bench(lambda: fwd_bwd("torch"), warmup=5, rep=50, return_mode="median") * 1e-3
                elems = N * T
                # fused-backward floor: differentiable inputs + flags read, output grads read, input grads written
                b_bwd = elems * (4 * len(keys) + 2 + 4 * len(outs) + 4 * len(keys))
                t_b = max(t_fb - t_f, 1e-9)
                row.update(forward_us=t_f * 1e6, fwd_bwd_us=t_fb * 1e6, backward_us=t_b * 1e6,
                           torch_fwd_bwd_us=t_fb_torch * 1e6, bwd_over_fwd=t_b / t_f,
                           backward_pct_copy=100 * b_bwd / t_b / bw)
            rows.append(row)
            print(row, flush=True)
            del f, outs, gouts
            if dev == "cuda":
                torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "backward.csv")
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=sorted({k for r in rows for k in r}, key=lambda k: list(rows[-1]).index(k)
                                                  if k in rows[-1] else 99))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{prov}; copy bandwidth {bw / 1e9:.0f} GB/s\n")
    print("| estimator | N × T | forward µs | fwd+bwd µs | backward µs | bwd/fwd | backward % of copy "
          "| torch backend fwd+bwd µs | grad rel. err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["status"] != "ok":
            print(f"| {r['estimator']} | {r['N']} × {r['T']} | wrong | | | | | | {r['grad_rel_err']:.1e} |")
            continue
        print(f"| {r['estimator']} | {r['N']} × {r['T']} | {r['forward_us']:.1f} | {r['fwd_bwd_us']:.1f} "
              f"| {r['backward_us']:.1f} | {r['bwd_over_fwd']:.1f} | {r['backward_pct_copy']:.0f} "
              f"| {r['torch_fwd_bwd_us']:.1f} | {r['grad_rel_err']:.1e} |")

    return 0
