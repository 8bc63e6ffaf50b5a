"""The compiled CPU backend: every estimator as a sequential loop over time, compiled by numba.

On a CPU the fast algorithm is the plain one: each row is one pass over its steps in scan order,
carrying one state (two for V-trace), every step read once and every output written once. The rows
are independent; with enough work, contiguous ranges of rows run on ``torch.get_num_threads()``
threads at once (the compiled loops release the GIL; plain threads rather than numba's ``prange``,
whose OpenMP pool spins next to torch's own and slows both). The loops below
are the recursions of :mod:`rollbuf.boundary.coefficients` written out step by step:

* the state ``Z`` (backward) or ``F`` (forward) flows through masked steps unchanged, and masked
  steps write 0: "as if deleted";
* a backward row's window end is its last unmasked step, met first by the loop: there the state is
  set to the window-end carry (``bootstrap_values`` at that step, 0 if it terminated), unless the
  caller passed ``carry`` or the window end is terminal;
* ``bootstrap_values[t]`` is read only where step ``t`` is truncated and not terminated (and at the
  window end), through a branch, so a NaN in any other slot is never touched by arithmetic;
* each step's state update is one multiply-add (``z = α + β·z``), the outputs come off the chain;
  a done step stops the state by multiplying it by 0 (``γ·nd``, ``nd·e``), never by selecting 0, so
  a NaN or inf in the state goes on as ``0·NaN = NaN`` exactly as in the reference loop and the other
  backends (docs/semantics.md, "Non-finite inputs");
* a clipped importance ratio is ``min(bar, ratio)`` with a NaN ratio kept NaN and an overflowed one
  (``inf``) clipped to ``bar``.

Inputs are passed to the compiled code as a data pointer and two strides (three for ``x``) per
field, so any layout is read in place: a time-major ``[T, N]`` buffer passed as its transposed view
costs no copy, and every layout shares one compiled specialisation per accumulation dtype. Flags
are read as bytes (bool or uint8 tensors in place; 0/1 floating flags are converted to bool first).
Floating fields in another dtype than the accumulation dtype (bfloat16, float16, or a mix) are
converted to it first. Outputs are written in the accumulation dtype and converted to the output
dtype afterwards when that differs.

The entry point is :func:`run` (same contract as the torch backend's ``run``). Gradients are not
computed here: a call whose inputs require grad goes to the torch backend (or is wrapped by the
autograd layer, whose TD(λ) adjoint is the ``lambda_adjoint`` family below).

The kernels are compiled on first use and cached on disk (``cache=True``: numba's cache directory,
next to this file or ``NUMBA_CACHE_DIR``); the first call of each family in a fresh environment
compiles it, later processes load it.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from rollbuf.backends import torch_backend
from rollbuf.problem import Problem

__all__ = ["run", "PARALLEL_MIN_ELEMENTS", "PARALLEL_MIN_ROWS"]

# Rows are split over ``torch.get_num_threads()`` threads when there are at least this many rows
# and at least this many elements (steps × features) per thread; below, the calling thread runs
# every row (handing work to a thread costs more than it saves). Module attributes so that
# benchmarks and tests can move them.
PARALLEL_MIN_ROWS = 2
PARALLEL_MIN_ELEMENTS = 1 << 20

_JIT = dict(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy", boundscheck=False)


@intrinsic
def _void_ptr(typingctx, addr):
    """An integer address as a ``void*`` (for :func:`numba.carray`)."""

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(addr), codegen


@njit(inline="always", **_JIT)
def _view(ptr, size, like):
    """The ``size`` elements at address ``ptr`` as a 1-D array of ``like``'s dtype."""
    return numba.carray(_void_ptr(ptr), (size,), like.dtype)


@njit(inline="always", **_JIT)
def _bytes(ptr, size):
    return numba.carray(_void_ptr(ptr), (size,), np.uint8)


@njit(inline="always", **_JIT)
def _span(N, T, sn, st):
    """Elements from a field's first to its last: what its 1-D view must cover."""
    return 1 + (N - 1) * sn + (T - 1) * st


