"""The ``torch`` backend: every estimator as one vectorised affine scan, no Python loop over time.

The scans are :mod:`rollbuf.backends.scan`'s blocked scan in linear space (``BLOCK`` steps in a
vectorised loop, ``log2(T/BLOCK)`` doubling passes across blocks): no cumulative products of
discounts or logarithms are formed, so nothing underflows at long ``T`` or as ``γλ → 1``.

The coefficients and outputs come from :mod:`rollbuf.boundary.coefficients`, the same functions the
Triton kernels compile; where ``bootstrap_values`` is read and where each window ends come from
:mod:`rollbuf.windows`. This module only loads the fields (zeroing whatever must not be read),
applies the mask identity, scans, and applies the epilogue.

``fused=True`` (the ``triton`` backend's backward passes) runs the scans on the fused kernel.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rollbuf import windows
from rollbuf.backends.scan import affine_scan, compose_all
from rollbuf.boundary import coefficients as C
from rollbuf.kernels.retrace.coefficients import retrace_step
from rollbuf.kernels.td_lambda.coefficients import lambda_out, lambda_step
from rollbuf.kernels.traces.coefficients import trace_out, trace_step
from rollbuf.kernels.vtrace.coefficients import vtrace_out, vtrace_step
from rollbuf.problem import Family, Problem

__all__ = ["run", "steps", "window_map", "read_bootstrap", "end_carry"]


def _exclusive(incl, carry, reverse):
    """State one step further along the scan: ``Z_{t+1}`` (backward) or ``F_{t−1}`` (forward)."""
    c = carry.unsqueeze(-1).to(incl.dtype)
    if reverse:
        return torch.cat([incl[..., 1:], c], dim=-1)
    return torch.cat([c, incl[..., :-1]], dim=-1)


_PAIR_IDENTITY = (1.0, 0.0, 1.0, 0.0, 0.0)  # (p, q, s, a, w) of the identity map on (u, V)


class _Loader:
    """Clean fields of one problem: floats in the compute dtype and flags as 0/1, all 0 at masked
    steps (``x`` of the forward family: ``[N, *F, T]``)."""

    def __init__(self, p: Problem):
        self.p, self.dt = p, p.compute_dtype
        self.m = p.flag("mask")

    def load(self, name):
        x = self.p.fields.get(name)
        if x is None:
            return None
        x = x.to(self.dt)
        m = self.m
        return x if m is None else torch.where(m.reshape(m.shape + (1,) * (x.dim() - 2)), x, 0)

    def flag(self, name, like):
        f = self.p.flag(name)
        if f is None:
            return torch.zeros((), dtype=self.dt, device=like.device)
        f = f if self.m is None else f & self.m
        return f.to(self.dt)


def steps(p: Problem):
    """The per-step maps of ``p``'s scan (masked steps the identity) and the fields the epilogue reads.

    Returns ``(elems, compose, identity, reverse, env)``: ``elems`` a tuple of ``[N, T]`` tensors
    (the forward family: ``α`` ``[N, *F, T]`` and ``β`` ``[N, 1.., T]``, broadcastable), ``env`` a dict
    of the loaded fields (``r, k, tr, boot, v, ...``). Shared by :func:`run` and :func:`window_map`.
    """
    L = _Loader(p)
    dt, m = L.dt, L.m
    env: dict[str, Any] = {"m": m}
    if p.family == Family.FORWARD:
        x = L.load("x").movedim(1, -1)  # [N, T, *F] -> [N, *F, T]
        lift = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)  # flags [N, T] -> [N, 1.., T]
        k, tr = L.flag("terminated", x), L.flag("truncated", x)
        k, tr = (f if f.dim() == 0 else f.reshape(lift) for f in (k, tr))
        alpha, beta = trace_step(x, k, tr, p.decay)
        beta = torch.as_tensor(beta, dtype=dt, device=x.device).expand(lift)  # flags only: no *F
        if m is not None:
            alpha = torch.where(m.reshape(lift), alpha, 0)
            beta = torch.where(m.reshape(lift), beta, 1)
        env.update(x=x, lift=lift)
        return (alpha, beta), C.compose, (0.0, 1.0), False, env

    if p.family == Family.GENERIC:
        e = p.estimator
        clean = {f.name: (L.flag(f.name, p.main) if f.kind == "flag" else L.load(f.name)) for f in e.fields}
        alpha, beta = torch.broadcast_tensors(*e.coefficients(clean, p.params))
        if m is not None:
            alpha = torch.where(m, alpha, 0)
            beta = torch.where(m, beta, 1)
        env.update(clean=clean)
        return (alpha, beta), C.compose, (0.0, 1.0), p.reverse, env

    r = L.load("rewards")
    k = L.flag("terminated", r)
    tr = L.flag("truncated", r)
    boot = read_bootstrap(p, dt)
    env.update(r=r, k=k, tr=tr, boot=boot)
    if p.family == Family.TD_LAMBDA:
        v = L.load("values") if p.fields.get("values") is not None else torch.zeros_like(r)
        env.update(v=v)
        elems = lambda_step(r, v, k, tr, boot, p.gamma, p.lam)
    else:
        v = L.load("values")
        log_ratio = L.load("target_log_probs") - L.load("log_probs")
        c = p.lam * clipped_ratio(log_ratio, p.c_bar)
        env.update(v=v, c=c)
        if p.family == Family.RETRACE:
            elems = retrace_step(r, v, k, tr, boot, L.load("q_values"), c, p.gamma)
        else:
            if p.family != Family.VTRACE:
                raise ValueError(f"the torch backend has no family {p.family!r}")
            rho = clipped_ratio(log_ratio, p.rho_bar)
            env.update(rho=rho, rho_pg=clipped_ratio(log_ratio, p.pg_rho_bar))
            elems = vtrace_step(r, v, k, tr, boot, rho, c, p.gamma)
            elems = [torch.as_tensor(e, dtype=dt, device=r.device) for e in elems]
            elems = torch.broadcast_tensors(*elems)
            if m is not None:
                elems = tuple(torch.where(m, e, i) for e, i in zip(elems, _PAIR_IDENTITY, strict=True))
            return tuple(elems), C.compose_pair, _PAIR_IDENTITY, True, env
    alpha, beta = torch.broadcast_tensors(*elems)
    if m is not None:
        alpha = torch.where(m, alpha, 0)
        beta = torch.where(m, beta, 1)
    return (alpha, beta), C.compose, (0.0, 1.0), True, env


def clipped_ratio(log_ratio, bar: float):
    """``min(bar, exp(log_ratio))`` without forming ``exp`` where it is clipped: where the clip is
    active the value is ``bar`` and the gradient 0 (as ``torch.clamp``), and no overflowed
    ``exp`` (≥ 88.8 in float32) turns that 0 into NaN; a NaN log-ratio gives NaN."""
    log_bar = math.log(bar)
    clipped = log_ratio > log_bar  # at the threshold the gradient passes, as torch.clamp
    return torch.where(clipped, bar, torch.exp(torch.clamp(log_ratio, max=log_bar)))


def window_map(p: Problem):
    """The affine map of a whole window ``p`` (its carry ignored), for chaining windows without
    running them: what :func:`run` would compose, as :func:`compose_all` of the same step maps.

    * ``TD_LAMBDA`` / ``RETRACE``: ``(a, b)``, each ``[N]``: ``Z_0 = a + b·Z_T``;
    * ``VTRACE``: ``(p, q, s, a, w)``, each ``[N]``: ``(u_0, V_0) = (a + p·u_T + q·V_T, w + s·V_T)``;
    * ``FORWARD``: ``(a, b)``, ``a`` ``[N, *F]``, ``b`` ``[N]``: ``final = F_{T−1} = a + b·initial``.

    Used by :mod:`rollbuf.distributed` (on any device: it is plain torch).
    """
    elems, compose, identity, reverse, _ = steps(p)
    out = compose_all(elems, compose, identity, reverse)
    if p.family == Family.FORWARD:
        a, b = out
        return a, b.reshape(b.shape[0])
    return out


def run(p: Problem, fused: bool = False):
    """Run one prepared problem. Returns ``(outputs, carry)``; outputs are 0 at masked steps; the
    forward family returns ``final`` as its last output and no carry."""
    dt = p.compute_dtype
    if p.family == Family.AFFINE:  # the public primitive: α and β given as data
        alpha, beta, initial = p.fields["alpha"], p.fields["beta"], p.carry
        # an affine problem is built with all three (functional.affine_scan: initial 0 by default)
        assert alpha is not None and beta is not None and initial is not None
        init = initial.to(dt)
        y = affine_scan(alpha.to(dt), beta.to(dt), p.reverse, init, fused)
        final = (y[..., 0] if p.reverse else y[..., -1]) if y.shape[-1] else init
        return (y, final), None
    if p.family == Family.TD_LAMBDA_ADJOINT:
        raise ValueError("the TD(λ) adjoint runs through rollbuf.backends.autograd, not as a problem")
    elems, _, _, reverse, env = steps(p)
    m = env["m"]

    if p.family == Family.FORWARD:
        alpha, beta = elems
        x, lift = env["x"], env["lift"]
        init = torch.zeros(x.shape[:-1], dtype=dt, device=x.device) if p.carry is None else p.carry.to(dt)
        incl = affine_scan(alpha, beta, False, init, fused)
        out = trace_out(x, p.decay, _exclusive(incl, init, reverse=False))
        if m is not None:
            out = torch.where(m.reshape(lift), out, 0)
        final = incl[..., -1] if incl.shape[-1] else init
        return (out.movedim(-1, 1), final), None

    if p.family == Family.GENERIC:
        return _run_generic(p, elems, reverse, env, fused)

    r, k, tr, boot, v = (env[n] for n in ("r", "k", "tr", "boot", "v"))
    carry = end_carry(p, dt)

    if p.family == Family.TD_LAMBDA:
        z_next, z0 = _scalar_scan(elems[0], elems[1], carry, fused)
        g = lambda_out(r, k, tr, boot, p.gamma, z_next)
        named = {"returns": g, "advantages": g - v}
        return _masked(tuple(named[o] for o in p.outputs), m), z0

    if p.family == Family.RETRACE:
        z_next, z0 = _scalar_scan(elems[0], elems[1], carry, fused)
        return _masked((lambda_out(r, k, tr, boot, p.gamma, z_next),), m), z0

    # VTRACE. The pair maps (u, V) -> (a + p·u + q·V, w + s·V) are upper triangular: V never reads u.
    # So the pair scan is two scalar scans, V first (V_t = w_t + s_t·V_{t+1}), then u with the V
    # state folded into its α (u_t = a_t + q_t·V_{t+1} + p_t·u_{t+1}); each has the analytic adjoint.
    P, Q, S, A, W = elems
    cu, cv = carry[..., 0], carry[..., 1]
    v_incl = affine_scan(W, S, True, cv, fused)
    v_next = _exclusive(v_incl, cv, reverse=True)
    u_incl = affine_scan(A + Q * v_next, P, True, cu, fused)
    u_next = _exclusive(u_incl, cu, reverse=True)
    vs, pg = vtrace_out(r, v, k, tr, boot, env["rho"], env["c"], env["rho_pg"], p.gamma, u_next,
                          v_next)
    carry_out = torch.stack([u_incl[..., 0], v_incl[..., 0]], -1) if r.shape[-1] else carry
    return _masked((vs, pg), m), carry_out


def _run_generic(p: Problem, elems, reverse, env, fused):
    """A registry estimator given by its coefficient function: one scan, its epilogue (default:
    the inclusive state), outputs 0 at masked steps; the carry is the state at the row's first
    step in scan order (backward) / ``final`` as the last output (forward)."""
    e, dt = p.estimator, p.compute_dtype
    N = p.num_rows
    if p.carry is not None:
        init = p.carry.to(dt)
    elif e.window_end_carry is not None and reverse and p.window_end != "terminal":
        init = e.window_end_carry(env["clean"], p.params).to(dt)
    else:
        init = torch.zeros(N, dtype=dt, device=p.main.device)
    alpha, beta = elems
    incl = affine_scan(alpha, beta, reverse, init, fused)
    nxt = _exclusive(incl, init, reverse)
    outs = (incl,) if e.outputs_from_state is None else tuple(e.outputs_from_state(env["clean"], p.params, nxt, incl))
    T = incl.shape[-1]
    edge = (incl[..., 0] if reverse else incl[..., -1]) if T else init
    outs = _masked(outs, env["m"])
    if e.direction == "forward":
        return (*outs, edge), None
    return outs, edge


def _scalar_scan(alpha, beta, carry, fused):
    """Backward scan of already masked ``(α, β)``: ``(Z_{t+1} for every t, Z_0)``."""
    incl = affine_scan(alpha, beta, True, carry, fused)
    z0 = incl[..., 0] if incl.shape[-1] else carry
    return _exclusive(incl, carry, reverse=True), z0


def _masked(outs, m):
    if m is None:
        return outs
    return tuple(torch.where(m, o, 0) for o in outs)


def read_bootstrap(p: Problem, dt):
    """``B_t``: bootstrap values where a step reads them in its local term (:func:`rollbuf.windows.
    bootstrap_read`), 0 elsewhere, so that nothing unread (not even a NaN) reaches the arithmetic."""
    bv = p.fields.get("bootstrap_values")
    r = p.fields.get("rewards")
    if r is None:
        raise ValueError(f"the {p.family} family reads rewards, which the problem does not give")
    if bv is None or p.no_bootstrap:
        return torch.zeros((), dtype=dt, device=r.device)
    read = windows.bootstrap_read(p.fields.get("terminated"), p.fields.get("truncated"), p.fields.get("mask"))
    if read is None:
        return torch.zeros((), dtype=dt, device=r.device)
    bv = bv.to(dt)
    if bv.dim() == r.dim() - 1:  # [N]: only the window-end column (validated: no interior trunc)
        bv = bv.unsqueeze(-1)
    return torch.where(read, bv, 0)


def end_carry(p: Problem, dt):
    """The scan state past the window (:func:`rollbuf.windows.window_end_carry`)."""
    r = p.fields.get("rewards")
    if r is None:
        raise ValueError(f"the {p.family} family reads rewards, which the problem does not give")
    return windows.window_end_carry(
        carry=p.carry, window_end=p.window_end, no_bootstrap=p.no_bootstrap,
        bootstrap_values=p.fields.get("bootstrap_values"), terminated=p.fields.get("terminated"),
        mask=p.fields.get("mask"), shape=tuple(r.shape[:2]), pair=p.pair, dtype=dt, device=r.device)
