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


class _Adjoint:
    """What the analytic adjoints share: the call's fields with the saved tensors in place, the mask,
    clean flags and loads (0 at masked steps), the bootstrap/carry gradients, the result list."""

    def __init__(self, p: Problem, names, saved):
        from rollbuf import vectorized as V

        self.V, self.p, self.names, self.saved = V, p, names, saved
        self.dt = p.compute_dtype
        self.f = dict(p.fields)
        for name, x in zip(names, saved):
            if name != "carry":
                self.f[name] = x
        main = self.f["x" if p.family == "trace" else "rewards"]
        self.N, self.T, self.dev = main.shape[0], main.shape[1], main.device
        self.m = V._flag(p, "mask")

    def zero(self, x):
        """``x`` with its masked steps set to 0."""
        return x if self.m is None else torch.where(self.m.reshape(self.m.shape + (1,) * (x.dim() - 2)), x, 0)

    def flag(self, name):
        """A flag as 0/1 in the compute dtype, 0 at masked steps (a 0-d zero if absent)."""
        x = self.V._flag(self.p, name)
        if x is None:
            return torch.zeros((), dtype=self.dt, device=self.dev)
        return (x if self.m is None else x & self.m).to(self.dt)

    def load(self, name):
        return self.zero(self.f[name].detach().to(self.dt))

    def grad(self, g, shape=None):
        """An output gradient in the compute dtype (zeros if None), 0 at masked steps."""
        if g is None:
            return torch.zeros(shape or (self.N, self.T), dtype=self.dt, device=self.dev)
        return self.zero(g.to(self.dt))

    def boundary_grads(self, out, w_end, local_bar):
        """Gradients of ``bootstrap_values`` and ``carry``, added to ``out``, in closed form (no
        autograd graph: a handful of elementwise ops). Bootstrap values enter at truncated,
        unmasked, not terminated steps with weight ``γ`` times the local term's gradient
        ``local_bar``, and through the window-end carry, whose gradient is ``w_end`` (``[N]``, or
        ``[N, 2]`` = (u, V) for V-trace, whose window end feeds V). The window end is the rule of
        :func:`rollbuf.vectorized._window_end_carry`: an explicit ``carry`` takes ``w_end`` whole;
        otherwise ``V(s_T)`` is ``bootstrap_values`` at the last unmasked step (the last column of a
        row with none), not read where that step terminated, and absent for a terminal window end.
        """
        p = self.p
        want = {n for n, x in zip(self.names, self.saved) if n in ("bootstrap_values", "carry") and x.requires_grad}
        if not want:
            return
        if "carry" in want:
            out["carry"] = w_end
        if "bootstrap_values" not in want:
            return
        bv = self.f["bootstrap_values"]
        dt, T = self.dt, self.T
        tr = self.V._flag(p, "truncated")
        if tr is not None and not (p.family == "lambda" and p.no_bootstrap):
            k = self.V._flag(p, "terminated")
            read = tr if k is None else tr & ~k  # terminated wins
            read = read if self.m is None else read & self.m
            g = torch.where(read, local_bar, 0) * p.gamma  # on the 1-byte flags: no float copies
            g = g.sum(-1) if bv.dim() == 1 else g  # [N]: the window-end column only (validated)
        else:
            g = torch.zeros(bv.shape, dtype=dt, device=bv.device)
        if p.carry is not None or p.window_end == "terminal" or p.no_bootstrap or T == 0:
            out["bootstrap_values"] = g
            return
        # a terminated window end never reads V(s_T): no factor needed here, because every path
        # into the window-end carry passes the window end's continuation γ·(1−k)·(1−tr), so w_end
        # is already 0 there (tests: test_terminated_window_end_gets_no_bootstrap_gradient)
        w = w_end[..., 1] if p.family == "vtrace" else w_end
        if self.m is None:
            j = None  # the last column
        else:
            last = self.V.last_unmasked_index(self.m)
            j = torch.where(last >= 0, last, T - 1).unsqueeze(-1)
        if bv.dim() == 1:
            g = g + w
        elif j is None:
            g[..., -1] += w
        else:
            g = g.scatter_add(-1, j, w.unsqueeze(-1))
        out["bootstrap_values"] = g

    def result(self, out):
        return [None if not x.requires_grad or out.get(n) is None else out[n].to(x.dtype)
                for n, x in zip(self.names, self.saved)]


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
    a = _Adjoint(p, names, saved)
    dt, m, N, T, dev = a.dt, a.m, a.N, a.T, a.dev
    n_out = len(p.outputs)
    two = p.outputs == ("advantages", "returns")
    g_adv, g_ret = (grads[0], grads[1]) if two else (None, grads[0])
    g_carry = grads[n_out] if len(grads) > n_out and grads[n_out] is not None else None
    w0 = g_carry.to(dt) if g_carry is not None else None
    has_v = "values" in names
    if _FUSED_SCAN.get() and not torch.compiler.is_compiling():
        # one fused kernel: reads the output gradients and flags, writes r̄, V̄ and W_T (0 at masked
        # steps, which it never reads); Ḡ = ḡ_G + ḡ_A is formed in registers
        from rollbuf import kernels

        if g_ret is None and g_adv is None:
            g_ret = torch.zeros((N, T), dtype=dt, device=dev)
        adv_only = g_ret is None
        if adv_only:  # Ḡ = ḡ_A: pass it as ḡ_G with ḡ_A = 0, and subtract it from V̄ below
            g_ret, g_adv = g_adv, None
        fields = {"rewards": g_ret, "values": g_adv, "terminated": p.fields.get("terminated"),
                  "truncated": p.fields.get("truncated"), "mask": p.fields.get("mask")}
        q = Problem(family="lambda_adjoint", outputs=("rewards", "values") if has_v else ("rewards",),
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
        u = _scan(alpha, beta, False, w0)
        w = torch.cat([w0.unsqueeze(-1), u[..., :-1]], dim=-1)  # W_t = ∂L/∂Z_t
        w_end = u[..., -1]  # W_T: the window-end carry's gradient
        r_bar, v_bar = C.lambda_adjoint_out(g_bar, g_adv if g_adv is not None else 0.0, p.lam, w)
        out = {"rewards": a.zero(r_bar)}
        if has_v:
            out["values"] = a.zero(v_bar)
    a.boundary_grads(out, w_end, out["rewards"])
    return a.result(out)


def trace_backward(p: Problem, names, saved, grads):
    """The analytic adjoint of the forward estimators (eligibility traces, episodic sums).

    ``F_t = nd_t·x_t + d·nd_t·F_{t−1}`` (``d`` the decay; masked steps the identity) and
    ``e_t = x_t + d·F_{t−1}``, ``final = F_{T−1}``, linear in ``x`` with coefficients free of it. With
    ``ē`` (0 at masked steps) and ``f̄``, ``Y_t = ∂L/∂F_{t−1}`` is one *backward* scan
    ``Y_t = d·ē_t + β_t·Y_{t+1}``, ``Y_T = f̄`` (``β = d·nd``, 1 where masked); then
    ``x̄_t = ē_t + nd_t·Y_{t+1}`` at unmasked steps and ``∂/∂initial = Y_0``. No forward recompute;
    the scan runs on the fused kernel inside a triton backward.
    """
    a = _Adjoint(p, names, saved)
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
    y = _scan(alpha, beta, True, g_f)
    g_x = g_e + nd * torch.cat([y[..., 1:], g_f.unsqueeze(-1)], dim=-1)
    if live is not None:
        g_x = torch.where(live, g_x, 0)
    return a.result({"x": g_x.movedim(-1, 1), "carry": y[..., 0]})


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
    a = _Adjoint(p, names, saved)
    dt, m, N, dev = a.dt, a.m, a.N, a.dev
    k, tr = a.flag("terminated"), a.flag("truncated")
    g_q = a.grad(grads[0])
    g_carry = grads[1] if len(grads) > 1 and grads[1] is not None else None
    ratio = torch.exp(a.load("target_log_probs") - a.load("log_probs"))
    unclipped = ratio <= p.c_bar
    c = p.lam * torch.where(unclipped, ratio, p.c_bar)
    gn = p.gamma * (1.0 - k) * (1.0 - tr)
    beta = gn * c
    if m is not None:
        beta = torch.where(m, beta, 1.0)
    w0 = g_carry.to(dt) if g_carry is not None else torch.zeros(N, dtype=dt, device=dev)
    u = _scan(gn * g_q, beta, False, w0)
    u_bar = torch.cat([w0.unsqueeze(-1), u[..., :-1]], dim=-1)  # Ū_t = ∂L/∂W_t
    c_bar = u_bar * (q_out.detach().to(dt) - a.load("q_values"))
    ratio_bar = torch.where(unclipped, p.lam * c_bar, 0) * ratio
    out = {"rewards": a.zero(g_q + c * u_bar), "values": a.zero(u_bar), "q_values": a.zero(-c * u_bar),
           "target_log_probs": a.zero(ratio_bar), "log_probs": a.zero(-ratio_bar)}
    a.boundary_grads(out, u[..., -1], out["rewards"])
    return a.result(out)


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
    a = _Adjoint(p, names, saved)
    V, dt, m, N, dev, zero = a.V, a.dt, a.m, a.N, a.dev, a.zero
    k, tr = a.flag("terminated"), a.flag("truncated")
    g_vs, g_pg = a.grad(grads[0]), a.grad(grads[1] if len(grads) > 1 else None)
    g_c = grads[2] if len(grads) > 2 and grads[2] is not None else torch.zeros((N, 2), dtype=dt, device=dev)
    g_cu, g_cv = g_c[..., 0].to(dt), g_c[..., 1].to(dt)
    v = a.load("values")
    q0 = attrs.evolve(p, fields={n: (x.detach() if isinstance(x, torch.Tensor) else x) for n, x in a.f.items()},
                      carry=None if p.carry is None else p.carry.detach())
    local = a.load("rewards") + p.gamma * (1.0 - k) * tr * V._read_bootstrap(q0, dt, m)
    ratio = torch.exp(a.load("target_log_probs") - a.load("log_probs"))
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
    beta = torch.where(m, pc, 1.0) if m is not None else pc  # [N, T]: c is per step
    y = _scan(alpha, beta, False, g_cu)
    u_bar = zero(g_vs + torch.cat([g_cu.unsqueeze(-1), y[..., :-1]], dim=-1))
    local_bar = rho * u_bar + rpg * g_pg
    e_prev, dv_end = _prev_live(zero(gn * local_bar), m, g_cv)
    d_rho = u_bar * (local - v + gn * v_next)
    d_c = p.lam * u_bar * gn * u_next
    d_pg = g_pg * (local + gn * (v_next + u_next) - v)
    d_ratio = (torch.where(ratio <= p.rho_bar, d_rho, 0) + torch.where(ratio <= p.c_bar, d_c, 0)
               + torch.where(ratio <= p.pg_rho_bar, d_pg, 0)) * ratio
    out = {"rewards": zero(local_bar), "values": zero(g_vs - local_bar + e_prev),
           "target_log_probs": zero(d_ratio), "log_probs": zero(-d_ratio)}
    a.boundary_grads(out, torch.stack([y[..., -1], dv_end], -1), out["rewards"])
    return a.result(out)


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