@njit(inline="always", **_JIT)
def _clip(ratio, bar):
    """``min(bar, ratio)`` that keeps a NaN ratio NaN (``ratio if ratio < bar else bar`` would give
    ``bar``: every comparison with NaN is false); an overflowed ratio (inf) is clipped to ``bar``."""
    return bar if ratio > bar else ratio


# ---------------------------------------------------------------------------------------------
# An absent field (no terminated, no truncated, no mask, no values, no carry, ...) is passed as
# None in place of its address: numba compiles the ``if p is not None`` branches out, so each
# combination of present fields gets its own loop with nothing left of the absent ones. A
# backward row's steps past its window end (masked) are zeroed first; the window-end state is set
# once; then one loop runs over the rest.
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# the TD(λ) family: GAE, TD(λ) returns, discounted returns (λ = 1), Monte Carlo (boot ≡ 0, V ≡ 0)
#   Z_t = (1−λ)V_t + λG_t,  G_t = local_t + γ·nd_t·Z_{t+1},  local_t = r_t + γ·[tr_t ∧ ¬k_t]·B_t
# ---------------------------------------------------------------------------------------------


def _lambda(N, n0, n1, T, pr, sr_n, sr_t, pv, sv_n, sv_t, pk, sk_n, sk_t, ptr, str_n, str_t,
            pb, sb_n, sb_t, pm, sm_n, sm_t, pc, sc_n, out_g, out_a, carry_out, gamma, lam, end_boot):
    """``pb``: ``bootstrap_values`` (read at truncated steps; at the window end when ``end_boot``);
    ``pc``: the carry past the window (else ``V(s_T)`` with ``end_boot``, else 0); ``out_a``:
    advantages ``G − V`` (None: returns only)."""
    r = _view(pr, _span(N, T, sr_n, sr_t), out_g)
    if pv is not None:
        v = _view(pv, _span(N, T, sv_n, sv_t), out_g)
    if pk is not None:
        k = _bytes(pk, _span(N, T, sk_n, sk_t))
    if ptr is not None:
        tr = _bytes(ptr, _span(N, T, str_n, str_t))
    if pb is not None:
        b = _view(pb, _span(N, T, sb_n, sb_t), out_g)
    if pm is not None:
        m = _bytes(pm, _span(N, T, sm_n, sm_t))
    if pc is not None:
        c = _view(pc, _span(N, 1, sc_n, 0), out_g)
    gl = gamma * lam
    for n in range(n0, n1):
        end = T - 1  # the window end: the last unmasked step (-1 if none)
        if pm is not None:
            while end >= 0 and m[n * sm_n + end * sm_t] == 0:
                out_g[n, end] = 0.0
                if out_a is not None:
                    out_a[n, end] = 0.0
                end -= 1
        z = 0.0  # Z past the window end
        if pc is not None:
            z = c[n * sc_n]
        elif pb is not None:
            if end_boot:  # V(s_T) at the window end, unless it terminated
                z = b[n * sb_n + (end if end >= 0 else T - 1) * sb_t]  # (no unmasked step: the last column)
                if pk is not None:
                    if end >= 0 and k[n * sk_n + end * sk_t] != 0:
                        z = 0.0
        for t in range(end, -1, -1):
            if pm is not None:
                if m[n * sm_n + t * sm_t] == 0:
                    out_g[n, t] = 0.0
                    if out_a is not None:
                        out_a[n, t] = 0.0
                    continue
            x = r[n * sr_n + t * sr_t]
            cont = 1.0
            kt = False
            if pk is not None:
                kt = k[n * sk_n + t * sk_t] != 0
                if kt:
                    cont = 0.0
            if ptr is not None:
                if tr[n * str_n + t * str_t] != 0:
                    cont = 0.0
                    if pb is not None:
                        if not kt:  # terminated wins: V(s'_t) of a terminal step is never read
                            x += gamma * b[n * sb_n + t * sb_t]
            vt = 0.0
            if pv is not None:
                vt = v[n * sv_n + t * sv_t]
            g = x + (gamma * cont) * z
            out_g[n, t] = g
            if out_a is not None:
                out_a[n, t] = g - vt
            z = ((1.0 - lam) * vt + lam * x) + (gl * cont) * z
        carry_out[n] = z


