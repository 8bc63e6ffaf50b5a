"""V-trace on the torch backend: its pair maps and its outputs (``t``: the call,
:class:`rollbuf.backends.torch_backend.Loader`, which loads, scans and masks)."""

import math

import torch

from rollbuf.boundary.coefficients import rebind
from rollbuf.kernels.vtrace.coefficients import truncated_weights, vtrace_out, vtrace_step


def clipped_ratio(log_ratio, bar: float | None):
    """The torch path's clip (:func:`~rollbuf.kernels.vtrace.coefficients.clip`): ``min(bar, exp(log_ratio))``
    without forming ``exp`` where it is clipped: where the clip is active the value is ``bar`` and the gradient 0
    (as ``torch.clamp``), and no overflowed ``exp`` (≥ 88.8 in float32) turns that 0 into NaN; a NaN log-ratio
    gives NaN; a ``None`` bar ``None``."""
    if bar is None:
        return None
    log_bar = math.log(bar)
    clipped = log_ratio > log_bar  # at the threshold the gradient passes, as torch.clamp
    return torch.where(clipped, bar, torch.exp(torch.clamp(log_ratio, max=log_bar)))


weights = rebind(truncated_weights, clip=clipped_ratio)  # of the log-ratio


def steps(t):
    """The own-step pair maps ``(p, q, s, a, w)`` on ``(u, V)`` and the fields the outputs read."""
    p = t.p
    r, k, tr, boot = t.backward_fields()
    v = t.load("values")
    rho, c, rho_pg = weights(t.load("target_log_probs") - t.load("log_probs"), p.lam, p.rho_bar, p.c_bar, p.pg_rho_bar)
    elems = [torch.as_tensor(e, dtype=t.dt, device=r.device) for e in vtrace_step(r, v, k, tr, boot, rho, c, p.gamma)]
    return torch.broadcast_tensors(*elems), dict(r=r, k=k, tr=tr, boot=boot, v=v, rho=rho, c=c, rho_pg=rho_pg)


def outputs(t, elems, env):
    """``(vs_t, pg_t)`` and the carry ``(u_0, V_0)``. The pair maps ``(u, V) -> (a + p·u + q·V, w + s·V)``
    are upper triangular: V never reads u. So the pair scan is two scalar scans, V first
    (``V_t = w_t + s_t·V_{t+1}``), then u with the V state folded into its α (``u_t = a_t + q_t·V_{t+1} +
    p_t·u_{t+1}``); each has the analytic adjoint."""
    P, Q, S, A, W = elems
    carry = t.end_carry()
    cu, cv = carry[..., 0], carry[..., 1]
    v_incl = t.scan(W, S, True, cv)
    v_next = t.exclusive(v_incl, cv, reverse=True)
    u_incl = t.scan(A + Q * v_next, P, True, cu)
    u_next = t.exclusive(u_incl, cu, reverse=True)
    r = env["r"]
    vs, pg = vtrace_out(r, env["v"], env["k"], env["tr"], env["boot"], env["rho"], env["c"], env["rho_pg"], t.p.gamma,
                        u_next, v_next)
    carry_out = torch.stack([u_incl[..., 0], v_incl[..., 0]], -1) if r.shape[-1] else carry
    return t.masked((vs, pg)), carry_out
