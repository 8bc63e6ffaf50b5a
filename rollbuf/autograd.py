"""Gradients.

* The affine scan has an analytic backward (:class:`AffineScanFunction`): for
  ``y_t = α_t + β_t·y_{t−1}`` the adjoint ``g_t = ȳ_t + β_{t+1}·g_{t+1}`` is the same scan run the
  other way with ``β`` shifted by one step, and ``ᾱ = g``, ``β̄_t = g_t·y_{t−1}``, ``ȳ_{−1} = β_0·g_0``.
  Autograd records one node per scan, not the blocked scan's inner steps.
* The ``torch`` backend is differentiable as it stands: elementwise coefficient and epilogue code
  under autograd, the scans through :class:`AffineScanFunction`.
* A call of the fused kernel with inputs that require grad goes through :class:`KernelFunction`:
  the forward is the kernel; the backward is an analytic adjoint per family, with no forward
  recompute: the TD(λ) family (:func:`lambda_backward`: one fused kernel, family
  ``lambda_adjoint``), the forward estimators (:func:`trace_backward`: one backward scan on the
  fused kernel and two elementwise passes), Retrace and V-trace (:func:`retrace_backward`,
  :func:`vtrace_backward`: their ``β`` reads the clipped ratios, so they need the forward state,
  which their saved first output carries; one forward adjoint scan on the fused kernel and
  elementwise passes). The generic path (``_backward``: recompute the elementwise parts with the
  torch backend under autograd, both scans on the fused kernel) is left for empty rows.

Clipped importance ratios (V-trace's ``ρ``, ``c``; Retrace's ``c``) are differentiated as
``torch.clamp`` does: zero gradient where the clip is active.
"""

from __future__ import annotations

import contextvars

import attrs
import torch
from torch.autograd.function import once_differentiable

from rollbuf.boundary import coefficients as C
from rollbuf.problem import Problem

# True inside KernelFunction.backward: the torch backend's scans then run on the fused kernel.
_FUSED_SCAN: contextvars.ContextVar = contextvars.ContextVar("rollbuf_fused_scan", default=False)


def _scan(alpha, beta, reverse, initial):
    """The scan itself: the fused kernel inside a triton backward, else the blocked torch scan."""
    if torch.compiler.is_compiling() or not _FUSED_SCAN.get():
        from rollbuf.vectorized import affine_scan_torch

        return affine_scan_torch(alpha, beta, reverse, initial)
    from rollbuf import kernels

    lead, T = alpha.shape[:-1], alpha.shape[-1]
    if T == 0 or alpha.numel() == 0:  # nothing to scan (and no row to reshape to)
        return torch.empty(alpha.shape, dtype=alpha.dtype, device=alpha.device)
    p = Problem(family="affine", outputs=("y", "final"),
                fields={"x": alpha.reshape(-1, T), "values": beta.reshape(-1, T)},
                carry=initial.reshape(-1).contiguous(), compute_dtype=alpha.dtype,
                out_dtype=alpha.dtype, reverse=reverse)
    return kernels.run(p)[0][0].reshape(*lead, T)


class AffineScanFunction(torch.autograd.Function):
    """``y = affine_scan(α, β, reverse, initial)`` with the adjoint scan as its backward."""

    @staticmethod
    def forward(ctx, alpha, beta, initial, reverse):
        y = _scan(alpha, beta, reverse, initial)
        ctx.save_for_backward(beta, y, initial)
        ctx.reverse = reverse
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        beta, y, init = ctx.saved_tensors
        if y.shape[-1] == 0:
            return torch.zeros_like(y), torch.zeros_like(beta), torch.zeros_like(init), None
        zero = torch.zeros_like(beta[..., :1])
        if not ctx.reverse:  # y_t = a_t + b_t·y_{t−1}: the adjoint runs backward in time
            g = _scan(gy, torch.cat([beta[..., 1:], zero], -1), True, torch.zeros_like(init))
            y_before = torch.cat([init.unsqueeze(-1).to(y.dtype), y[..., :-1]], -1)
            d_init = beta[..., 0] * g[..., 0]
        else:  # y_t = a_t + b_t·y_{t+1}: the adjoint runs forward in time
            g = _scan(gy, torch.cat([zero, beta[..., :-1]], -1), False, torch.zeros_like(init))
            y_before = torch.cat([y[..., 1:], init.unsqueeze(-1).to(y.dtype)], -1)
            d_init = beta[..., -1] * g[..., -1]
        return g, g * y_before, d_init.to(init.dtype), None


