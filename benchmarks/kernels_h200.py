"""The family kernels on a CUDA GPU: every check first, then every timing; CSV and a short table.

    python benchmarks/kernels_h200.py --out DIR [--part gate,time,sweep,vtrace] [--impl new|old]

``gate``: every estimator (and the affine scan and the TD(λ) adjoint) against the float64 reference
(the reference loop where affordable, else a float64 loop over time written here, apart from
``rollbuf/boundary``), at short, long and split rows, every strategy forced in turn (rows walked,
split and chained by the look-back with many chunks, split in three passes); the naive kernel and
rl-triton too. ``time``: GAE on the issue's shapes: device time (CUDA-graph replay of one call per
input set, sets rotated past the L2) and the full call (``triton.testing.do_bench`` of the eager
call), for rollbuf writing both outputs and advantages only (``functional`` call, and
``kernels.run`` of a prepared problem), the naive kernel writing the same outputs (best of a small sweep of its rows per
program and warps), rl-triton's ``compute_gae`` (advantages). ``sweep``: rollbuf's strategy forced
to a few alternatives at the same shapes (device time). ``vtrace``: V-trace against rl-triton.
``vsweep``: V-trace's and GAE's rows per program x warps at short rows. ``--impl old``: only
rollbuf's public calls (run with an older tree on ``PYTHONPATH``).

All inputs as in the issue's table: fp32 rewards and values, bool terminated at 2%, the ``[N]``
window-end values (rl-triton takes its flags as float32 and the window end as ``last_value``).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time

import torch

L2 = 60 * 2**20
GAE_SHAPES = [(4096, 128), (16384, 128), (2048, 512), (512, 1024), (512, 4096), (2048, 2048), (8192, 4096),
              (32768, 8), (256, 131072), (1, 1 << 20)]
VTRACE_SHAPES = [(4096, 128), (16384, 128), (2048, 2048), (8192, 4096), (256, 131072), (32768, 16)]
SWEEP_SHAPES = [(4096, 128), (16384, 128), (2048, 512), (512, 1024), (2048, 2048), (32768, 8)]
ROWS: list[dict] = []


def log(*a):
    print(*a, flush=True)


def provenance(impl):
    import triton

    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                commit=os.environ.get("ROLLBUF_COMMIT", "unknown"), impl=impl, date=time.strftime("%Y-%m-%d"))


def copy_bandwidth():
    from triton.testing import do_bench

    a = torch.empty(2**28, device="cuda").uniform_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * a.numel() * 4 / (ms * 1e-3)


def inputs(N, T, seed, trunc=False, mask=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    f = dict(rewards=torch.randn(N, T, device="cuda", generator=g),
             values=torch.randn(N, T, device="cuda", generator=g),
             terminated=torch.rand(N, T, device="cuda", generator=g) < 0.02,
             last=torch.randn(N, device="cuda", generator=g),
             log_probs=torch.randn(N, T, device="cuda", generator=g) * 0.3)
    f["target_log_probs"] = f["log_probs"] + torch.randn(N, T, device="cuda", generator=g) * 0.1
    f["q_values"] = torch.randn(N, T, device="cuda", generator=g)
    if trunc:
        f["truncated"] = (torch.rand(N, T, device="cuda", generator=g) < 0.02) & ~f["terminated"]
        f["bootstrap_values"] = torch.randn(N, T, device="cuda", generator=g)
    if mask:
        f["mask"] = torch.rand(N, T, device="cuda", generator=g) < 0.8
    return f


def sets(N, T, per_call_bytes, seed=0):
    n = max(1, min(12, -(-3 * L2 // max(per_call_bytes, 1))))
    return [inputs(N, T, seed + i) for i in range(n)]


def graph_time(fns, reps=20):
    """Device seconds per call: one CUDA graph of one call per input set, replayed (median of 5)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    g.replay()
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e-3 / (reps * len(fns)))
    return statistics.median(times)


def call_time(fn):
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def record(**row):
    ROWS.append(row)
    us = row.get("us")
    log(f"{row['part']:6s} {row['estimator']:10s} {row['n']:>6}x{row['t']:<8} {row['competitor']:34s} "
        f"{row['clock']:6s} {'' if us is None else f'{us:9.2f} µs'} {row.get('pct_copy', '')} {row.get('note', '')}")


