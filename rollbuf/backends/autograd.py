"""Gradients of the fused kernels: :class:`KernelFunction` and the analytic adjoints.

* The ``torch`` backend is differentiable as it stands: elementwise coefficient and epilogue code
  under autograd, the scans through :class:`rollbuf.backends.scan.AffineScanFunction`.
* A call of the fused kernel with inputs that require grad goes through :class:`KernelFunction`:
  the forward is the kernel; the backward is an analytic adjoint per family, with no forward
  recompute, each in its family's folder (``rollbuf/kernels/<family>/adjoint.py``, the family's
  ``Row.adjoint``): the TD(λ) family (one fused kernel, family ``TD_LAMBDA_ADJOINT``), the forward
  estimators (one backward scan on the fused kernel and two elementwise passes), Retrace and V-trace
  (their ``β`` reads the clipped ratios, so they need the forward state, which their saved first
  output carries, ``Row.saves_output``; one forward adjoint scan on the fused kernel and elementwise
  passes). The generic path (``_backward``: recompute the elementwise parts with the torch backend
  under autograd, the scans on the fused kernel) serves empty rows, the affine scan and registry
  estimators of ``Family.GENERIC``. :func:`adjoint` runs a family's adjoint on its own.

An adjoint reads the call through :class:`Adjoint` (the fields with the saved tensors in place, the
mask, the scans): with ``fused``, its scans run on the fused kernel (inside a ``triton`` backward),
else on the torch scan. Clipped importance ratios (V-trace's ``ρ``, ``c``; Retrace's ``c``) are
differentiated as ``torch.clamp`` does: zero gradient where the clip is active.
"""

from __future__ import annotations

import torch

from rollbuf import windows
from rollbuf.backends import torch_backend
from rollbuf.backends.scan import scan_values
from rollbuf.kernels.families import row_of
from rollbuf.problem import Family, Problem

__all__ = ["needs_grad", "run", "KernelFunction", "Adjoint", "adjoint", "DIFFERENTIABLE"]

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
        row = row_of(p.family)
        keep = (outs[0],) if row is not None and row.saves_output else ()
        ctx.save_for_backward(*tensors, *keep)
        return tuple(outs) + ((carry,) if carry is not None else ())

    @staticmethod
    def backward(ctx, *grads):
        saved, out0 = ctx.saved_tensors, None
        p = ctx.p
        row = row_of(p.family)
        if row is not None and row.saves_output:
            saved, out0 = saved[:-1], saved[-1]
        if row is not None and row.adjoint is not None and p.num_steps > 0:
            return (None, None, None, *adjoint(p, ctx.names, saved, grads, out0, fused=True))
        return KernelFunction._backward(ctx, saved, grads)

    @staticmethod
    def _backward(ctx, saved, grads):
        with torch.enable_grad():
            xs = [t.detach().requires_grad_(t.requires_grad) for t in saved]
            fields = dict(ctx.p.fields)
            carry = ctx.p.carry
            for name, x in zip(ctx.names, xs, strict=True):
                if name == "carry":
                    carry = x
                else:
                    fields[name] = x
            outs, c = torch_backend.run(ctx.p.evolve(fields=fields, carry=carry), fused=True)
            res = list(outs) + ([c] if c is not None else [])
            pairs = [(r, g.to(r.dtype)) for r, g in zip(res, grads, strict=False) if g is not None and r.requires_grad]
            want = [x for x in xs if x.requires_grad]
            got = torch.autograd.grad([r for r, _ in pairs], want, [g for _, g in pairs], allow_unused=True) \
                if pairs and want else [None] * len(want)
        it = iter(got)
        out = [next(it) if x.requires_grad else None for x in xs]
        return (None, None, None, *out)


def adjoint(p: Problem, names: tuple, saved: tuple, grads: tuple, out0=None, fused: bool = False) -> list:
    """The analytic adjoint of ``p``'s family (its ``Row.adjoint``): the gradients of the inputs
    ``names`` (``saved``: those tensors, ``"carry"`` the carry in), ``None`` for one that does not
    require grad, from the gradients of the outputs and the carry out (``grads``). ``out0``: the
    first output, for an adjoint that reads it (``Row.saves_output``)."""
    row = row_of(p.family)
    fn = None if row is None else row.adjoint
    if fn is None:
        raise ValueError(f"the {p.family} family has no analytic adjoint")
    return fn(Adjoint(p, names, saved, fused), grads, out0)


class Adjoint:
    """What the analytic adjoints share: the call's fields with the saved tensors in place, the mask,
    clean flags and loads (0 at masked steps), the scans, the window's bootstrap terms, the
    bootstrap/carry gradients, the result list."""

    def __init__(self, p: Problem, names, saved, fused: bool):
        self.p, self.names, self.saved, self.fused = p, names, saved, fused
        self.dt = p.compute_dtype
        self.f = dict(p.fields)
        for name, x in zip(names, saved, strict=True):
            if name != "carry":
                self.f[name] = x
        main = self.field("x" if p.family == Family.FORWARD else "rewards")
        self.N, self.T, self.dev = main.shape[0], main.shape[1], main.device
        self.m = p.flag("mask")

    def field(self, name: str) -> torch.Tensor:
        """Field ``name`` (the saved tensor where there is one); one the family reads is never
        absent once the call is validated."""
        x = self.f[name]
        if x is None:
            raise ValueError(f"the {self.p.family} adjoint reads {name!r}, which the call does not give")
        return x

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
        return self.zero(self.field(name).detach().to(self.dt))

    def window(self):
        """``(B_t, the state past the window)`` of the detached call (``torch_backend``'s)."""
        p = self.p
        q = p.evolve(fields={n: (x.detach() if isinstance(x, torch.Tensor) else x) for n, x in self.f.items()},
                     carry=None if p.carry is None else p.carry.detach())
        return torch_backend.read_bootstrap(q, self.dt), torch_backend.end_carry(q, self.dt)

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
        want = {n for n, x in zip(self.names, self.saved, strict=True)
                if n in ("bootstrap_values", "carry") and x.requires_grad}
        if not want:
            return
        if "carry" in want:
            out["carry"] = w_end
        if "bootstrap_values" not in want:
            return
        bv = self.field("bootstrap_values")  # in `want`: saved, so given
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
                for n, x in zip(self.names, self.saved, strict=True)]


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