def affine_scan(alpha, beta, reverse, initial):
    """Differentiable affine scan along the last dim (``initial``: ``y`` just outside the row)."""
    if torch.is_grad_enabled() and (alpha.requires_grad or beta.requires_grad or initial.requires_grad):
        return AffineScanFunction.apply(alpha, beta, initial, reverse)
    return _scan(alpha, beta, reverse, initial)

DIFFERENTIABLE = ("rewards", "values", "bootstrap_values", "log_probs", "target_log_probs", "q_values", "x")


def needs_grad(p: Problem) -> bool:
    if not torch.is_grad_enabled():
        return False
    if p.carry is not None and p.carry.requires_grad:
        return True
    f = p.fields
    for k in DIFFERENTIABLE:
        t = f.get(k)
        if t is not None and t.requires_grad:
            return True
    return False


class KernelFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p: Problem, names: tuple, *tensors):
        from rollbuf import kernels

        ctx.p, ctx.names = p, names
        outs, carry = kernels.run(p)
        ctx.n_out = len(outs)
        # the adjoints of Retrace and V-trace read their first output (Q; vs): kept, not recomputed
        keep = (outs[0],) if p.family in ("retrace", "vtrace") else ()
        ctx.save_for_backward(*tensors, *keep)
        return tuple(outs) + ((carry,) if carry is not None else ())

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        token = _FUSED_SCAN.set(True)
        try:
            if ctx.p.family == "lambda" and ctx.p.main.shape[-1] > 0:
                return (None, None, *lambda_backward(ctx.p, ctx.names, saved, grads))
            if ctx.p.family == "trace" and ctx.p.main.shape[1] > 0:
                return (None, None, *trace_backward(ctx.p, ctx.names, saved, grads))
            if ctx.p.family in ("retrace", "vtrace"):
                saved, out0 = saved[:-1], saved[-1]
                if ctx.p.main.shape[-1] > 0:
                    fn = retrace_backward if ctx.p.family == "retrace" else vtrace_backward
                    return (None, None, *fn(ctx.p, ctx.names, saved, out0, grads))
            return KernelFunction._backward(ctx, saved, grads)
        finally:
            _FUSED_SCAN.reset(token)

    @staticmethod
    def _backward(ctx, saved, grads):
        from rollbuf import vectorized

        with torch.enable_grad():
            xs = [t.detach().requires_grad_(t.requires_grad) for t in saved]
            fields = dict(ctx.p.fields)
            carry = ctx.p.carry
            for name, x in zip(ctx.names, xs):
                if name == "carry":
                    carry = x
                else:
                    fields[name] = x
            outs, c = vectorized.run(attrs.evolve(ctx.p, fields=fields, carry=carry))
            res = list(outs) + ([c] if c is not None else [])
            pairs = [(r, g.to(r.dtype)) for r, g in zip(res, grads) if g is not None and r.requires_grad]
            want = [x for x in xs if x.requires_grad]
            got = torch.autograd.grad([r for r, _ in pairs], want, [g for _, g in pairs], allow_unused=True) \
                if pairs and want else [None] * len(want)
        it = iter(got)
        out = [next(it) if x.requires_grad else None for x in xs]
        return (None, None, *out)