# ---------------------------------------------------------------------------------------------
# Retrace(λ): W_t = V_t + c_t(Q_t − q_t) = V_t + c_t(local_t − q_t) + γ·nd_t·c_t·W_{t+1},
#             Q_t = local_t + γ·nd_t·W_{t+1},  c_t = λ·min(c̄, π/μ)
# ---------------------------------------------------------------------------------------------


def _retrace(N, n0, n1, T, pr, sr_n, sr_t, pv, sv_n, sv_t, pk, sk_n, sk_t, ptr, str_n, str_t,
             pb, sb_n, sb_t, pm, sm_n, sm_t, pc, sc_n, plp, slp_n, slp_t, ptl, stl_n, stl_t,
             pq, sq_n, sq_t, out, carry_out, gamma, lam, c_bar, end_boot):
    r = _view(pr, _span(N, T, sr_n, sr_t), out)
    v = _view(pv, _span(N, T, sv_n, sv_t), out)
    lp = _view(plp, _span(N, T, slp_n, slp_t), out)
    tl = _view(ptl, _span(N, T, stl_n, stl_t), out)
    q = _view(pq, _span(N, T, sq_n, sq_t), out)
    if pk is not None:
        k = _bytes(pk, _span(N, T, sk_n, sk_t))
    if ptr is not None:
        tr = _bytes(ptr, _span(N, T, str_n, str_t))
    if pb is not None:
        b = _view(pb, _span(N, T, sb_n, sb_t), out)
    if pm is not None:
        m = _bytes(pm, _span(N, T, sm_n, sm_t))
    if pc is not None:
        c = _view(pc, _span(N, 1, sc_n, 0), out)
    for n in range(n0, n1):
        end = T - 1
        if pm is not None:
            while end >= 0 and m[n * sm_n + end * sm_t] == 0:
                out[n, end] = 0.0
                end -= 1
        z = 0.0
        if pc is not None:
            z = c[n * sc_n]
        elif pb is not None:
            if end_boot:
                z = b[n * sb_n + (end if end >= 0 else T - 1) * sb_t]
                if pk is not None:
                    if end >= 0 and k[n * sk_n + end * sk_t] != 0:
                        z = 0.0
        for t in range(end, -1, -1):
            if pm is not None:
                if m[n * sm_n + t * sm_t] == 0:
                    out[n, t] = 0.0
                    continue
            x = r[n * sr_n + t * sr_t]
            g = gamma
            kt = False
            if pk is not None:
                kt = k[n * sk_n + t * sk_t] != 0
                if kt:
                    g = 0.0
            if ptr is not None:
                if tr[n * str_n + t * str_t] != 0:
                    g = 0.0
                    if pb is not None:
                        if not kt:
                            x += gamma * b[n * sb_n + t * sb_t]
            ratio = np.exp(tl[n * stl_n + t * stl_t] - lp[n * slp_n + t * slp_t])
            ct = lam * _clip(ratio, c_bar)
            out[n, t] = x + g * z
            z = (v[n * sv_n + t * sv_t] + ct * (x - q[n * sq_n + t * sq_t])) + (g * ct) * z
        carry_out[n] = z


# ---------------------------------------------------------------------------------------------
# V-trace: state (u, V) of the next step;  u_t = ρ_t(local_t − V_t) + γ·nd_t·(ρ_t·V_{t+1} + c_t·u_{t+1}),
#   vs_t = V_t + u_t,  pg_t = ρpg_t·(local_t + γ·nd_t·(V_{t+1} + u_{t+1}) − V_t)
# ---------------------------------------------------------------------------------------------


