"""Gradients of the fused kernels: :class:`KernelFunction` and the analytic adjoints.

* The ``torch`` backend is differentiable as it stands: elementwise coefficient and epilogue code
  under autograd, the scans through :class:`rollbuf.backends.scan.AffineScanFunction`.
* A call of the fused kernel with inputs that require grad goes through :class:`KernelFunction`:
  the forward is the kernel; the backward is an analytic adjoint per family, with no forward
  recompute: the TD(λ) family (:func:`lambda_backward`: one fused kernel, family
  ``TD_LAMBDA_ADJOINT``), the forward estimators (:func:`trace_backward`: one backward scan on the
  fused kernel and two elementwise passes), Retrace and V-trace (:func:`retrace_backward`,
  :func:`vtrace_backward`: their ``β`` reads the clipped ratios, so they need the forward state,
  which their saved first output carries; one forward adjoint scan on the fused kernel and
  elementwise passes). The generic path (``_backward``: recompute the elementwise parts with the
  torch backend under autograd, the scans on the fused kernel) serves empty rows and registry
  estimators of ``Family.GENERIC``.

Every adjoint takes ``fused``: run its scans on the fused kernel (inside a ``triton`` backward) or on
the torch scan. Clipped importance ratios (V-trace's ``ρ``, ``c``; Retrace's ``c``) are
differentiated as ``torch.clamp`` does: zero gradient where the clip is active.
"""

from __future__ import annotations

import torch

from rollbuf import windows
from rollbuf.backends import torch_backend
from rollbuf.backends.scan import scan_values
from rollbuf.boundary import coefficients as C
from rollbuf.problem import Family, Problem

__all__ = ["needs_grad", "run", "KernelFunction", "lambda_backward", "trace_backward", "retrace_backward",
           "vtrace_backward", "DIFFERENTIABLE"]

DIFFERENTIABLE = ("rewards", "values", "bootstrap_values", "log_probs", "target_log_probs", "q_values", "x",
                  "alpha", "beta")


def differentiable_fields(p: Problem) -> tuple[str, ...]:
    """The fields of ``p`` that can carry gradients (floating-point inputs, never flags)."""
    if p.family == Family.GENERIC:
        return tuple(f.name for f in p.estimator.fields if f.kind != "flag")
    return DIFFERENTIABLE


def needs_grad(p: Problem) -> bool:
    """Whether a call must be recorded for autograd (grad mode on, some input requires grad)."""
    if not torch.is_grad_enabled():
        return False
    if p.carry is not None and p.carry.requires_grad:
        return True
    names = None
    for k, t in p.fields.items():
        if t is not None and t.requires_grad:  # (rare: the names are looked at only then)
            names = differentiable_fields(p) if names is None else names
            if k in names:
                return True
    return False


class KernelFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p: Problem, plain_run, names: tuple, *tensors):
        ctx.p, ctx.names = p, names
        outs, carry = plain_run(p)
        ctx.n_out = len(outs)
        # the adjoints of Retrace and V-trace read their first output (Q; vs): kept, not recomputed
        keep = (outs[0],) if p.family in (Family.RETRACE, Family.VTRACE) else ()
        ctx.save_for_backward(*tensors, *keep)
        return tuple(outs) + ((carry,) if carry is not None else ())

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        p, names, none = ctx.p, ctx.names, (None, None, None)
        if p.family == Family.TD_LAMBDA and p.num_steps > 0:
            return (*none, *lambda_backward(p, names, saved, grads, fused=True))
        if p.family == Family.FORWARD and p.num_steps > 0:
            return (*none, *trace_backward(p, names, saved, grads, fused=True))
        if p.family in (Family.RETRACE, Family.VTRACE):
            saved, out0 = saved[:-1], saved[-1]
            if p.num_steps > 0:
                fn = retrace_backward if p.family == Family.RETRACE else vtrace_backward
                return (*none, *fn(p, names, saved, out0, grads, fused=True))
        return KernelFunction._backward(ctx, saved, grads)

    @staticmethod
    def _backward(ctx, saved, grads):
        with torch.enable_grad():
            xs = [t.detach().requires_grad_(t.requires_grad) for t in saved]
            fields = dict(ctx.p.fields)
            carry = ctx.p.carry
            for name, x in zip(ctx.names, xs):
                if name == "carry":
                    carry = x
                else:
                    fields[name] = x
            outs, c = torch_backend.run(ctx.p.evolve(fields=fields, carry=carry), fused=True)
            res = list(outs) + ([c] if c is not None else [])
            pairs = [(r, g.to(r.dtype)) for r, g in zip(res, grads) if g is not None and r.requires_grad]
            want = [x for x in xs if x.requires_grad]
            got = torch.autograd.grad([r for r, _ in pairs], want, [g for _, g in pairs], allow_unused=True) \
                if pairs and want else [None] * len(want)
        it = iter(got)
        out = [next(it) if x.requires_grad else None for x in xs]
        return (None, None, None, *out)