def lambda_backward(p: Problem, names, saved, grads):
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
    from rollbuf import vectorized as V

    dt = p.compute_dtype
    f = dict(p.fields)
    for name, x in zip(names, saved):
        if name != "carry":
            f[name] = x
    r = f["rewards"]
    N, T = r.shape[0], r.shape[-1]
    m = V._flag(p, "mask")
    n_out = len(p.outputs)
    two = p.outputs == ("advantages", "returns")
    g_adv, g_ret = (grads[0], grads[1]) if two else (None, grads[0])
    g_carry = grads[n_out] if len(grads) > n_out and grads[n_out] is not None else None
    w0 = g_carry.to(dt) if g_carry is not None else None
    has_v = "values" in names

    def flag(name):
        x = V._flag(p, name)
        if x is None:
            return torch.zeros((), dtype=dt, device=r.device)
        return (x if m is None else x & m).to(dt)

    k, tr = flag("terminated"), flag("truncated")
    if _FUSED_SCAN.get() and not torch.compiler.is_compiling():
        # one fused kernel: reads the output gradients and flags, writes r̄, V̄ and W_T (0 at masked
        # steps, which it never reads); Ḡ = ḡ_G + ḡ_A is formed in registers
        from rollbuf import kernels

        if g_ret is None and g_adv is None:
            g_ret = torch.zeros((N, T), dtype=dt, device=r.device)
        if g_ret is None:  # Ḡ = ḡ_A: pass it as ḡ_G with ḡ_A = 0, and subtract it from V̄ below
            g_ret, g_adv, adv_only = g_adv, None, True
        else:
            adv_only = False
        fields = {"rewards": g_ret, "values": g_adv, "terminated": p.fields.get("terminated"),
                  "truncated": p.fields.get("truncated"), "mask": p.fields.get("mask")}
        q = Problem(family="lambda_adjoint", outputs=("rewards", "values") if has_v else ("rewards",),
                    fields=fields, gamma=p.gamma, lam=p.lam, carry=w0, compute_dtype=dt, out_dtype=dt)
        outs, w_end = kernels.run(q)
        r_bar = outs[0]
        out = {"rewards": r_bar}
        if has_v:
            v_bar = outs[1]
            if adv_only:
                v_bar = v_bar - g_ret.to(dt)
                v_bar = torch.where(m, v_bar, 0) if m is not None else v_bar
            out["values"] = v_bar
    else:
        zero = torch.zeros((N, T), dtype=dt, device=r.device)
        g_adv = None if g_adv is None else g_adv.to(dt)
        g_bar = (g_ret.to(dt) if g_ret is not None else zero) + (g_adv if g_adv is not None else 0.0)
        if m is not None:  # outputs are 0 at masked steps: no gradient flows from there
            g_bar = torch.where(m, g_bar, 0)
            g_adv = None if g_adv is None else torch.where(m, g_adv, 0)
        alpha, beta = C.lambda_adjoint_step(g_bar, k, tr, p.gamma, p.lam)
        beta = beta * torch.ones_like(g_bar)
        if m is not None:
            beta = torch.where(m, beta, 1.0)
        w0 = w0 if w0 is not None else torch.zeros(N, dtype=dt, device=r.device)
        u = _scan(alpha, beta, False, w0)
        w = torch.cat([w0.unsqueeze(-1), u[..., :-1]], dim=-1)  # W_t = ∂L/∂Z_t
        w_end = u[..., -1]  # W_T: the window-end carry's gradient
        r_bar, v_bar = C.lambda_adjoint_out(g_bar, g_adv if g_adv is not None else 0.0, p.lam, w)
        if m is not None:
            r_bar = torch.where(m, r_bar, 0)
            v_bar = torch.where(m, v_bar, 0)
        out = {"rewards": r_bar}
        if has_v:
            out["values"] = v_bar
    want = [(n, x) for n, x in zip(names, saved) if n in ("bootstrap_values", "carry") and x.requires_grad]
    if want:  # bootstrap values enter at truncated steps and through the window-end carry
        with torch.enable_grad():
            leaves = {n: x.detach().requires_grad_() for n, x in want}
            fields = dict(p.fields, **{n: x for n, x in leaves.items() if n != "carry"})
            q = attrs.evolve(p, fields=fields, carry=leaves.get("carry", p.carry))
            boot = V._read_bootstrap(q, dt, m)
            z_end = V._window_end_carry(q, dt, m)
            terms = [(z_end * w_end).sum()]
            if boot.requires_grad:
                terms.append((boot * (p.gamma * (1.0 - k) * tr) * r_bar).sum())
            got = torch.autograd.grad(sum(terms), list(leaves.values()), allow_unused=True)
        out.update({n: g for n, g in zip(leaves, got)})
    res = []
    for name, x in zip(names, saved):
        g = out.get(name)
        res.append(None if g is None or not x.requires_grad else g.to(x.dtype))
    return res