def _vtrace(N, n0, n1, T, pr, sr_n, sr_t, pv, sv_n, sv_t, pk, sk_n, sk_t, ptr, str_n, str_t,
            pb, sb_n, sb_t, pm, sm_n, sm_t, pc, sc_n, sc_k, plp, slp_n, slp_t, ptl, stl_n, stl_t,
            out_vs, out_pg, carry_out, gamma, lam, rho_bar, c_bar, pg_rho_bar, end_boot):
    r = _view(pr, _span(N, T, sr_n, sr_t), out_vs)
    v = _view(pv, _span(N, T, sv_n, sv_t), out_vs)
    lp = _view(plp, _span(N, T, slp_n, slp_t), out_vs)
    tl = _view(ptl, _span(N, T, stl_n, stl_t), out_vs)
    if pk is not None:
        k = _bytes(pk, _span(N, T, sk_n, sk_t))
    if ptr is not None:
        tr = _bytes(ptr, _span(N, T, str_n, str_t))
    if pb is not None:
        b = _view(pb, _span(N, T, sb_n, sb_t), out_vs)
    if pm is not None:
        m = _bytes(pm, _span(N, T, sm_n, sm_t))
    if pc is not None:
        c = _view(pc, _span(N, 2, sc_n, sc_k), out_vs)
    for n in range(n0, n1):
        end = T - 1
        if pm is not None:
            while end >= 0 and m[n * sm_n + end * sm_t] == 0:
                out_vs[n, end] = 0.0
                out_pg[n, end] = 0.0
                end -= 1
        u = 0.0  # u past the window end
        vn = 0.0  # V past the window end
        if pc is not None:
            u = c[n * sc_n]
            vn = c[n * sc_n + sc_k]
        elif pb is not None:
            if end_boot:
                vn = b[n * sb_n + (end if end >= 0 else T - 1) * sb_t]
                if pk is not None:
                    if end >= 0 and k[n * sk_n + end * sk_t] != 0:
                        vn = 0.0
        for t in range(end, -1, -1):
            if pm is not None:
                if m[n * sm_n + t * sm_t] == 0:
                    out_vs[n, t] = 0.0
                    out_pg[n, t] = 0.0
                    continue
            x = r[n * sr_n + t * sr_t]
            g = gamma
            kt = False
            if pk is not None:
                kt = k[n * sk_n + t * sk_t] != 0
                if kt:
                    g = 0.0
            if ptr is not None:
                if tr[n * str_n + t * str_t] != 0:
                    g = 0.0
                    if pb is not None:
                        if not kt:
                            x += gamma * b[n * sb_n + t * sb_t]
            vt = v[n * sv_n + t * sv_t]
            ratio = np.exp(tl[n * stl_n + t * stl_t] - lp[n * slp_n + t * slp_t])
            rho = _clip(ratio, rho_bar)
            ct = lam * _clip(ratio, c_bar)
            rpg = _clip(ratio, pg_rho_bar)
            out_pg[n, t] = rpg * ((x + g * (vn + u)) - vt)
            u = (rho * (x - vt) + g * (rho * vn)) + (g * ct) * u
            out_vs[n, t] = vt + u
            vn = vt
        carry_out[n, 0] = u
        carry_out[n, 1] = vn


# ---------------------------------------------------------------------------------------------
# forward: eligibility traces (decay = γλ) and episodic sums (decay = 1), x [N, T, F]
#   e_t = x_t + decay·F_{t−1},  F_t = nd_t·e_t,  F_{−1} = initial,  final = F_{T−1}
# ---------------------------------------------------------------------------------------------


