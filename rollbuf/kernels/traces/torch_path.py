"""The forward family on the torch backend: its step maps and its outputs (``t``: the call,
:class:`rollbuf.backends.torch_backend.Loader`, which loads, scans and masks). ``x`` is scanned as
``[N, *F, T]``, the flags and ``β`` as ``[N, 1.., T]``."""

import torch

from rollbuf.kernels.traces.coefficients import trace_out, trace_step


def steps(t):
    """The own-step maps ``(α, β)`` of ``F_t = nd_t·e_t`` and ``x`` as scanned."""
    x = t.load("x").movedim(1, -1)  # [N, T, *F] -> [N, *F, T]
    lift = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)  # flags [N, T] -> [N, 1.., T]
    k, tr = t.flag("terminated", x), t.flag("truncated", x)
    k, tr = (f if f.dim() == 0 else f.reshape(lift) for f in (k, tr))
    alpha, beta = trace_step(x, k, tr, t.p.decay)
    return (alpha, torch.as_tensor(beta, dtype=t.dt, device=x.device).expand(lift)), dict(x=x)  # β: flags only


def outputs(t, elems, env):
    """The traces (sums) ``e_t = x_t + decay·F_{t−1}`` and ``final = F_{T−1}`` as the last output; no carry."""
    p, x = t.p, env["x"]
    init = torch.zeros(x.shape[:-1], dtype=t.dt, device=x.device) if p.carry is None else p.carry.to(t.dt)
    incl = t.scan(*elems, False, init)
    out = trace_out(x, p.decay, t.exclusive(incl, init, reverse=False))
    final = incl[..., -1] if incl.shape[-1] else init
    return (t.masked((out,))[0].movedim(-1, 1), final), None