def trace_backward(p: Problem, names, saved, grads):
    """The analytic adjoint of the forward estimators (eligibility traces, episodic sums).

    ``F_t = nd_t·x_t + d·nd_t·F_{t−1}`` (``d`` the decay; masked steps the identity) and
    ``e_t = x_t + d·F_{t−1}``, ``final = F_{T−1}``, linear in ``x`` with coefficients free of it. With
    ``ē`` (0 at masked steps) and ``f̄``, ``Y_t = ∂L/∂F_{t−1}`` is one *backward* scan
    ``Y_t = d·ē_t + β_t·Y_{t+1}``, ``Y_T = f̄`` (``β = d·nd``, 1 where masked); then
    ``x̄_t = ē_t + nd_t·Y_{t+1}`` at unmasked steps and ``∂/∂initial = Y_0``. No forward recompute;
    the scan runs on the fused kernel inside a triton backward.
    """
    from rollbuf import vectorized as V

    dt = p.compute_dtype
    x = p.fields["x"]
    N, T = x.shape[0], x.shape[1]
    feat = tuple(x.shape[2:])
    lift = (N,) + (1,) * len(feat) + (T,)
    g_e = grads[0]
    g_e = torch.zeros(x.shape, dtype=dt, device=x.device) if g_e is None else g_e.to(dt)
    g_e = g_e.movedim(1, -1)  # [N, *F, T]
    g_f = grads[1] if len(grads) > 1 and grads[1] is not None else None
    g_f = torch.zeros((N, *feat), dtype=dt, device=x.device) if g_f is None else g_f.to(dt)
    m = V._flag(p, "mask")

    def flag(name):
        f = V._flag(p, name)
        if f is None:
            return torch.zeros((), dtype=dt, device=x.device)
        return (f if m is None else f & m).to(dt).reshape(lift)

    nd = (1.0 - flag("terminated")) * (1.0 - flag("truncated"))
    live = None if m is None else m.reshape(lift)
    if live is not None:
        g_e = torch.where(live, g_e, 0)
    alpha = p.decay * g_e
    beta = (p.decay * nd) * torch.ones_like(g_e)
    if live is not None:
        beta = torch.where(live, beta, 1.0)
    y = _scan(alpha, beta, True, g_f)
    y_next = torch.cat([y[..., 1:], g_f.unsqueeze(-1)], dim=-1)
    g_x = g_e + nd * y_next
    if live is not None:
        g_x = torch.where(live, g_x, 0)
    out = {"x": g_x.movedim(-1, 1), "carry": y[..., 0]}
    return [None if not t.requires_grad else out[n].to(t.dtype) for n, t in zip(names, saved)]