def _trace(N, n0, n1, T, F, px, sx_n, sx_t, sx_f, pk, sk_n, sk_t, ptr, str_n, str_t, pm, sm_n, sm_t,
           pc, sc_n, sc_f, out, final, decay):
    x = _view(px, 1 + (N - 1) * sx_n + (T - 1) * sx_t + (F - 1) * sx_f, out)
    if pk is not None:
        k = _bytes(pk, _span(N, T, sk_n, sk_t))
    if ptr is not None:
        tr = _bytes(ptr, _span(N, T, str_n, str_t))
    if pm is not None:
        m = _bytes(pm, _span(N, T, sm_n, sm_t))
    if pc is not None:
        c = _view(pc, _span(N, F, sc_n, sc_f), out)
    for n in range(n0, n1):
        for f in range(F):
            final[n, f] = 0.0
            if pc is not None:
                final[n, f] = c[n * sc_n + f * sc_f]
        for t in range(T):
            if pm is not None:
                if m[n * sm_n + t * sm_t] == 0:
                    for f in range(F):
                        out[n, t, f] = 0.0
                    continue
            nd = 1.0  # not done; the state is reset by multiplying (0·NaN = NaN carries on)
            if pk is not None:
                if k[n * sk_n + t * sk_t] != 0:
                    nd = 0.0
            if ptr is not None:
                if tr[n * str_n + t * str_t] != 0:
                    nd = 0.0
            base = n * sx_n + t * sx_t
            for f in range(F):
                e = x[base + f * sx_f] + decay * final[n, f]
                out[n, t, f] = e
                final[n, f] = nd * e


# ---------------------------------------------------------------------------------------------
# the generic primitive: y_t = α_t + β_t·y_{t∓1}, y outside the row = initial
# ---------------------------------------------------------------------------------------------


def _affine(N, n0, n1, T, pa, sa_n, sa_t, pb, sb_n, sb_t, pc, sc_n, out, final, reverse):
    a = _view(pa, _span(N, T, sa_n, sa_t), out)
    b = _view(pb, _span(N, T, sb_n, sb_t), out)
    if pc is not None:
        c = _view(pc, _span(N, 1, sc_n, 0), out)
    for n in range(n0, n1):
        y = 0.0
        if pc is not None:
            y = c[n * sc_n]
        if reverse:
            for t in range(T - 1, -1, -1):
                y = a[n * sa_n + t * sa_t] + b[n * sb_n + t * sb_t] * y
                out[n, t] = y
        else:
            for t in range(T):
                y = a[n * sa_n + t * sa_t] + b[n * sb_n + t * sb_t] * y
                out[n, t] = y
        final[n] = y


# ---------------------------------------------------------------------------------------------
# the TD(λ) adjoint (the backward pass of the TD(λ) family), forward in time:
#   U_t = W_{t+1} = c_t·Ḡ_t + λc_t·U_{t−1},  U_{−1} = W_0,  c_t = γ·nd_t,  Ḡ = ḡ_G + ḡ_A
#   r̄_t = Ḡ_t + λW_t,  V̄_t = (1−λ)W_t − ḡ_A,t  (W_t = U_{t−1});  carry out W_T = U_{T−1}
# ---------------------------------------------------------------------------------------------


def _lambda_adjoint(N, n0, n1, T, pg, sg_n, sg_t, pa, sa_n, sa_t, pk, sk_n, sk_t, ptr, str_n, str_t,
                    pm, sm_n, sm_t, pc, sc_n, out_r, out_v, carry_out, gamma, lam):
    gg = _view(pg, _span(N, T, sg_n, sg_t), out_r)
    if pa is not None:
        ga = _view(pa, _span(N, T, sa_n, sa_t), out_r)
    if pk is not None:
        k = _bytes(pk, _span(N, T, sk_n, sk_t))
    if ptr is not None:
        tr = _bytes(ptr, _span(N, T, str_n, str_t))
    if pm is not None:
        m = _bytes(pm, _span(N, T, sm_n, sm_t))
    if pc is not None:
        c = _view(pc, _span(N, 1, sc_n, 0), out_r)
    for n in range(n0, n1):
        w = 0.0
        if pc is not None:
            w = c[n * sc_n]
        for t in range(T):
            if pm is not None:
                if m[n * sm_n + t * sm_t] == 0:
                    out_r[n, t] = 0.0
                    if out_v is not None:
                        out_v[n, t] = 0.0
                    continue
            a = 0.0
            if pa is not None:
                a = ga[n * sa_n + t * sa_t]
            g = gg[n * sg_n + t * sg_t] + a
            out_r[n, t] = g + lam * w
            if out_v is not None:
                out_v[n, t] = (1.0 - lam) * w - a
            cont = gamma
            if pk is not None:
                if k[n * sk_n + t * sk_t] != 0:
                    cont = 0.0
            if ptr is not None:
                if tr[n * str_n + t * str_t] != 0:
                    cont = 0.0
            w = cont * g + (lam * cont) * w
        carry_out[n] = w