class _Adjoint:
    """What the analytic adjoints share: the call's fields with the saved tensors in place, the mask,
    clean flags and loads (0 at masked steps), the bootstrap/carry gradients, the result list."""

    def __init__(self, p: Problem, names, saved, fused: bool):
        self.p, self.names, self.saved, self.fused = p, names, saved, fused
        self.dt = p.compute_dtype
        self.f = dict(p.fields)
        for name, x in zip(names, saved):
            if name != "carry":
                self.f[name] = x
        main = self.f["x" if p.family == Family.FORWARD else "rewards"]
        self.N, self.T, self.dev = main.shape[0], main.shape[1], main.device
        self.m = p.flag("mask")

    def scan(self, alpha, beta, reverse, initial):
        """An affine scan (no autograd node) on the fused kernel or the torch scan."""
        return scan_values(alpha, beta, reverse, initial, self.fused)

    def zero(self, x):
        """``x`` with its masked steps set to 0."""
        return x if self.m is None else torch.where(self.m.reshape(self.m.shape + (1,) * (x.dim() - 2)), x, 0)

    def flag(self, name):
        """A flag as 0/1 in the compute dtype, 0 at masked steps (a 0-d zero if absent)."""
        x = self.p.flag(name)
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
        :func:`rollbuf.windows.window_end_carry`: an explicit ``carry`` takes ``w_end`` whole;
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
        read = None if p.no_bootstrap else windows.bootstrap_read(p.fields.get("terminated"),
                                                                   p.fields.get("truncated"), self.m)
        if read is not None:
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
        w = w_end[..., 1] if p.pair else w_end
        if self.m is None:
            j = None  # the last column
        else:
            last = windows.last_unmasked_index(self.m)
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


def lambda_backward(p: Problem, names, saved, grads, fused: bool = False):
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
    a = _Adjoint(p, names, saved, fused)
    dt, m, N, T, dev = a.dt, a.m, a.N, a.T, a.dev
    n_out = len(p.outputs)
    named = dict(zip(p.outputs, grads))
    g_adv, g_ret = named.get("advantages"), named.get("returns")
    g_carry = grads[n_out] if len(grads) > n_out and grads[n_out] is not None else None
    w0 = g_carry.to(dt) if g_carry is not None else None
    has_v = "values" in names
    if fused and not torch.compiler.is_compiling():
        # one fused kernel: reads the output gradients and flags, writes r̄, V̄ and W_T (0 at masked
        # steps, which it never reads); Ḡ = ḡ_G + ḡ_A is formed in registers
        from rollbuf import kernels

        if g_ret is None and g_adv is None:
            g_ret = torch.zeros((N, T), dtype=dt, device=dev)
        adv_only = g_ret is None
        if adv_only:  # Ḡ = ḡ_A: pass it as ḡ_G with ḡ_A = 0, and subtract it from V̄ below
            g_ret, g_adv = g_adv, None
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


def trace_backward(p: Problem, names, saved, grads, fused: bool = False):
    """The analytic adjoint of the forward estimators (eligibility traces, episodic sums).

    ``F_t = nd_t·x_t + d·nd_t·F_{t−1}`` (``d`` the decay; masked steps the identity) and
    ``e_t = x_t + d·F_{t−1}``, ``final = F_{T−1}``, linear in ``x`` with coefficients free of it. With
    ``ē`` (0 at masked steps) and ``f̄``, ``Y_t = ∂L/∂F_{t−1}`` is one *backward* scan
    ``Y_t = d·ē_t + β_t·Y_{t+1}``, ``Y_T = f̄`` (``β = d·nd``, 1 where masked); then
    ``x̄_t = ē_t + nd_t·Y_{t+1}`` at unmasked steps and ``∂/∂initial = Y_0``. No forward recompute;
    the scan runs on the fused kernel inside a triton backward.
    """
    a = _Adjoint(p, names, saved, fused)
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