def retrace_backward(p: Problem, names, saved, q_out, grads):
    """The analytic adjoint of Retrace, from its inputs and its output ``Q`` (no forward recompute).

    ``W_t = V_t + c_t(local_t − q_t) + g_t·c_t·W_{t+1}`` and ``Q_t = local_t + g_t·W_{t+1}``
    (``g = γ·nd``, ``c = λ·min(ratio, c̄)``). With ``Q̄`` and ``Ū_t = ∂L/∂W_t``: ``U_t = Ū_{t+1} =
    g_t·Q̄_t + g_t·c_t·U_{t−1}`` is one forward scan (masked steps the identity) from the carry-out
    gradient; then ``V̄ = Ū``, ``q̄ = −c·Ū``, ``r̄ = local̄ = Q̄ + c·Ū``, ``boot̄ = γ(1−k)tr·r̄`` where
    read, and ``c̄_t = Ū_t·(local_t − q_t) + Ū_t·g_t·W_{t+1} = Ū_t·(Q_t − q_t)``, which reaches the
    log-probabilities through the ratio where it is not clipped (``torch.clamp``'s convention).
    ``U_{T−1}`` is the window-end carry's gradient.
    """
    from rollbuf import vectorized as V

    dt = p.compute_dtype
    f = dict(p.fields)
    for name, x in zip(names, saved):
        if name != "carry":
            f[name] = x
    r = f["rewards"]
    N, T = r.shape[0], r.shape[-1]
    m = V._flag(p, "mask")

    def flag(name):
        x = V._flag(p, name)
        if x is None:
            return torch.zeros((), dtype=dt, device=r.device)
        return (x if m is None else x & m).to(dt)

    def load(name):
        x = f[name].detach().to(dt)
        return x if m is None else torch.where(m, x, 0)

    k, tr = flag("terminated"), flag("truncated")
    g_q = grads[0]
    g_q = torch.zeros((N, T), dtype=dt, device=r.device) if g_q is None else g_q.to(dt)
    g_carry = grads[1] if len(grads) > 1 and grads[1] is not None else None
    if m is not None:
        g_q = torch.where(m, g_q, 0)
    ratio = torch.exp(load("target_log_probs") - load("log_probs"))
    unclipped = ratio <= p.c_bar
    c = p.lam * torch.where(unclipped, ratio, p.c_bar)
    gn = p.gamma * (1.0 - k) * (1.0 - tr)
    alpha = gn * g_q
    beta = gn * c
    if m is not None:
        beta = torch.where(m, beta, 1.0)
    w0 = g_carry.to(dt) if g_carry is not None else torch.zeros(N, dtype=dt, device=r.device)
    u = _scan(alpha, beta, False, w0)
    u_bar = torch.cat([w0.unsqueeze(-1), u[..., :-1]], dim=-1)  # Ū_t = ∂L/∂W_t
    w_end = u[..., -1]
    qv = load("q_values")
    local_bar = g_q + c * u_bar
    c_bar = u_bar * (q_out.detach().to(dt) - qv)
    ratio_bar = torch.where(unclipped, p.lam * c_bar, 0) * ratio
    zero = (lambda x: torch.where(m, x, 0)) if m is not None else (lambda x: x)
    out = {"rewards": zero(local_bar), "values": zero(u_bar), "q_values": zero(-c * u_bar),
           "target_log_probs": zero(ratio_bar), "log_probs": zero(-ratio_bar)}
    want = [(n, x) for n, x in zip(names, saved) if n in ("bootstrap_values", "carry") and x.requires_grad]
    if want:  # bootstrap values enter at truncated steps and through the window-end carry
        with torch.enable_grad():
            leaves = {n: x.detach().requires_grad_() for n, x in want}
            fields = dict(p.fields, **{n: x for n, x in leaves.items() if n != "carry"})
            q = attrs.evolve(p, fields=fields, carry=leaves.get("carry", p.carry))
            boot = V._read_bootstrap(q, dt, m)
            z_end = V._window_end_carry(q, dt, m)
            terms = [(z_end * w_end).sum()]
            if boot.requires_grad:
                terms.append((boot * (p.gamma * (1.0 - k) * tr) * out["rewards"]).sum())
            got = torch.autograd.grad(sum(terms), list(leaves.values()), allow_unused=True)
        out.update({n: g for n, g in zip(leaves, got)})
    return [None if not x.requires_grad or out.get(n) is None else out[n].to(x.dtype)
            for n, x in zip(names, saved)]


def _next_live(x, m, carry):
    """For every step, ``x`` at the next unmasked step (``carry`` past the last one)."""
    if m is None:
        return torch.cat([x[..., 1:], carry.unsqueeze(-1)], dim=-1)
    y = _scan(torch.where(m, x, 0), torch.where(m, 0.0, 1.0).to(x.dtype), True, carry)
    return torch.cat([y[..., 1:], carry.unsqueeze(-1)], dim=-1)


def _prev_live(x, m, initial):
    """For every step, ``x`` at the previous unmasked step (``initial`` before the first one), and
    ``x`` at the last unmasked step (``initial`` if none)."""
    if m is None:
        return torch.cat([initial.unsqueeze(-1), x[..., :-1]], dim=-1), x[..., -1]
    y = _scan(torch.where(m, x, 0), torch.where(m, 0.0, 1.0).to(x.dtype), False, initial)
    return torch.cat([initial.unsqueeze(-1), y[..., :-1]], dim=-1), y[..., -1]


