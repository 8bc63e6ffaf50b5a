"""Retrace's analytic adjoint (``a``: the call, :class:`rollbuf.backends.autograd.Adjoint`)."""

import torch

from rollbuf.kernels.vtrace.adjoint import weights


def backward(a, grads, out0):
    """The analytic adjoint of Retrace, from its inputs and its output ``Q`` (no forward recompute).

    ``W_t = V_t + c_t(local_t − q_t) + g_t·c_t·W_{t+1}`` and ``Q_t = local_t + g_t·W_{t+1}``
    (``g = γ·nd``, ``c = λ·min(ratio, c̄)``). With ``Q̄`` and ``Ū_t = ∂L/∂W_t``: ``U_t = Ū_{t+1} =
    g_t·Q̄_t + g_t·c_t·U_{t−1}`` is one forward scan (masked steps the identity) from the carry-out
    gradient; then ``V̄ = Ū``, ``q̄ = −c·Ū``, ``r̄ = local̄ = Q̄ + c·Ū``, ``boot̄ = γ(1−k)tr·r̄`` where
    read, and ``c̄_t = Ū_t·(local_t − q_t) + Ū_t·g_t·W_{t+1} = Ū_t·(Q_t − q_t)``, which reaches the
    log-probabilities through the ratio where it is not clipped (``torch.clamp``'s convention).
    ``U_{T−1}`` is the window-end carry's gradient.
    """
    p, q_out = a.p, out0
    dt, m, N, dev = a.dt, a.m, a.N, a.dev
    k, tr = a.flag("terminated"), a.flag("truncated")
    g_q = a.grad(grads[0])
    g_carry = grads[1] if len(grads) > 1 and grads[1] is not None else None
    ratio = torch.exp(a.load("target_log_probs") - a.load("log_probs"))
    unclipped = ratio <= p.c_bar
    _, c, _ = weights(ratio, p.lam, None, p.c_bar, None)
    gn = p.gamma * (1.0 - k) * (1.0 - tr)
    beta = gn * c
    if m is not None:
        beta = torch.where(m, beta, 1.0)
    w0 = g_carry.to(dt) if g_carry is not None else torch.zeros(N, dtype=dt, device=dev)
    u = a.scan(gn * g_q, beta, False, w0)
    u_bar = torch.cat([w0.unsqueeze(-1), u[..., :-1]], dim=-1)  # Ū_t = ∂L/∂W_t
    c_bar = u_bar * (q_out.detach().to(dt) - a.load("q_values"))
    ratio_bar = torch.where(unclipped, p.lam * c_bar * ratio, 0)  # no 0·inf where the clip is active
    out = {"rewards": a.zero(g_q + c * u_bar), "values": a.zero(u_bar), "q_values": a.zero(-c * u_bar),
           "target_log_probs": a.zero(ratio_bar), "log_probs": a.zero(-ratio_bar)}
    a.boundary_grads(out, u[..., -1], out["rewards"])
    return a.result(out)
