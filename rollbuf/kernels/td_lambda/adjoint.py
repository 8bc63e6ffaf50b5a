"""The TD(λ) family's analytic adjoint (``a``: the call, :class:`rollbuf.backends.autograd.Adjoint`)."""

import torch

from rollbuf.kernels.td_lambda import coefficients as C
from rollbuf.problem import Family, Problem


def backward(a, grads, out0=None):
    """The analytic adjoint of the TD(λ) family (GAE, TD(λ), discounted returns): no recompute.

    The outputs are linear in the inputs and ``β_t = γλ·nd_t`` reads none of them, so the backward
    needs no forward state. With ``Ḡ_t`` the gradient reaching ``G_t`` (``ḡ_A + ḡ_G`` for GAE) and
    ``W_t = ∂L/∂Z_t``: ``Z_{t+1}`` feeds ``G_t`` (weight ``c_t = γ·nd_t``) and ``Z_t`` (weight
    ``β_t = λc_t``), so ``U_t = W_{t+1} = c_t·Ḡ_t + β_t·U_{t−1}`` is one *forward* affine scan
    (masked steps the identity) started from the gradient of the carry out, ``W_0``. Then
    ``r̄ = Ḡ + λW``, ``V̄ = (1−λ)W − ḡ_A``, ``boot̄ = r̄·γ(1−k)tr`` where a truncated step reads it, and
    ``W_T = U_{T−1}`` goes to the window-end carry (``bootstrap_values`` at the window end, or
    ``carry``). Inside a triton backward this is one fused kernel (family ``lambda_adjoint``:
    output gradients and flags read once, ``r̄``, ``V̄`` and ``W_T`` written once) plus the
    bootstrap terms; otherwise the same arithmetic (:func:`~rollbuf.boundary.coefficients.lambda_adjoint_step`,
    :func:`~rollbuf.boundary.coefficients.lambda_adjoint_out`) in torch around one scan.
    """
    p, names, fused = a.p, a.names, a.fused
    dt, m, N, T, dev = a.dt, a.m, a.N, a.T, a.dev
    n_out = len(p.outputs)
    named = dict(zip(p.outputs, grads, strict=False))  # grads: the outputs, then the carry out
    g_adv, g_ret = named.get("advantages"), named.get("returns")
    g_carry = grads[n_out] if len(grads) > n_out and grads[n_out] is not None else None
    w0 = g_carry.to(dt) if g_carry is not None else None
    has_v = "values" in names
    if fused and not torch.compiler.is_compiling():
        # one fused kernel: reads the output gradients and flags, writes r̄, V̄ and W_T (0 at masked
        # steps, which it never reads); Ḡ = ḡ_G + ḡ_A is formed in registers
        from rollbuf import kernels  # the package is built on this module: imported when called

        if g_ret is None and g_adv is None:
            g_ret = torch.zeros((N, T), dtype=dt, device=dev)
        adv_only = g_ret is None
        if adv_only:  # Ḡ = ḡ_A: pass it as ḡ_G with ḡ_A = 0, and subtract it from V̄ below
            g_ret, g_adv = g_adv, None
        assert g_ret is not None  # Ḡ: ḡ_G, or ḡ_A in its place
        fields = {"grad_returns": g_ret, "grad_advantages": g_adv, "terminated": p.fields.get("terminated"),
                  "truncated": p.fields.get("truncated"), "mask": p.fields.get("mask")}
        q = Problem(family=Family.TD_LAMBDA_ADJOINT, outputs=("rewards", "values") if has_v else ("rewards",),
                    fields=fields, gamma=p.gamma, lam=p.lam, carry=w0, compute_dtype=dt, out_dtype=dt)
        outs, w_end = kernels.run(q)
        out = {"rewards": outs[0]}
        if has_v:
            out["values"] = a.zero(outs[1] - g_ret.to(dt)) if adv_only else outs[1]
    else:
        k, tr = a.flag("terminated"), a.flag("truncated")
        g_adv = None if g_adv is None else a.grad(g_adv)
        g_bar = a.grad(g_ret) + (g_adv if g_adv is not None else 0.0)
        alpha, beta = C.lambda_adjoint_step(g_bar, k, tr, p.gamma, p.lam)
        beta = beta * torch.ones_like(g_bar)
        if m is not None:
            beta = torch.where(m, beta, 1.0)
        w0 = w0 if w0 is not None else torch.zeros(N, dtype=dt, device=dev)
        u = a.scan(alpha, beta, False, w0)
        w = torch.cat([w0.unsqueeze(-1), u[..., :-1]], dim=-1)  # W_t = ∂L/∂Z_t
        w_end = u[..., -1]  # W_T: the window-end carry's gradient
        r_bar, v_bar = C.lambda_adjoint_out(g_bar, g_adv if g_adv is not None else 0.0, p.lam, w)
        out = {"rewards": a.zero(r_bar)}
        if has_v:
            out["values"] = a.zero(v_bar)
    a.boundary_grads(out, w_end, out["rewards"])
    return a.result(out)