def vtrace_backward(p: Problem, names, saved, vs_out, grads):
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
    from rollbuf import vectorized as V

    dt = p.compute_dtype
    f = dict(p.fields)
    for name, x in zip(names, saved):
        if name != "carry":
            f[name] = x
    r0 = f["rewards"]
    N, T = r0.shape[0], r0.shape[-1]
    dev = r0.device
    m = V._flag(p, "mask")
    zero = (lambda x: torch.where(m, x, 0)) if m is not None else (lambda x: x)

    def flag(name):
        x = V._flag(p, name)
        if x is None:
            return torch.zeros((), dtype=dt, device=dev)
        return (x if m is None else x & m).to(dt)

    def load(name):
        return zero(f[name].detach().to(dt))

    def grad(i):
        g = grads[i] if len(grads) > i else None
        return torch.zeros((N, T), dtype=dt, device=dev) if g is None else zero(g.to(dt))

    k, tr = flag("terminated"), flag("truncated")
    g_vs, g_pg = grad(0), grad(1)
    g_c = grads[2] if len(grads) > 2 and grads[2] is not None else torch.zeros((N, 2), dtype=dt, device=dev)
    g_cu, g_cv = g_c[..., 0].to(dt), g_c[..., 1].to(dt)
    v = load("values")
    q0 = attrs.evolve(p, fields={**p.fields, **{n: f[n].detach() for n in f if isinstance(f[n], torch.Tensor)}},
                      carry=None if p.carry is None else p.carry.detach())
    boot = V._read_bootstrap(q0, dt, m)
    local = load("rewards") + p.gamma * (1.0 - k) * tr * boot
    ratio = torch.exp(load("target_log_probs") - load("log_probs"))
    rho = torch.clamp(ratio, max=p.rho_bar)
    c = p.lam * torch.clamp(ratio, max=p.c_bar)
    rpg = torch.clamp(ratio, max=p.pg_rho_bar)
    gn = p.gamma * (1.0 - k) * (1.0 - tr)
    carry_in = V._window_end_carry(q0, dt, m)
    cu, cv = carry_in[..., 0], carry_in[..., 1]
    v_next = _next_live(v, m, cv)
    u_next = _next_live(zero(vs_out.detach().to(dt) - v), m, cu)
    pc = gn * c
    alpha = pc * g_vs + rpg * gn * g_pg
    beta = torch.where(m, pc, 1.0) if m is not None else pc * torch.ones_like(alpha)
    y = _scan(alpha, beta, False, g_cu)
    u_bar = zero(g_vs + torch.cat([g_cu.unsqueeze(-1), y[..., :-1]], dim=-1))
    du_end = y[..., -1]
    e = zero(gn * (rho * u_bar + rpg * g_pg))
    e_prev, dv_end = _prev_live(e, m, g_cv)
    local_bar = rho * u_bar + rpg * g_pg
    d_rho = u_bar * (local - v + gn * v_next)
    d_c = p.lam * u_bar * gn * u_next
    d_pg = g_pg * (local + gn * (v_next + u_next) - v)
    d_ratio = (torch.where(ratio <= p.rho_bar, d_rho, 0) + torch.where(ratio <= p.c_bar, d_c, 0)
               + torch.where(ratio <= p.pg_rho_bar, d_pg, 0)) * ratio
    out = {"rewards": zero(local_bar), "values": zero(g_vs - rho * u_bar - rpg * g_pg + e_prev),
           "target_log_probs": zero(d_ratio), "log_probs": zero(-d_ratio)}
    want = [(n, x) for n, x in zip(names, saved) if n in ("bootstrap_values", "carry") and x.requires_grad]
    if want:  # bootstrap values enter at truncated steps and through the window-end carry (0, V(s_T))
        with torch.enable_grad():
            leaves = {n: x.detach().requires_grad_() for n, x in want}
            fields = dict(q0.fields, **{n: x for n, x in leaves.items() if n != "carry"})
            q = attrs.evolve(q0, fields=fields, carry=leaves.get("carry", q0.carry))
            b = V._read_bootstrap(q, dt, m)
            z_end = V._window_end_carry(q, dt, m)
            terms = [(z_end[..., 0] * du_end).sum() + (z_end[..., 1] * dv_end).sum()]
            if b.requires_grad:
                terms.append((b * (p.gamma * (1.0 - k) * tr) * out["rewards"]).sum())
            got = torch.autograd.grad(sum(terms), list(leaves.values()), allow_unused=True)
        out.update({n: g for n, g in zip(leaves, got)})
    return [None if not x.requires_grad or out.get(n) is None else out[n].to(x.dtype)
            for n, x in zip(names, saved)]


def run(p: Problem):
    """:func:`rollbuf.kernels.run` with gradients (same return convention)."""
    names, tensors = [], []
    for k in DIFFERENTIABLE:
        t = p.fields.get(k)
        if t is not None:
            names.append(k)
            tensors.append(t)
    if p.carry is not None:
        names.append("carry")
        tensors.append(p.carry)
    res = KernelFunction.apply(p, tuple(names), *tensors)
    n = len([o for o in p.outputs if o != "final"]) + (1 if "final" in p.outputs else 0)
    outs = tuple(res[:n])
    carry = res[n] if len(res) > n else None
    return outs, carry