def retrace_backward(p: Problem, names, saved, q_out, grads, fused: bool = False):
    """The analytic adjoint of Retrace, from its inputs and its output ``Q`` (no forward recompute).

    ``W_t = V_t + c_t(local_t − q_t) + g_t·c_t·W_{t+1}`` and ``Q_t = local_t + g_t·W_{t+1}``
    (``g = γ·nd``, ``c = λ·min(ratio, c̄)``). With ``Q̄`` and ``Ū_t = ∂L/∂W_t``: ``U_t = Ū_{t+1} =
    g_t·Q̄_t + g_t·c_t·U_{t−1}`` is one forward scan (masked steps the identity) from the carry-out
    gradient; then ``V̄ = Ū``, ``q̄ = −c·Ū``, ``r̄ = local̄ = Q̄ + c·Ū``, ``boot̄ = γ(1−k)tr·r̄`` where
    read, and ``c̄_t = Ū_t·(local_t − q_t) + Ū_t·g_t·W_{t+1} = Ū_t·(Q_t − q_t)``, which reaches the
    log-probabilities through the ratio where it is not clipped (``torch.clamp``'s convention).
    ``U_{T−1}`` is the window-end carry's gradient.
    """
    a = _Adjoint(p, names, saved, fused)
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
    u = a.scan(gn * g_q, beta, False, w0)
    u_bar = torch.cat([w0.unsqueeze(-1), u[..., :-1]], dim=-1)  # Ū_t = ∂L/∂W_t
    c_bar = u_bar * (q_out.detach().to(dt) - a.load("q_values"))
    ratio_bar = torch.where(unclipped, p.lam * c_bar * ratio, 0)  # no 0·inf where the clip is active
    out = {"rewards": a.zero(g_q + c * u_bar), "values": a.zero(u_bar), "q_values": a.zero(-c * u_bar),
           "target_log_probs": a.zero(ratio_bar), "log_probs": a.zero(-ratio_bar)}
    a.boundary_grads(out, u[..., -1], out["rewards"])
    return a.result(out)


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


def vtrace_backward(p: Problem, names, saved, vs_out, grads, fused: bool = False):
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
    a = _Adjoint(p, names, saved, fused)
    dt, m, N, dev, zero = a.dt, a.m, a.N, a.dev, a.zero
    k, tr = a.flag("terminated"), a.flag("truncated")
    g_vs, g_pg = a.grad(grads[0]), a.grad(grads[1] if len(grads) > 1 else None)
    g_c = grads[2] if len(grads) > 2 and grads[2] is not None else torch.zeros((N, 2), dtype=dt, device=dev)
    g_cu, g_cv = g_c[..., 0].to(dt), g_c[..., 1].to(dt)
    v = a.load("values")
    q0 = p.evolve(fields={n: (x.detach() if isinstance(x, torch.Tensor) else x) for n, x in a.f.items()},
                      carry=None if p.carry is None else p.carry.detach())
    local = a.load("rewards") + p.gamma * (1.0 - k) * tr * torch_backend.read_bootstrap(q0, dt)
    ratio = torch.exp(a.load("target_log_probs") - a.load("log_probs"))
    rho = torch.clamp(ratio, max=p.rho_bar)
    c = p.lam * torch.clamp(ratio, max=p.c_bar)
    rpg = torch.clamp(ratio, max=p.pg_rho_bar)
    gn = p.gamma * (1.0 - k) * (1.0 - tr)
    carry_in = torch_backend.end_carry(q0, dt)
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


def run(p: Problem, plain_run):
    """``plain_run(p)`` (the triton backend without gradients) recorded as one autograd node whose
    backward is the family's analytic adjoint (same return convention as ``plain_run``)."""
    names, tensors = [], []
    for k in differentiable_fields(p):
        t = p.fields.get(k)
        if t is not None:
            names.append(k)
            tensors.append(t)
    if p.carry is not None:
        names.append("carry")
        tensors.append(p.carry)
    res = KernelFunction.apply(p, plain_run, tuple(names), *tensors)
    n = len(p.outputs)
    outs = tuple(res[:n])
    carry = res[n] if len(res) > n else None
    return outs, carry