# ---- rollbuf -----------------------------------------------------------------------------------


def rb_gae(f, outputs=("advantages", "returns")):
    from rollbuf import functional as F

    if outputs == ("advantages", "returns"):
        return lambda: F.gae(0.99, 0.95, rewards=f["rewards"], values=f["values"], terminated=f["terminated"],
                             bootstrap_values=f["last"], backend="triton")
    return rb_run_call(f, outputs)


def rb_problem(f, outputs):
    from rollbuf.problem import Problem

    fields = dict(rewards=f["rewards"], values=f["values"], terminated=f["terminated"], truncated=None,
                  bootstrap_values=f["last"], mask=None)
    return Problem(family="lambda", outputs=outputs, fields=fields, gamma=0.99, lam=0.95)


def rb_run_call(f, outputs):
    """``kernels.run(p)`` of a prepared problem (the launch cache's lookup and the launch)."""
    import rollbuf.kernels as K

    p = rb_problem(f, outputs)
    return lambda: K.run(p)


def rb_rollout(f):
    """A ``Rollout`` of the inputs (the window-end values in its per-step ``bootstrap_values`` at the
    last step, as ``Rollout.bootstrap`` writes them), for its methods."""
    from rollbuf import Rollout

    bv = torch.full_like(f["values"], float("nan"))
    bv[:, -1] = f["last"]
    return Rollout(rewards=f["rewards"], values=f["values"], terminated=f["terminated"], bootstrap_values=bv,
                   batch_size=list(f["rewards"].shape))


def rb_vtrace(f):
    from rollbuf import functional as F

    return lambda: F.vtrace(f["target_log_probs"], 0.99, log_probs=f["log_probs"], rewards=f["rewards"],
                            values=f["values"], terminated=f["terminated"], bootstrap_values=f["last"],
                            backend="triton")


# ---- the naive kernel: one program per row (or a few short rows), the whole row in one block --------


def naive_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _combine(a1, b1, a2, b2):
        return a2 + b2 * a1, b1 * b2

    @triton.jit
    def naive_gae(p_r, p_v, p_d, p_last, p_adv, p_ret, N, T, gamma, lam,
                  BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, WRITE_RET: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]
        t = tl.arange(0, BLOCK_T)[None, :]
        ok = (rows < N) & (t < T)
        off = rows.to(tl.int64) * T + t
        r = tl.load(p_r + off, mask=ok, other=0.0)
        v = tl.load(p_v + off, mask=ok, other=0.0)
        nd = 1.0 - tl.load(p_d + off, mask=ok, other=0).to(tl.float32)
        v_next = tl.load(p_v + off + 1, mask=ok & (t + 1 < T), other=0.0)
        last = tl.load(p_last + rows, mask=rows < N, other=0.0)
        v_next = tl.where(t == T - 1, last, v_next)
        delta = tl.where(ok, r + gamma * nd * v_next - v, 0.0)
        coef = tl.where(ok, gamma * lam * nd, 1.0)
        adv, _ = tl.associative_scan((delta, coef), 1, _combine, reverse=True)
        tl.store(p_adv + off, adv, mask=ok)
        if WRITE_RET:
            tl.store(p_ret + off, adv + v, mask=ok)

    def call(f, block_n, warps, write_ret):
        N, T = f["rewards"].shape
        bt = triton.next_power_of_2(T)

        def fn():
            adv = torch.empty_like(f["rewards"])
            ret = torch.empty_like(f["rewards"]) if write_ret else adv
            naive_gae[(triton.cdiv(N, block_n),)](f["rewards"], f["values"], f["terminated"], f["last"], adv, ret,
                                                  N, T, 0.99, 0.95, BLOCK_N=block_n, BLOCK_T=bt,
                                                  WRITE_RET=write_ret, num_warps=warps)
            return (adv, ret) if write_ret else (adv,)
        return fn

    return call


