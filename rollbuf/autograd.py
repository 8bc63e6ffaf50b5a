"""Gradients.

* The affine scan has an analytic backward (:class:`AffineScanFunction`): for
  ``y_t = α_t + β_t·y_{t−1}`` the adjoint ``g_t = ȳ_t + β_{t+1}·g_{t+1}`` is the same scan run the
  other way with ``β`` shifted by one step, and ``ᾱ = g``, ``β̄_t = g_t·y_{t−1}``, ``ȳ_{−1} = β_0·g_0``.
  Autograd records one node per scan, not the blocked scan's inner steps.
* The ``torch`` backend is differentiable as it stands: elementwise coefficient and epilogue code
  under autograd, the scans through :class:`AffineScanFunction`.
* A call of the fused kernel with inputs that require grad goes through :class:`KernelFunction`:
  the forward is the kernel; the backward recomputes the elementwise parts with the ``torch``
  backend under autograd, and runs both its scans (the recomputed forward one and the adjoint) on the
  fused kernel. The elementwise parts of the backward are not fused yet.

Clipped importance ratios (V-trace's ``ρ``, ``c``; Retrace's ``c``) are differentiated as
``torch.clamp`` does: zero gradient where the clip is active.
"""

from __future__ import annotations

import contextvars

import attrs
import torch
from torch.autograd.function import once_differentiable

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
        ctx.save_for_backward(*tensors)
        outs, carry = kernels.run(p)
        ctx.n_out = len(outs)
        return tuple(outs) + ((carry,) if carry is not None else ())

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        token = _FUSED_SCAN.set(True)
        try:
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
