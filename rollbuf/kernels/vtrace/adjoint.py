"""V-trace's analytic adjoint (``a``: the call, :class:`rollbuf.backends.autograd.Adjoint`)."""

import torch

from rollbuf.boundary.coefficients import rebind
from rollbuf.kernels.vtrace.coefficients import truncated_weights

# the adjoints' clip: torch.clamp's (a NaN ratio NaN, an overflowed one the bar); None for a None bar
weights = rebind(truncated_weights, clip=lambda ratio, bar: None if bar is None else torch.clamp(ratio, max=bar))


def _next_live(a, x, m, carry):
    """For every step, ``x`` at the next unmasked step (``carry`` past the last one)."""
    if m is None:
        return torch.cat([x[..., 1:], carry.unsqueeze(-1)], dim=-1)
    y = a.scan(torch.where(m, x, 0), torch.where(m, 0.0, 1.0).to(x.dtype), True, carry)
    return torch.cat([y[..., 1:], carry.unsqueeze(-1)], dim=-1)


def _prev_live(a, x, m, initial):
    """For every step, ``x`` at the previous unmasked step (``initial`` before the first one), and
    ``x`` at the last unmasked step (``initial`` if none)."""
    if m is None:
        return torch.cat([initial.unsqueeze(-1), x[..., :-1]], dim=-1), x[..., -1]
    y = a.scan(torch.where(m, x, 0), torch.where(m, 0.0, 1.0).to(x.dtype), False, initial)
    return torch.cat([initial.unsqueeze(-1), y[..., :-1]], dim=-1), y[..., -1]


def backward(a, grads, out0):
    """The analytic adjoint of V-trace, from its inputs and its output ``vs`` (no forward recompute).

    Over the unmasked steps (``t⁺`` the next one): ``u_t = ρ_t(local_t − V_t) + g_t(ρ_t·V_{t⁺} +
    c_t·u_{t⁺})``, ``vs = V + u``, ``pg = ρpg·(local + g(V_{t⁺} + u_{t⁺}) − V)`` (``g = γ·nd``). With
    ``Y_t = ∂L/∂u_{t⁺}`` seen from step t: ``Y_t = g_t·c_t·(v̄s_t + Y_{t⁻}) + ρpg_t·g_t·p̄g_t`` is one
    forward scan from the carry-out gradient, ``Ū_t = v̄s_t + Y_{t⁻}``; the value gradient
    ``E_t = g_t·(ρ_t·Ū_t + ρpg_t·p̄g_t)`` moves to the next unmasked step. The ratio's gradient adds
    ``Ū·(local − V + g·V_{t⁺})`` (through ρ), ``λ·Ū·g·u_{t⁺}`` (through c) and ``p̄g·pg/ρpg`` (through
    ρpg) where each is not clipped. ``V_{t⁺}`` and ``u_{t⁺} = (vs − V)_{t⁺}`` are shifts of the
    inputs and the saved output (scans over the mask when there is one).
    """
    p, vs_out = a.p, out0
    dt, m, N, dev, zero = a.dt, a.m, a.N, a.dev, a.zero
    k, tr = a.flag("terminated"), a.flag("truncated")
    g_vs, g_pg = a.grad(grads[0]), a.grad(grads[1] if len(grads) > 1 else None)
    g_c = grads[2] if len(grads) > 2 and grads[2] is not None else torch.zeros((N, 2), dtype=dt, device=dev)
    g_cu, g_cv = g_c[..., 0].to(dt), g_c[..., 1].to(dt)
    v = a.load("values")
    read_bootstrap, carry_in = a.window()
    local = a.load("rewards") + p.gamma * (1.0 - k) * tr * read_bootstrap
    ratio = torch.exp(a.load("target_log_probs") - a.load("log_probs"))
    rho, c, rpg = weights(ratio, p.lam, p.rho_bar, p.c_bar, p.pg_rho_bar)
    gn = p.gamma * (1.0 - k) * (1.0 - tr)
    cu, cv = carry_in[..., 0], carry_in[..., 1]
    v_next = _next_live(a, v, m, cv)
    u_next = _next_live(a, zero(vs_out.detach().to(dt) - v), m, cu)
    pc = gn * c
    alpha = pc * g_vs + rpg * gn * g_pg
    beta = torch.where(m, pc, 1.0) if m is not None else pc  # [N, T]: c is per step
    y = a.scan(alpha, beta, False, g_cu)
    u_bar = zero(g_vs + torch.cat([g_cu.unsqueeze(-1), y[..., :-1]], dim=-1))
    local_bar = rho * u_bar + rpg * g_pg
    e_prev, dv_end = _prev_live(a, zero(gn * local_bar), m, g_cv)
    d_rho = u_bar * (local - v + gn * v_next)
    d_c = p.lam * u_bar * gn * u_next
    d_pg = g_pg * (local + gn * (v_next + u_next) - v)
    d_ratio = (torch.where(ratio <= p.rho_bar, d_rho * ratio, 0) + torch.where(ratio <= p.c_bar, d_c * ratio, 0)
               + torch.where(ratio <= p.pg_rho_bar, d_pg * ratio, 0))  # no 0·inf where a clip is active
    out = {"rewards": zero(local_bar), "values": zero(g_vs - local_bar + e_prev),
           "target_log_probs": zero(d_ratio), "log_probs": zero(-d_ratio)}
    a.boundary_grads(out, torch.stack([y[..., -1], dv_end], -1), out["rewards"])
    return a.result(out)
