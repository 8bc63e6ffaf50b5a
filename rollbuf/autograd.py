"""Gradients for the ``triton`` backend.

The ``torch`` backend is differentiable as it stands (every step is a torch op). A call of the
fused kernel with inputs that require grad goes through :class:`KernelFunction`: the forward is the
kernel; the backward recomputes the call with the ``torch`` backend under autograd and
back-propagates through it. Gradients are therefore exact (the same functions of the inputs), but
the backward is not fused yet: it costs a vectorised torch pass and its temporaries.

Clipped importance ratios (V-trace's ``ρ``, ``c``; Retrace's ``c``) are differentiated as
``torch.clamp`` does: zero gradient where the clip is active.
"""

from __future__ import annotations

import attrs
import torch

from rollbuf.problem import Problem

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
        from rollbuf import vectorized

        saved = ctx.saved_tensors
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
