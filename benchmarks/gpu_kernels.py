"""Check and time the fused kernels on a CUDA GPU; print a short table last, CSV under $OUT.

    ROLLBUF_COMMIT=$(git rev-parse --short HEAD) python benchmarks/gpu_kernels.py [--quick]

Per case: a correctness gate (relative L2 error against float64; the reference loop where it is
affordable, else the float64 torch backend, itself tested against the reference), then the full-call
time (``triton.testing.do_bench``, median) and the device time (CUDA-graph replay of many calls over
input sets rotated to exceed the 60 MB L2), bytes moved (inputs once, outputs once) and % of the
measured device-to-device copy bandwidth.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402

from rollbuf import functional as F  # noqa: E402

L2_BYTES = 60 * 2**20


def provenance():
    import triton

    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                commit=os.environ.get("ROLLBUF_COMMIT", "unknown"), date=time.strftime("%Y-%m-%d"))


def copy_bandwidth():
    n = 2**28  # 1 GiB of fp32
    a = torch.empty(n, device="cuda").uniform_()
    b = torch.empty_like(a)
    from triton.testing import do_bench

    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * a.numel() * 4 / (ms * 1e-3)


def make_inputs(N, T, dtype, trunc, seed, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    r = torch.randn(N, T, device=device, generator=g).to(dtype)
    v = torch.randn(N, T, device=device, generator=g).to(dtype)
    k = torch.rand(N, T, device=device, generator=g) < 0.01
    tr = (torch.rand(N, T, device=device, generator=g) < 0.01) if trunc else None
    bv = torch.randn(N, T, device=device, generator=g).to(dtype)
    lp = (torch.randn(N, T, device=device, generator=g) * 0.3).to(dtype)
    tlp = (lp.float() + torch.randn(N, T, device=device, generator=g) * 0.1).to(dtype)
    q = torch.randn(N, T, device=device, generator=g).to(dtype)
    x = r
    return dict(rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv, log_probs=lp,
                target_log_probs=tlp, q_values=q, x=x)


def estimator_call(name, f, backend="triton", out_dtype=None):
    base = dict(rewards=f["rewards"], values=f["values"], terminated=f["terminated"],
                truncated=f["truncated"], bootstrap_values=f["bootstrap_values"], backend=backend,
                out_dtype=out_dtype)
    if name == "gae":
        return lambda: F.gae(0.99, 0.95, **base)
    if name == "lambda_returns":
        return lambda: F.lambda_returns(0.99, 0.95, **base)
    if name == "discounted_returns":
        return lambda: F.discounted_returns(0.99, **base)
    if name == "vtrace":
        return lambda: F.vtrace(f["target_log_probs"], 0.99, log_probs=f["log_probs"], **base)
    if name == "retrace":
        return lambda: F.retrace(f["q_values"], f["target_log_probs"], 0.99, 0.95, log_probs=f["log_probs"], **base)
    flags = dict(terminated=f["terminated"], truncated=f["truncated"], backend=backend, out_dtype=out_dtype)
    if name == "eligibility_traces":
        return lambda: F.eligibility_traces(f["x"], 0.99, 0.95, **flags)
    if name == "episodic_sums":
        return lambda: F.episodic_sums(f["x"], **flags)
    raise KeyError(name)


def bytes_moved(name, f, outs):
    used = {
        "gae": ("rewards", "values", "terminated", "truncated"),
        "lambda_returns": ("rewards", "values", "terminated", "truncated"),
        "discounted_returns": ("rewards", "terminated", "truncated"),
        "vtrace": ("rewards", "values", "terminated", "truncated", "log_probs", "target_log_probs"),
        "retrace": ("rewards", "values", "terminated", "truncated", "log_probs", "target_log_probs", "q_values"),
        "eligibility_traces": ("x", "terminated", "truncated"),
        "episodic_sums": ("x", "terminated", "truncated"),
    }[name]
    b = sum(f[k].numel() * f[k].element_size() for k in used if f[k] is not None)
    N = f["rewards"].shape[0]
    b += N * f["bootstrap_values"].element_size()  # the window-end column
    return b + sum(o.numel() * o.element_size() for o in outs if o.dim() == 2)


def as_tuple(res):
    return tuple(res) if isinstance(res, tuple) else (res,)


def rel_err(a, b):
    a, b = a.double(), b.double().to(a.device)
    if torch.isnan(a).any():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(name, f):
    """Relative L2 error of the kernel against float64 (the reference loop when affordable)."""
    N, T = f["rewards"].shape
    got = as_tuple(estimator_call(name, f)())
    if N * T <= 2**17:
        cpu = {k: (None if v is None else v.cpu()) for k, v in f.items()}
        ref = as_tuple(estimator_call(name, cpu, backend="reference")())
        oracle = "reference"
    else:
        f64 = {k: (None if v is None else (v.double() if v.is_floating_point() else v)) for k, v in f.items()}
        ref = as_tuple(estimator_call(name, f64, backend="torch")())
        oracle = "torch-fp64"
    return max(rel_err(a, b) for a, b in zip(got, ref)), oracle


def device_time(fns, reps=20):
    """Seconds per call, from CUDA-graph replay of one call per rotated input set."""
    from rollbuf.bench.suite import graph_time

    return graph_time(fns, reps)[0]


def rotated_sets(N, T, dtype, trunc, per_set_bytes, first=0):
    """Enough input sets that cycling through them streams > 3x the L2 from HBM."""
    n = max(1, min(16, -(-3 * L2_BYTES // max(per_set_bytes, 1))))
    return [make_inputs(N, T, dtype, trunc, seed) for seed in range(first, n)]


SHORT = [(n, t) for t in (8, 16, 32, 64, 128) for n in (4096, 8192, 16384, 32768)]
MEDIUM = [(n, t) for n in (64, 128, 256, 512, 4096, 16384) for t in (128, 512, 1024, 2048, 4096)]
LONG = [(n, t) for n in (1, 8, 64, 256) for t in (16384, 131072, 1048576)]
SUBSET = [(32768, 8), (4096, 128), (1024, 1024), (16384, 4096), (256, 131072), (1, 1048576)]
ALL = ["gae", "lambda_returns", "discounted_returns", "vtrace", "retrace", "eligibility_traces", "episodic_sums"]


def cases(quick, sweep=False):
    """(estimator, N, T, dtype, truncations, variant) in the order they are run."""
    if quick:
        yield from (("gae", n, t, torch.float32, True, "default") for n, t in SUBSET)
        return
    for n, t in SHORT + MEDIUM + LONG:
        variants = (["gather-c1024", "reload-c1024"] if t <= 256 else list(VARIANTS)) if sweep else ["default"]
        for var in variants:
            yield "gae", n, t, torch.float32, True, var
    for n, t in SHORT + MEDIUM + LONG:
        yield "gae", n, t, torch.bfloat16, True, "default"
    for n, t in SUBSET:
        yield "gae", n, t, torch.float32, False, "default"
        for name in ALL[1:]:
            yield name, n, t, torch.float32, True, "default"


VARIANTS = {  # kernel strategy choices (rollbuf.kernels.forced) compared on the GAE fp32 grid
    "gather-c1024": dict(shift_load=False, max_chunk=1024),
    "reload-c1024": dict(shift_load=True, max_chunk=1024),
    "reload-c2048": dict(shift_load=True, max_chunk=2048),
    "gather-c2048": dict(shift_load=False, max_chunk=2048),
}
_CHOICES = []


def set_variant(variant):
    import rollbuf.kernels as K

    while _CHOICES:
        _CHOICES.pop().__exit__(None, None, None)
    cm = K.forced(**VARIANTS.get(variant, {}))
    cm.__enter__()
    _CHOICES.append(cm)


def time_case(name, N, T, dtype, trunc, bw, prov, check_it=True, variant="default"):
    from triton.testing import do_bench

    set_variant(variant)

    f0 = make_inputs(N, T, dtype, trunc, 100)
    err, oracle = check(name, f0) if check_it else (float("nan"), "skipped")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    outs = as_tuple(estimator_call(name, f0)())
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base  # peak extra memory of one call
    out_bytes = sum(o.numel() * o.element_size() for o in outs)
    nbytes = bytes_moved(name, f0, outs)
    del outs
    sets = [f0] + rotated_sets(N, T, dtype, trunc, nbytes, first=1)
    fns = [estimator_call(name, s) for s in sets]
    dev = device_time(fns)
    it = iter(range(10**9))
    call_ms = do_bench(lambda: fns[next(it) % len(fns)](), warmup=25, rep=100, return_mode="median")
    set_variant("default")
    return dict(estimator=name, N=N, T=T, dtype=str(dtype).replace("torch.", ""), trunc=trunc,
                impl="rollbuf-triton" if variant == "default" else f"rollbuf-triton[{variant}]", rel_err=err, oracle=oracle, device_us=dev * 1e6,
                call_us=call_ms * 1e3, bytes=nbytes, gbps=nbytes / dev / 1e9,
                pct_copy=100 * nbytes / dev / bw, peak_extra_bytes=extra, output_bytes=out_bytes, **prov)


def time_baselines(N, T, bw, prov):
    from triton.testing import do_bench

    rows = []
    f0 = make_inputs(N, T, torch.float32, False, 7)
    ref = as_tuple(estimator_call("gae", f0)())
    args_ = (f0["rewards"], f0["values"], f0["terminated"], f0["bootstrap_values"][:, -1], 0.99, 0.95)
    impls = [("eager-loop", baselines.gae_loop)] if T <= 256 else []
    impls.append(("compiled-doubling", torch.compile(baselines.gae_doubling, dynamic=False)))
    for impl, fn in impls:
        t0 = time.perf_counter()
        out = fn(*args_)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        err = max(rel_err(a, b) for a, b in zip(out, ref))
        nbytes = bytes_moved("gae", f0, out)
        sets = rotated_sets(N, T, torch.float32, False, nbytes)
        fns = [(lambda s=s: fn(s["rewards"], s["values"], s["terminated"], s["bootstrap_values"][:, -1], 0.99, 0.95)) for s in sets]
        dev = device_time(fns) if impl != "eager-loop" else float("nan")
        it = iter(range(10**9))
        call_ms = do_bench(lambda: fns[next(it) % len(fns)](), warmup=5, rep=100, return_mode="median")
        t_ = dev if dev == dev else call_ms * 1e-3
        rows.append(dict(estimator="gae", N=N, T=T, dtype="float32", trunc=False, impl=impl, rel_err=err,
                         oracle="rollbuf", device_us=dev * 1e6, call_us=call_ms * 1e3, bytes=nbytes,
                         gbps=nbytes / t_ / 1e9, pct_copy=100 * nbytes / t_ / bw, first_call_s=first_s, **prov))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--baselines", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="compare the strategy variants on the GAE grid")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new cases after this")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    t_start = time.time()
    prov = provenance()
    bw = copy_bandwidth()
    print(f"# {prov} copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_kernels.csv")
    keys = ["estimator", "N", "T", "dtype", "trunc", "impl", "rel_err", "oracle", "device_us", "call_us",
            "bytes", "gbps", "pct_copy", "peak_extra_bytes", "output_bytes", "first_call_s", "gpu", "torch", "triton", "commit", "date"]
    rows = []
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        todo = list(cases(args.quick, args.sweep))
        checked = set()
        for name, N, T, dtype, trunc, var in todo:
            if time.time() - t_start > args.budget_s:
                print("# budget reached: stopping", flush=True)
                break
            key = (name, N, T, dtype, trunc)
            row = time_case(name, N, T, dtype, trunc, bw, prov, variant=var,
                            check_it=N * T <= 2**26 and (key not in checked or var != "default"))
            checked.add(key)
            rows.append(row)
            w.writerow(row)
            fh.flush()
            print(_fmt(row), flush=True)
            torch.cuda.empty_cache()
        if args.baselines:
            for N, T in [(32768, 8), (4096, 128), (1024, 1024), (256, 131072)]:
                for row in time_baselines(N, T, bw, prov):
                    rows.append(row)
                    w.writerow(row)
                    fh.flush()
                    print(_fmt(row), flush=True)
    below = [r for r in rows if r["impl"] == "rollbuf-triton" and r["pct_copy"] < 85]
    print(f"\n# {len(rows)} rows; rollbuf cases below 85% of copy bandwidth: {len(below)}")
    print("| estimator | N×T | dtype | trunc | impl | rel err | device µs | call µs | % copy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["impl"] != "rollbuf-triton" or r["estimator"] != "gae" or r["dtype"] != "float32":
            continue
        print(f"| {r['estimator']} | {r['N']}×{r['T']} | {r['dtype']} | {r['trunc']} | {r['impl']} | "
              f"{r['rel_err']:.1e} | {r['device_us']:.1f} | {r['call_us']:.1f} | {r['pct_copy']:.0f} |")


def _fmt(r):
    return (f"{r['impl']:18s} tr={int(r['trunc'])} {r['estimator']:18s} {r['N']:>6}x{r['T']:<8} {r['dtype']:9s} err={r['rel_err']:.1e} "
            f"dev={r['device_us']:9.1f}us call={r['call_us']:9.1f}us {r['pct_copy']:5.1f}% copy")


if __name__ == "__main__":
    main()