_KERNELS = {name: njit(**_JIT)(fn) for name, fn in (
    ("lambda", _lambda), ("retrace", _retrace), ("vtrace", _vtrace), ("trace", _trace),
    ("affine", _affine), ("lambda_adjoint", _lambda_adjoint))}


# ---------------------------------------------------------------------------------------------
# the call
# ---------------------------------------------------------------------------------------------

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}
_ABSENT = (None, None, 0, 0)


_POOL = {"pool": None, "size": 0}
_POOL_LOCK = threading.Lock()


def _after_fork_in_child():
    _POOL["pool"], _POOL["size"] = None, 0  # the parent's worker threads do not exist in a child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _pool(workers):
    with _POOL_LOCK:
        if _POOL["pool"] is None or _POOL["size"] != workers:

            if _POOL["pool"] is not None:
                _POOL["pool"].shutdown(wait=False)
            _POOL["pool"] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollbuf-cpu")
            _POOL["size"] = workers
        return _POOL["pool"]


def _launch(name, N, work, *args):
    """Run kernel ``name`` over rows ``[0, N)``: on this thread, or with enough work split into
    contiguous row ranges over ``torch.get_num_threads()`` threads (the kernels release the GIL)."""
    kernel = _KERNELS[name]
    parts = 1
    if N >= PARALLEL_MIN_ROWS and work >= PARALLEL_MIN_ELEMENTS:
        parts = min(torch.get_num_threads(), N, work // PARALLEL_MIN_ELEMENTS)
    if parts <= 1:
        kernel(N, 0, N, *args)
        return
    bounds = [N * i // parts for i in range(parts + 1)]
    pool = _pool(parts - 1)
    futures = [pool.submit(kernel, N, bounds[i], bounds[i + 1], *args) for i in range(1, parts)]
    kernel(N, 0, bounds[1], *args)
    for fut in futures:
        fut.result()


def _f(x, dt):
    """A float field: ``(tensor, address, stride_n, stride_t)`` in dtype ``dt`` (converted only if it
    is in another dtype); an absent one has no address (its loads are compiled out)."""
    if x is None:
        return _ABSENT
    if x.dtype != dt:
        x = x.to(dt)
    s = x.stride()
    return x, x.data_ptr(), s[0], s[1]


def _b(x):
    """A flag as bytes: ``(tensor, address, stride_n, stride_t)``; bool and uint8 in place."""
    if x is None:
        return _ABSENT
    if x.dtype != torch.bool and x.dtype != torch.uint8:
        x = x != 0
    s = x.stride()
    return x, x.data_ptr(), s[0], s[1]


def _col(x, dt):
    """A per-row value ``[N]`` (or ``[N, K]``): ``(tensor, address, stride_n, stride_k)``."""
    if x is None:
        return _ABSENT
    if x.dtype != dt:
        x = x.to(dt)
    s = x.stride()
    return x, x.data_ptr(), s[0], (s[1] if len(s) > 1 else 0)


def _boot(x, dt):
    """``bootstrap_values`` ``[N, T]``, or ``[N]`` read as a column repeated along time (stride 0)."""
    if x is not None and x.dim() == 1:
        if x.dtype != dt:
            x = x.to(dt)
        return x, x.data_ptr(), x.stride(0), 0
    return _f(x, dt)


def _out(a, dt):
    t = torch.from_numpy(a)
    return t if t.dtype == dt else t.to(dt)


def _torch_run(p):
    return torch_backend.run(p)


def run(p: Problem):
    """Run one validated problem (see :class:`rollbuf.problem.Problem`) on the CPU.

    Returns ``(outputs, carry)`` like the torch backend: per-step outputs ``[N, T]`` (``[N, T, *F]``
    for the forward estimators) in ``p.out_dtype``, 0 at masked steps; ``carry`` in
    ``p.compute_dtype``: the state at the window's first step (``[N]``, ``[N, 2]`` for V-trace) for
    the backward families, ``W_T`` for ``lambda_adjoint``, ``None`` for ``trace`` and ``affine``
    (whose outputs end with ``final``).
    """
    fam = p.family
    f = p.fields
    dt = p.compute_dtype
    npdt = _NUMPY.get(dt)
    if npdt is None:
        raise TypeError(f"the compiled CPU backend accumulates in float32 or float64, got {dt}")
    if fam == "trace":
        return _run_trace(p, f, dt, npdt)
    if fam == "affine":
        return _run_affine(p, f, dt, npdt)
    main = p.main
    if main.device.type != "cpu":
        raise ValueError(f"the compiled CPU backend runs on CPU tensors, got {main.device}")
    N, T = main.shape
    if fam == "lambda_adjoint":
        return _run_adjoint(p, f, dt, npdt, N, T)
    if N == 0 or T == 0:
        return _torch_run(p)
    r = _f(main, dt)
    k = _b(f.get("terminated"))
    tr = _b(f.get("truncated"))
    m = _b(f.get("mask"))
    bv = f.get("bootstrap_values")
    if p.no_bootstrap:
        bv = None
    b = _boot(bv, dt)
    # the window end reads V(s_T) unless a carry is given or it is terminal
    end_boot = p.carry is None and p.window_end != "terminal" and not p.no_bootstrap
    if end_boot and bv is None:
        raise ValueError("bootstrap_values is required: the window end bootstraps from V(s_T)")
    c = _col(p.carry, dt)
    od = p.out_dtype
    if fam == "lambda":
        v = _f(f.get("values"), dt)
        g_out = np.empty((N, T), npdt)
        a_out = np.empty((N, T), npdt) if "advantages" in p.outputs else None
        carry = np.empty(N, npdt)
        _launch("lambda", N, N * T, T, r[1], r[2], r[3], v[1], v[2], v[3], k[1], k[2], k[3],
                tr[1], tr[2], tr[3], b[1], b[2], b[3], m[1], m[2], m[3], c[1], c[2],
                g_out, a_out, carry, p.gamma, p.lam, end_boot)
        named = {"returns": g_out, "advantages": a_out}
        return tuple(_out(named[o], od) for o in p.outputs), torch.from_numpy(carry)
    v = _f(f["values"], dt)
    lp = _f(f["log_probs"], dt)
    tl = _f(f["target_log_probs"], dt)
    if fam == "retrace":
        q = _f(f["q_values"], dt)
        out = np.empty((N, T), npdt)
        carry = np.empty(N, npdt)
        _launch("retrace", N, N * T, T, r[1], r[2], r[3], v[1], v[2], v[3], k[1], k[2], k[3],
                tr[1], tr[2], tr[3], b[1], b[2], b[3], m[1], m[2], m[3], c[1], c[2],
                lp[1], lp[2], lp[3], tl[1], tl[2], tl[3], q[1], q[2], q[3], out, carry,
                p.gamma, p.lam, p.c_bar, end_boot)
        return (_out(out, od),), torch.from_numpy(carry)
    if fam != "vtrace":
        raise ValueError(f"unknown family {fam!r}")
    vs = np.empty((N, T), npdt)
    pg = np.empty((N, T), npdt)
    carry = np.empty((N, 2), npdt)
    _launch("vtrace", N, N * T, T, r[1], r[2], r[3], v[1], v[2], v[3], k[1], k[2], k[3],
            tr[1], tr[2], tr[3], b[1], b[2], b[3], m[1], m[2], m[3], c[1], c[2], c[3],
            lp[1], lp[2], lp[3], tl[1], tl[2], tl[3], vs, pg, carry,
            p.gamma, p.lam, p.rho_bar, p.c_bar, p.pg_rho_bar, end_boot)
    return (_out(vs, od), _out(pg, od)), torch.from_numpy(carry)


def _run_trace(p, f, dt, npdt):
    x = f["x"]
    if x.device.type != "cpu":
        raise ValueError(f"the compiled CPU backend runs on CPU tensors, got {x.device}")
    N, T = x.shape[0], x.shape[1]
    feat = tuple(x.shape[2:])
    Fn = 1
    for d in feat:
        Fn *= d
    if N == 0 or T == 0 or Fn == 0:
        return _torch_run(p)
    if x.dtype != dt:
        x = x.to(dt)
    x3 = x.reshape(N, T, Fn) if x.dim() != 3 else x  # a view unless the features cannot merge
    s = x3.stride()
    k = _b(f.get("terminated"))
    tr = _b(f.get("truncated"))
    m = _b(f.get("mask"))
    c = _ABSENT if p.carry is None else _col(p.carry.reshape(N, Fn), dt)
    out = np.empty((N, T, Fn), npdt)
    final = np.empty((N, Fn), npdt)
    _launch("trace", N, N * T * Fn, T, Fn, x3.data_ptr(), s[0], s[1], s[2], k[1], k[2], k[3],
            tr[1], tr[2], tr[3], m[1], m[2], m[3], c[1], c[2], c[3], out, final, p.decay)
    return (_out(out, p.out_dtype).reshape(x.shape), torch.from_numpy(final).reshape(N, *feat)), None


def _run_affine(p, f, dt, npdt):
    alpha, beta = f["alpha"], f["beta"]
    if alpha.device.type != "cpu":
        raise ValueError(f"the compiled CPU backend runs on CPU tensors, got {alpha.device}")
    N, T = alpha.shape
    init = p.carry
    if N == 0 or T == 0:
        init = torch.zeros(N, dtype=dt) if init is None else init.to(dt)
        return (torch.empty((N, T), dtype=p.out_dtype), init), None
    a = _f(alpha, dt)
    b = _f(beta, dt)
    c = _col(init, dt)
    y = np.empty((N, T), npdt)
    final = np.empty(N, npdt)
    _launch("affine", N, N * T, T, a[1], a[2], a[3], b[1], b[2], b[3], c[1], c[2], y, final,
            bool(p.reverse))
    return (_out(y, p.out_dtype), torch.from_numpy(final)), None


def _run_adjoint(p, f, dt, npdt, N, T):
    two = len(p.outputs) > 1
    if N == 0 or T == 0:
        outs = tuple(torch.zeros((N, T), dtype=p.out_dtype) for _ in p.outputs)
        w = torch.zeros(N, dtype=dt) if p.carry is None else p.carry.to(dt)
        return outs, w
    g = _f(f["grad_returns"], dt)
    a = _f(f.get("grad_advantages"), dt)
    k = _b(f.get("terminated"))
    tr = _b(f.get("truncated"))
    m = _b(f.get("mask"))
    c = _col(p.carry, dt)
    r_out = np.empty((N, T), npdt)
    v_out = np.empty((N, T), npdt) if two else None
    carry = np.empty(N, npdt)
    _launch("lambda_adjoint", N, N * T, T, g[1], g[2], g[3], a[1], a[2], a[3], k[1], k[2], k[3],
            tr[1], tr[2], tr[3], m[1], m[2], m[3], c[1], c[2], r_out, v_out, carry, p.gamma, p.lam)
    outs = (_out(r_out, p.out_dtype),) if v_out is None else (_out(r_out, p.out_dtype), _out(v_out, p.out_dtype))
    return outs, torch.from_numpy(carry)
