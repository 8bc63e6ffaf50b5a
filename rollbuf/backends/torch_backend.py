"""The ``torch`` backend: every estimator as one vectorised affine scan, no Python loop over time.

The scans are :mod:`rollbuf.backends.scan`'s blocked scan in linear space (``BLOCK`` steps in a
vectorised loop, ``log2(T/BLOCK)`` doubling passes across blocks): no cumulative products of
discounts or logarithms are formed, so nothing underflows at long ``T`` or as ``γλ → 1``.

Each family's step maps and outputs are its torch path (``rollbuf/kernels/<family>/torch_path.py``, over
the coefficient functions the Triton kernels compile), reached through its row of the kernel table;
where ``bootstrap_values`` is read and where each window ends come from :mod:`rollbuf.windows`. This
module only loads the fields (zeroing whatever must not be read), applies the mask identity, scans
(:class:`Loader`), and runs the generic estimators and the affine primitive.

``fused=True`` (the ``triton`` backend's backward passes) runs the scans on the fused kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rollbuf import windows
from rollbuf.backends.scan import affine_scan, compose_all
from rollbuf.boundary import coefficients as C
from rollbuf.kernels.families import row_of
from rollbuf.kernels.row import Row
from rollbuf.problem import Family, Problem

__all__ = ["run", "steps", "window_map", "read_bootstrap", "end_carry", "Loader"]


_IDENTITY = (0.0, 1.0)  # (α, β) of the identity map
_PAIR_IDENTITY = (1.0, 0.0, 1.0, 0.0, 0.0)  # (p, q, s, a, w) of the identity map on (u, V)


def _lifted(m, dim: int):
    """The mask ``[N, T]`` as ``[N, 1.., T]`` for a tensor of ``dim`` dims (``x`` as ``[N, *F, T]``)."""
    return m.reshape(m.shape[:1] + (1,) * (dim - 2) + m.shape[1:])


class Loader:
    """One problem on the torch backend, what the families' torch paths (``rollbuf/kernels/<family>/
    torch_path.py``: ``steps(t)``, ``outputs(t, elems, env)``) share: clean fields (floats in the compute
    dtype and flags as 0/1, all 0 at masked steps), the scans (on the fused kernel with ``fused``), the
    state past the window, outputs 0 at masked steps."""

    def __init__(self, p: Problem, fused: bool = False):
        self.p, self.dt, self.fused = p, p.compute_dtype, fused
        self.m = p.flag("mask")

    def load(self, name):
        x = self.p.fields.get(name)
        if x is None:
            return None
        x = x.to(self.dt)
        m = self.m
        return x if m is None else torch.where(m.reshape(m.shape + (1,) * (x.dim() - 2)), x, 0)

    def flag(self, name, like):
        f = self.p.flag(name)
        if f is None:
            return torch.zeros((), dtype=self.dt, device=like.device)
        f = f if self.m is None else f & self.m
        return f.to(self.dt)

    def backward_fields(self):
        """``(r, k, tr, B)`` of a backward family: rewards, flags, the bootstrap values it reads."""
        r = self.load("rewards")
        return r, self.flag("terminated", r), self.flag("truncated", r), read_bootstrap(self.p, self.dt)

    def identity_where(self, elems, identity):
        """The maps ``elems`` with the masked steps the identity."""
        m = self.m
        if m is None:
            return tuple(elems)
        return tuple(torch.where(_lifted(m, e.dim()), e, i) for e, i in zip(elems, identity, strict=True))

    def masked(self, outs):
        """The outputs ``outs``, 0 at masked steps."""
        return self.identity_where(outs, (0,) * len(outs))

    def scan(self, alpha, beta, reverse, init):
        return affine_scan(alpha, beta, reverse, init, self.fused)

    @staticmethod
    def exclusive(incl, carry, reverse):
        """State one step further along the scan: ``Z_{t+1}`` (backward) or ``F_{t−1}`` (forward)."""
        c = carry.unsqueeze(-1).to(incl.dtype)
        return torch.cat([incl[..., 1:], c] if reverse else [c, incl[..., :-1]], dim=-1)

    def end_carry(self):
        """The scan state past the window (:func:`end_carry`)."""
        return end_carry(self.p, self.dt)

    def backward_scan(self, alpha, beta):
        """Backward scan of masked ``(α, β)`` from the state past the window: ``(Z_{t+1} for every t, Z_0)``."""
        carry = self.end_carry()
        incl = self.scan(alpha, beta, True, carry)
        z0 = incl[..., 0] if incl.shape[-1] else carry
        return self.exclusive(incl, carry, reverse=True), z0


def _path(p: Problem) -> tuple[Callable[..., tuple], Callable[..., tuple], Row]:
    """The family's torch path (its row's ``torch_steps`` and ``torch_outputs``) and its row."""
    row = row_of(p.family)
    if row is None or row.torch_steps is None or row.torch_outputs is None:
        raise ValueError(f"the torch backend has no family {p.family!r}")
    return row.torch_steps, row.torch_outputs, row


def _steps(t: Loader):
    p = t.p
    if p.family == Family.GENERIC:
        e = p.estimator
        clean = {f.name: (t.flag(f.name, p.main) if f.kind == "flag" else t.load(f.name)) for f in e.fields}
        elems, env = torch.broadcast_tensors(*e.coefficients(clean, p.params)), {"clean": clean}
        pair, reverse = False, p.reverse
    else:
        family_steps, _, row = _path(p)
        elems, env = family_steps(t)
        pair, reverse = row.pair, row.backward
    identity = _PAIR_IDENTITY if pair else _IDENTITY
    return t.identity_where(elems, identity), (C.compose_pair if pair else C.compose), identity, reverse, env


def steps(p: Problem):
    """The per-step maps of ``p``'s scan (masked steps the identity) and the fields the epilogue reads.

    Returns ``(elems, compose, identity, reverse, env)``: ``elems`` a tuple of ``[N, T]`` tensors
    (the forward family: ``α`` ``[N, *F, T]`` and ``β`` ``[N, 1.., T]``, broadcastable), ``env`` a dict
    of what the family's outputs read. Shared by :func:`run` and :func:`window_map`; the maps of a family
    are its ``torch_path.steps`` (its row's ``torch_steps``).
    """
    return _steps(Loader(p))


def window_map(p: Problem):
    """The affine map of a whole window ``p`` (its carry ignored), for chaining windows without
    running them: what :func:`run` would compose, as :func:`compose_all` of the same step maps.

    * ``TD_LAMBDA`` / ``RETRACE``: ``(a, b)``, each ``[N]``: ``Z_0 = a + b·Z_T``;
    * ``VTRACE``: ``(p, q, s, a, w)``, each ``[N]``: ``(u_0, V_0) = (a + p·u_T + q·V_T, w + s·V_T)``;
    * ``FORWARD``: ``(a, b)``, ``a`` ``[N, *F]``, ``b`` ``[N]``: ``final = F_{T−1} = a + b·initial``.

    Used by :mod:`rollbuf.distributed` (on any device: it is plain torch).
    """
    elems, compose, identity, reverse, _ = steps(p)
    out = compose_all(elems, compose, identity, reverse)
    if p.family == Family.FORWARD:
        a, b = out
        return a, b.reshape(b.shape[0])
    return out


def run(p: Problem, fused: bool = False):
    """Run one prepared problem. Returns ``(outputs, carry)``; outputs are 0 at masked steps; the
    forward family returns ``final`` as its last output and no carry. A family's outputs are its
    ``torch_path.outputs`` (its row's ``torch_outputs``)."""
    dt = p.compute_dtype
    if p.family == Family.AFFINE:  # the public primitive: α and β given as data
        alpha, beta, initial = p.fields["alpha"], p.fields["beta"], p.carry
        # an affine problem is built with all three (functional.affine_scan: initial 0 by default)
        assert alpha is not None and beta is not None and initial is not None
        init = initial.to(dt)
        y = affine_scan(alpha.to(dt), beta.to(dt), p.reverse, init, fused)
        final = (y[..., 0] if p.reverse else y[..., -1]) if y.shape[-1] else init
        return (y, final), None
    if p.family == Family.TD_LAMBDA_ADJOINT:
        raise ValueError("the TD(λ) adjoint runs through rollbuf.backends.autograd, not as a problem")
    t = Loader(p, fused)
    elems, _, _, reverse, env = _steps(t)
    if p.family == Family.GENERIC:
        return _run_generic(t, elems, reverse, env)
    return _path(p)[1](t, elems, env)


def _run_generic(t: Loader, elems, reverse, env):
    """A registry estimator given by its coefficient function: one scan, its epilogue (default:
    the inclusive state), outputs 0 at masked steps; the carry is the state at the row's first
    step in scan order (backward) / ``final`` as the last output (forward)."""
    p = t.p
    e, dt = p.estimator, t.dt
    if p.carry is not None:
        init = p.carry.to(dt)
    elif e.window_end_carry is not None and reverse and p.window_end != "terminal":
        init = e.window_end_carry(env["clean"], p.params).to(dt)
    else:
        init = torch.zeros(p.num_rows, dtype=dt, device=p.main.device)
    alpha, beta = elems
    incl = t.scan(alpha, beta, reverse, init)
    nxt = t.exclusive(incl, init, reverse)
    outs = (incl,) if e.outputs_from_state is None else tuple(e.outputs_from_state(env["clean"], p.params, nxt, incl))
    T = incl.shape[-1]
    edge = (incl[..., 0] if reverse else incl[..., -1]) if T else init
    outs = t.masked(outs)
    if e.direction == "forward":
        return (*outs, edge), None
    return outs, edge


def read_bootstrap(p: Problem, dt):
    """``B_t``: bootstrap values where a step reads them in its local term (:func:`rollbuf.windows.
    bootstrap_read`), 0 elsewhere, so that nothing unread (not even a NaN) reaches the arithmetic."""
    bv = p.fields.get("bootstrap_values")
    r = p.fields.get("rewards")
    if r is None:
        raise ValueError(f"the {p.family} family reads rewards, which the problem does not give")
    if bv is None or p.no_bootstrap:
        return torch.zeros((), dtype=dt, device=r.device)
    read = windows.bootstrap_read(p.fields.get("terminated"), p.fields.get("truncated"), p.fields.get("mask"))
    if read is None:
        return torch.zeros((), dtype=dt, device=r.device)
    bv = bv.to(dt)
    if bv.dim() == r.dim() - 1:  # [N]: only the window-end column (validated: no interior trunc)
        bv = bv.unsqueeze(-1)
    return torch.where(read, bv, 0)


def end_carry(p: Problem, dt):
    """The scan state past the window (:func:`rollbuf.windows.window_end_carry`)."""
    r = p.fields.get("rewards")
    if r is None:
        raise ValueError(f"the {p.family} family reads rewards, which the problem does not give")
    return windows.window_end_carry(
        carry=p.carry, window_end=p.window_end, no_bootstrap=p.no_bootstrap,
        bootstrap_values=p.fields.get("bootstrap_values"), terminated=p.fields.get("terminated"),
        mask=p.fields.get("mask"), shape=tuple(r.shape[:2]), pair=p.pair, dtype=dt, device=r.device)
