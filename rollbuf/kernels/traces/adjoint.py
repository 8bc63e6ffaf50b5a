"""The forward estimators' analytic adjoint (``a``: the call, :class:`rollbuf.backends.autograd.Adjoint`)."""

import torch


def backward(a, grads, out0=None):
    """The analytic adjoint of the forward estimators (eligibility traces, episodic sums).

    ``F_t = nd_t·x_t + d·nd_t·F_{t−1}`` (``d`` the decay; masked steps the identity) and
    ``e_t = x_t + d·F_{t−1}``, ``final = F_{T−1}``, linear in ``x`` with coefficients free of it. With
    ``ē`` (0 at masked steps) and ``f̄``, ``Y_t = ∂L/∂F_{t−1}`` is one *backward* scan
    ``Y_t = d·ē_t + β_t·Y_{t+1}``, ``Y_T = f̄`` (``β = d·nd``, 1 where masked); then
    ``x̄_t = ē_t + nd_t·Y_{t+1}`` at unmasked steps and ``∂/∂initial = Y_0``. No forward recompute;
    the scan runs on the fused kernel inside a triton backward.
    """
    p = a.p
    dt, N, T = a.dt, a.N, a.T
    x = a.f["x"]
    feat = tuple(x.shape[2:])
    lift = (N,) + (1,) * len(feat) + (T,)
    g_e = a.grad(grads[0], x.shape).movedim(1, -1)  # [N, *F, T], 0 at masked steps
    g_f = grads[1] if len(grads) > 1 else None  # final: one per row, no mask
    g_f = torch.zeros((N, *feat), dtype=dt, device=a.dev) if g_f is None else g_f.to(dt)
    k, tr = (x if x.dim() == 0 else x.reshape(lift) for x in (a.flag("terminated"), a.flag("truncated")))
    nd = (1.0 - k) * (1.0 - tr)
    live = None if a.m is None else a.m.reshape(lift)
    alpha = p.decay * g_e
    beta = (p.decay * nd) * torch.ones_like(g_e)
    if live is not None:
        beta = torch.where(live, beta, 1.0)
    y = a.scan(alpha, beta, True, g_f)
    g_x = g_e + nd * torch.cat([y[..., 1:], g_f.unsqueeze(-1)], dim=-1)
    if live is not None:
        g_x = torch.where(live, g_x, 0)
    return a.result({"x": g_x.movedim(-1, 1), "carry": y[..., 0]})