def naive_configs(T):
    bt = 1 << (T - 1).bit_length()
    base = max(1, 2048 // bt)
    out = []
    for bn in sorted({max(1, base // 2), base, min(64, base * 2)}):
        w = max(1, min(16, bn * bt // 256))
        out.append((bn, w))
        if bn * bt >= 4096:
            out.append((bn, min(16, w * 2)))
    return out


# ---- rl-triton --------------------------------------------------------------------------------


def rlt():
    try:
        import rl_triton
    except ImportError:
        return None
    return rl_triton


def rlt_gae(f, mod):
    k = f["terminated"].float()
    return lambda: mod.compute_gae(f["rewards"], f["values"], k, None, 0.99, 0.95, last_value=f["last"])


def rlt_vtrace(f, mod):
    k = f["terminated"].float()
    return lambda: mod.compute_vtrace(f["target_log_probs"], f["log_probs"], f["values"], f["rewards"], k, None,
                                      0.99, 1.0, 1.0, last_value=f["last"])


# ---- the gate ---------------------------------------------------------------------------------


def loop_oracle(f, gamma=0.97, lam=0.9):
    """GAE as a float64 loop over time (numpy, vectorised over rows), written here from the recursion
    (SPEC), not from rollbuf/boundary: terminations, truncations reading ``bootstrap_values[t]``,
    masked steps deleted, the window end at the last unmasked step reading its bootstrap value."""
    import numpy as np

    r, v = f["rewards"].double().cpu().numpy(), f["values"].double().cpu().numpy()
    N, T = r.shape
    k = f["terminated"].cpu().numpy().astype(np.float64)
    tr = f["truncated"].cpu().numpy().astype(np.float64)
    m = f["mask"].cpu().numpy().astype(bool)
    bv = f["bootstrap_values"].double().cpu().numpy()
    last = np.where(m, np.arange(T), -1).max(1)
    end_v = np.where(last >= 0, bv[np.arange(N), np.maximum(last, 0)], 0.0)
    A, G = np.zeros((N, T)), np.zeros((N, T))
    adv_next, v_next = np.zeros(N), end_v.copy()
    with np.errstate(invalid="ignore"):
        for t in range(T - 1, -1, -1):
            live = m[:, t]
            at_end = last == t
            boot = np.where(tr[:, t] > 0, bv[:, t], np.where(at_end, end_v, v_next))
            delta = r[:, t] + gamma * np.where(k[:, t] > 0, 0.0, boot) - v[:, t]  # terminated: nothing read
            cont = (1 - k[:, t]) * (1 - tr[:, t]) * (~at_end)
            a = delta + gamma * lam * cont * adv_next
            A[:, t] = np.where(live, a, 0.0)
            G[:, t] = np.where(live, a + v[:, t], 0.0)
            adv_next = np.where(live, a, adv_next)
            v_next = np.where(live, v[:, t], v_next)
    return torch.from_numpy(A), torch.from_numpy(G)


def rel(a, b):
    a, b = a.double(), b.double().to(a.device)
    if torch.isnan(a).any():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def gate(impl):
    """Every estimator, the affine scan and the TD(λ) adjoint against float64 (see the module doc)."""
    import zlib

    import rollbuf.kernels as K
    from rollbuf import functional as F

    ok = True
    forcings = [("shipped", {})]
    if impl == "new":  # split rows, many chunks: 1025 per row of 65537 steps
        forcings += [("lookback-64", dict(split=True, presolve=False, block_t=64)),
                     ("three-pass-64", dict(split=True, presolve=True, block_t=64, resolve_block_r=16))]
    names = ["gae", "lambda_returns", "discounted_returns", "monte_carlo", "vtrace", "retrace",
             "eligibility_traces", "episodic_sums"]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from test_kernels import call, make  # the test suite's rollouts (NaN where unread) and calls

    def check(label, est, n, t, err, oracle, tol=2e-5):
        nonlocal ok
        good = err < tol
        ok &= good
        record(part="gate", estimator=est, n=n, t=t, competitor=f"rollbuf-{label}", clock="err", us=None,
               note=f"{err:.2e} vs {oracle} {'ok' if good else 'WRONG'}")

    for shape in [(3, 1), (7, 1000), (4096, 37), (8, 65537), (1, 300001)]:
        for label, force in forcings:
            if label != "shipped" and shape != (8, 65537):
                continue
            for name in names:
                f = make(*shape, "term+trunc+mask", seed=zlib.crc32(f"{name}{shape}".encode()), device="cuda")
                with K.forced(**force) if impl == "new" else _null():
                    got = call(name, f, "triton")
                if shape[0] * shape[1] <= 2**17:
                    cpu = {k: (None if x is None else x.cpu()) for k, x in f.items()}
                    ref, oracle = call(name, cpu, "reference"), "reference"
                else:
                    f64 = {k: (None if x is None else (x.double() if x.is_floating_point() else x))
                           for k, x in f.items()}
                    ref, oracle = call(name, f64, "torch"), "torch-fp64"
                    if name == "gae":  # and a loop written apart from rollbuf/boundary
                        check(label, name, *shape, max(rel(a, b) for a, b in zip(got, loop_oracle(f))), "loop")
                check(label, name, *shape, max(rel(a, b) for a, b in zip(got, ref)), oracle)
    if impl == "new":  # the affine scan and the TD(λ) adjoint (the fused backward), split too
        for label, force in forcings:
            for T in (1, 4097, 65537):
                g = torch.Generator().manual_seed(T)
                a = torch.randn(3, T, generator=g, dtype=torch.float64)
                b = 0.4 + 0.6 * torch.rand(3, T, generator=g, dtype=torch.float64)
                init = torch.randn(3, generator=g, dtype=torch.float64)
                for rev in (True, False):
                    with K.forced(**force):
                        y = F.affine_scan(a.cuda(), b.cuda(), rev, init.cuda(), backend="triton")
                    check(label, "affine" + ("-rev" if rev else ""), 3, T,
                          rel(y, F.affine_scan(a, b, rev, init, backend="torch")), "torch-fp64", 1e-12)
            f = make(4, 65537, "term+trunc+mask", seed=3, device="cuda")
            grads = {}
            for backend in ("triton", "torch"):
                xs = [f[k].nan_to_num().detach().requires_grad_() for k in ("rewards", "values")]
                with K.forced(**force):
                    adv, ret = F.gae(0.97, 0.9, rewards=xs[0], values=xs[1], terminated=f["terminated"],
                                     truncated=f["truncated"], bootstrap_values=f["bootstrap_values"].nan_to_num(),
                                     mask=f["mask"], backend=backend)
                    grads[backend] = torch.autograd.grad((adv * 1.3 + ret * 0.7).sum(), xs)
            check(label, "lambda_adjoint", 4, 65537,
                  max(rel(a, b) for a, b in zip(grads["triton"], grads["torch"])), "torch backward")
    # the naive kernel and rl-triton against rollbuf's reference on the timing inputs
    f = inputs(64, 1000, 1)
    ref = F.gae(0.99, 0.95, rewards=f["rewards"].cpu(), values=f["values"].cpu(), terminated=f["terminated"].cpu(),
                bootstrap_values=f["last"].cpu(), backend="reference")
    if impl == "new":
        naive = naive_kernel()
        for bn, w in naive_configs(1000):
            err = max(rel(a, b) for a, b in zip(naive(f, bn, w, True)(), ref))
            record(part="gate", estimator="gae", n=64, t=1000, competitor=f"naive-{bn}x{w}", clock="err", us=None,
                   note=f"{err:.2e} vs reference {'ok' if err < 2e-5 else 'WRONG'}")
        for outputs in (("advantages",), ("advantages", "returns")):
            got = rb_run_call(f, outputs)()[0]
            check("kernels.run", "gae-" + "+".join(outputs), 64, 1000, max(rel(a, b) for a, b in zip(got, ref)), "reference")
        mod = rlt()
        if mod is not None:
            err = rel(rlt_gae(f, mod)(), ref[0])
            record(part="gate", estimator="gae", n=64, t=1000, competitor="rl-triton", clock="err", us=None,
                   note=f"{err:.2e} vs reference {'ok' if err < 2e-5 else 'WRONG'}")
    return ok


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ---- timing -----------------------------------------------------------------------------------


def time_gae(impl, bw, quick=False):
    """``quick``: rollbuf alone (both outputs: functional call and ``kernels.run``; advantages only:
    ``kernels.run``)."""
    naive = naive_kernel() if impl == "new" and not quick else None
    mod = rlt() if impl == "new" and not quick else None
    for N, T in GAE_SHAPES:
        per = N * T * 17
        ss = sets(N, T, per)
        base = dict(part="time", estimator="gae", n=N, t=T)

        def rec(comp, fns, call_fn, nbytes):
            dev = graph_time(fns)
            record(**base, competitor=comp, clock="device", us=dev * 1e6,
                   pct_copy=f"{100 * nbytes / dev / bw:.0f}%")
            if call_fn is not None:
                record(**base, competitor=comp, clock="call", us=call_time(call_fn) * 1e6)

        both, adv_only = N * T * 17 + N * 4, N * T * 13 + N * 4
        rec("rollbuf gae (adv+ret)", [rb_gae(f) for f in ss], rb_gae(ss[0]), both)
        if impl == "new":
            rec("rollbuf run (adv+ret)", [rb_run_call(f, ("advantages", "returns")) for f in ss],
                rb_run_call(ss[0], ("advantages", "returns")), both)
            rec("rollbuf run (adv)", [rb_run_call(f, ("advantages",)) for f in ss],
                rb_run_call(ss[0], ("advantages",)), adv_only)
            ros = [rb_rollout(f) for f in ss]
            rec("Rollout.gae (adv+ret)", [lambda ro=ro: ro.gae(0.99, 0.95) for ro in ros],
                lambda: ros[0].gae(0.99, 0.95), both)
            rec("Rollout.advantages (adv)", [lambda ro=ro: ro.advantages(0.99, 0.95) for ro in ros],
                lambda: ros[0].advantages(0.99, 0.95), adv_only)
            del ros
            if T <= 16384 and naive is not None:
                for write_ret, nbytes in ((True, both), (False, adv_only)):
                    best = None
                    for bn, w in naive_configs(T):
                        dev = graph_time([naive(f, bn, w, write_ret) for f in ss])
                        if best is None or dev < best[0]:
                            best = (dev, bn, w)
                    dev, bn, w = best
                    label = f"naive ({'adv+ret' if write_ret else 'adv'})"
                    record(**base, competitor=label, clock="device", us=dev * 1e6,
                           pct_copy=f"{100 * nbytes / dev / bw:.0f}%", note=f"{bn} rows x {w} warps")
                    record(**base, competitor=label, clock="call", us=call_time(naive(ss[0], bn, w, write_ret)) * 1e6)
            if mod is not None:
                rec("rl-triton compute_gae (adv)", [rlt_gae(f, mod) for f in ss], rlt_gae(ss[0], mod),
                    N * T * 16 + N * 4)
        del ss
        torch.cuda.empty_cache()


SWEEP = {  # shape -> (rows per program, warps) tried jointly
    (4096, 128): ((1, 2, 4, 8), (1, 2, 4, 8)),
    (16384, 128): ((1, 2, 4, 8), (1, 2, 4, 8)),
    (2048, 512): ((1, 2, 4), (2, 4, 8)),
    (512, 1024): ((1, 2), (4, 8, 16)),
    (32768, 8): ((16, 32, 64, 128, 256), (1, 2, 4, 8)),
    (32768, 32): ((8, 16, 32, 64), (1, 2, 4, 8)),
    (2048, 2048): ((1,), (4, 8, 16)),
}


def _regs(p):
    import rollbuf.kernels as K

    la = K.launch_for(p)
    c = la.passes[0].binary  # what Triton's launch returned
    return "" if c is None else f"{c.n_regs} regs {c.n_spills} spills"


def sweep():
    """Rows per program x warps for GAE (both outputs), and V-trace's chunk length and warps."""
    import rollbuf.kernels as K

    sms = K.device_sms(torch.device("cuda"))
    for (N, T), (bns, ws) in SWEEP.items():
        ss = sets(N, T, N * T * 17)
        st = K.strategy(N, T, sms=sms)
        for bn in bns:
            for w in ws:
                with K.forced(block_n=bn, num_warps=w):
                    dev = graph_time([rb_gae(f) for f in ss])
                    regs = _regs(rb_problem(ss[0], ("advantages", "returns")))
                shipped = "shipped " if (bn, w) == (st.block_n, st.num_warps) else ""
                record(part="sweep", estimator="gae", n=N, t=T, competitor=f"rollbuf {bn}x{st.block_t} w{w}",
                       clock="device", us=dev * 1e6, note=f"{shipped}{regs}")
        del ss
        torch.cuda.empty_cache()
    for N, T in ((2048, 2048), (8192, 4096), (4096, 128)):
        ss = sets(N, T, N * T * 25)
        for mc in (1024, 2048):
            for w in (4, 8, 16):
                if T <= 128 and (mc, w) != (1024, 4):
                    continue
                with K.forced(max_chunk=mc, num_warps=w if T > 128 else None):
                    dev = graph_time([rb_vtrace(f) for f in ss])
                record(part="sweep", estimator="vtrace", n=N, t=T, competitor=f"rollbuf chunk {mc} w{w}",
                       clock="device", us=dev * 1e6)
        del ss
        torch.cuda.empty_cache()


def vsweep():
    """V-trace's rows per program x warps at short rows (device time), GAE's at the same shapes."""
    import rollbuf.kernels as K

    for N, T in ((4096, 128), (16384, 128), (32768, 16), (2048, 512)):
        ss = sets(N, T, N * T * 25)
        for est, fn in (("vtrace", rb_vtrace), ("gae", rb_gae)):
            for bn in (1, 2, 4, 8):
                for w in (1, 2, 4):
                    if bn * T > 2048 or bn * T < 64:
                        continue
                    with K.forced(block_n=bn, num_warps=w):
                        dev = graph_time([fn(f) for f in ss])
                    record(part="vsweep", estimator=est, n=N, t=T, competitor=f"rollbuf {bn}x{T} w{w}",
                           clock="device", us=dev * 1e6)
        del ss
        torch.cuda.empty_cache()


def time_vtrace(impl, quick=False):
    mod = rlt() if impl == "new" and not quick else None
    for N, T in VTRACE_SHAPES:
        ss = sets(N, T, N * T * 25)
        base = dict(part="vtrace", estimator="vtrace", n=N, t=T)
        dev = graph_time([rb_vtrace(f) for f in ss])
        record(**base, competitor="rollbuf vtrace", clock="device", us=dev * 1e6)
        record(**base, competitor="rollbuf vtrace", clock="call", us=call_time(rb_vtrace(ss[0])) * 1e6)
        if mod is not None and T <= 131072:
            dev = graph_time([rlt_vtrace(f, mod) for f in ss])
            record(**base, competitor="rl-triton compute_vtrace", clock="device", us=dev * 1e6)
            record(**base, competitor="rl-triton compute_vtrace", clock="call", us=call_time(rlt_vtrace(ss[0], mod)) * 1e6)
        del ss
        torch.cuda.empty_cache()


def host(impl):
    """Host time per call at 4096x128 (back to back, one sync at the end), and where F.gae spends it."""
    import cProfile
    import pstats

    from rollbuf import functional as F

    f = inputs(4096, 128, 0)
    ro = rb_rollout(f)
    fns = {"F.gae": rb_gae(f),
           "F.advantages": lambda: F.advantages(0.99, 0.95, rewards=f["rewards"], values=f["values"],
                                                terminated=f["terminated"], bootstrap_values=f["last"]),
           "kernels.run (adv+ret)": rb_run_call(f, ("advantages", "returns")),
           "kernels.run (adv)": rb_run_call(f, ("advantages",)),
           "Rollout.gae (adv+ret)": lambda: ro.gae(0.99, 0.95),
           "Rollout.advantages (adv)": lambda: ro.advantages(0.99, 0.95)}
    if impl == "new":  # the peers once (an old tree's A/B times rollbuf's own calls)
        mod = rlt()
        if mod is not None:
            fns["rl-triton compute_gae (adv)"] = rlt_gae(f, mod)
        fns["naive kernel (adv), Triton's launcher"] = naive_kernel()(f, 16, 8, False)
    for name, fn in fns.items():
        record(part="host", estimator="gae", n=4096, t=128, competitor=name, clock="host", us=host_us(fn, passes=3))
    for name in ("F.gae", "Rollout.advantages (adv)"):
        if name not in fns:
            continue
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            fns[name]()
        pr.disable()
        torch.cuda.synchronize()
        log(f"--- profile of {name} (300 calls)")
        pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(14)


def host_us(fn, passes=1, calls=2000):
    """Host µs per call: ``calls`` calls back to back after 50 warm-up calls, the clock read before
    the sync that ends them (best of ``passes``)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(passes):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / calls * 1e6)
    return best


def host_parts():
    """Where a call's host time goes at 4096x128 (back to back, one sync at the end): the
    allocations, the launch's prepare step, the keyword launch on prepared arguments, an empty
    kernel through Triton's JIT launch, and a CUDA-graph replay of the call."""
    import triton

    import rollbuf.kernels as K

    f = inputs(4096, 128, 0)
    p = rb_problem(f, ("advantages",))
    K.run(p)
    launch = K.launch_for(p)
    fields, ci, sc = launch.inputs(p)
    args, _, _, ws = launch.prepare(fields, ci, sc)

    @triton.jit
    def _empty_kernel(x):
        pass

    x = torch.empty(1, device="cuda")
    _empty_kernel[(1,)](x)
    fns = {
        "torch.empty 4096x128 fp32": lambda: torch.empty((4096, 128), device="cuda"),
        "torch.empty_like": lambda: torch.empty_like(f["values"]),
        "launch.inputs (adv)": lambda: launch.inputs(p),
        "launch.prepare (adv)": lambda: launch.prepare(fields, ci, sc),
        "launch.launch on prepared args (keyword launch)": lambda: launch.launch(args, ws),
        "empty kernel, Triton's JIT launch": lambda: _empty_kernel[(1,)](x),
        "kernels.run (adv)": lambda: K.run(p),
    }
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        K.run(p)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        K.run(p)
    fns["CUDA graph replay of kernels.run (adv)"] = g.replay
    for name, fn in fns.items():
        record(part="hostparts", estimator="gae", n=4096, t=128, competitor=name, clock="host",
               us=host_us(fn, passes=3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--part", default="gate,time,sweep,vtrace")
    ap.add_argument("--impl", default="new", choices=("new", "old"))
    ap.add_argument("--quick", action="store_true", help="time rollbuf alone (peers timed in an earlier run)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prov = provenance(args.impl)
    log(prov)
    bw = copy_bandwidth()
    log(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    parts = args.part.split(",")
    t0 = time.time()
    ok = True
    try:
        if "gate" in parts:
            ok = gate(args.impl)
            log(f"gate {'ok' if ok else 'FAILED'} ({time.time() - t0:.0f} s)")
        if "time" in parts:
            time_gae(args.impl, bw, args.quick)
        if "host" in parts:
            host(args.impl)
        if "hostparts" in parts:
            host_parts()
        if "vtrace" in parts:
            time_vtrace(args.impl, args.quick)
        if "sweep" in parts and args.impl == "new":
            sweep()
        if "vsweep" in parts and args.impl == "new":
            vsweep()
    finally:
        path = os.path.join(args.out, f"kernels_{args.impl}.csv")
        keys = ["part", "estimator", "n", "t", "competitor", "clock", "us", "pct_copy", "note"]
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys + list(prov) + ["copy_gbs"])
            w.writeheader()
            for r in ROWS:
                w.writerow({**{k: r.get(k, "") for k in keys}, **prov, "copy_gbs": f"{bw / 1e9:.0f}"})
        log(f"wrote {path} ({len(ROWS)} rows, {time.time() - t0:.0f} s)")
    # the short table: device / call per shape and competitor
    log("\n=== GAE (device µs | call µs) ===")
    table = {}
    for r in ROWS:
        if r["part"] in ("time", "vtrace") and r["us"] is not None:
            table.setdefault((r["estimator"], r["n"], r["t"], r["competitor"]), {})[r["clock"]] = r["us"]
    for (e, n, t, c), v in table.items():
        log(f"{e:7s} {n:>6}x{t:<8} {c:34s} {v.get('device', math.nan):9.2f} | {v.get('call', math.nan):9.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
