"""The affine scan on torch tensors, and its analytic backward.

* :func:`doubling_scan`, :func:`blocked_scan`, :func:`compose_all`: inclusive scans / the whole
  composition of maps along the last dim, in linear space (no cumulative products of discounts, no
  logarithms: nothing underflows at long ``T`` or as ``γλ → 1``).
* :func:`affine_scan` ``y_t = α_t + β_t·y_{t∓1}`` with an analytic backward
  (:class:`AffineScanFunction`): for ``y_t = α_t + β_t·y_{t−1}`` the adjoint
  ``g_t = ȳ_t + β_{t+1}·g_{t+1}`` is the same scan run the other way with ``β`` shifted by one
  step, and ``ᾱ = g``, ``β̄_t = g_t·y_{t−1}``, ``ȳ_{−1} = β_0·g_0``. Autograd records one node per
  scan, not the blocked scan's inner steps.

``fused=True`` runs the scans on the fused kernel (the ``triton`` backend's backward passes);
otherwise, and always under ``torch.compile``, on the blocked torch scan.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from rollbuf.boundary import coefficients as C
from rollbuf.problem import Family, Problem

__all__ = ["doubling_scan", "blocked_scan", "compose_all", "affine_scan", "AffineScanFunction", "BLOCK"]


def _shift_compose(elems, compose, off, reverse):
    """One doubling pass: element t becomes elem_t ∘ elem_{t±off} (the farther one applied first)."""
    if reverse:  # backward: y_t = α_t + β_t·y_{t+1}; t composes with t+off (inner)
        head = compose(*[e[..., :-off] for e in elems], *[e[..., off:] for e in elems])
        return tuple(torch.cat([h, e[..., -off:]], dim=-1) for h, e in zip(head, elems, strict=True))
    head = compose(*[e[..., off:] for e in elems], *[e[..., :-off] for e in elems])
    return tuple(torch.cat([e[..., :off], h], dim=-1) for h, e in zip(head, elems, strict=True))


def doubling_scan(elems, compose, reverse):
    """Inclusive scan of maps along the last dim; ``elems`` is a tuple of same-shape tensors."""
    T = elems[0].shape[-1]
    off = 1
    while off < T:
        elems = _shift_compose(elems, compose, off, reverse)
        off *= 2
    return elems


BLOCK = 32  # steps per block of the blocked scan (products of at most 32 discounts per block)


def blocked_scan(elems, compose, identity, reverse):
    """Inclusive scan of maps along the last dim, as a two-level blocked scan.

    1. inside blocks of ``BLOCK`` steps: a loop over the block's steps, vectorised over every block
       of every row at once (``BLOCK`` iterations, each a few ops on ``N·T/BLOCK`` elements);
    2. across blocks: a doubling scan of the block aggregates (``log2(T/BLOCK)`` passes on
       ``N·T/BLOCK`` elements), shifted to the map of everything past each block;
    3. every step's map composed with its block's carry map (one pass over ``N·T``).
    Work ``O(N·T)``, ``BLOCK + log2(T/BLOCK)`` small Python steps, all in linear space.
    """
    T = elems[0].shape[-1]
    if T <= BLOCK:
        return doubling_scan(elems, compose, reverse)
    nb = -(-T // BLOCK)
    pad = nb * BLOCK - T
    lead = elems[0].shape[:-1]
    blocks = []
    for e, i in zip(elems, identity, strict=True):
        row = torch.cat([e, e.new_full((*lead, pad), i)], dim=-1) if pad else e  # identity past the row
        blocks.append(row.reshape(*lead, nb, BLOCK).movedim(-1, 0).contiguous())  # [BLOCK, *lead, nb]
    # 1. within blocks, in scan order
    order = range(BLOCK - 1, -1, -1) if reverse else range(BLOCK)
    state = None
    local = [torch.empty_like(b) for b in blocks]
    for j in order:
        step = tuple(b[j] for b in blocks)
        state = step if state is None else compose(*step, *state)
        for out, s_ in zip(local, state, strict=True):
            out[j] = s_
    # 2. across blocks: aggregate of each block = its local map at the block's first step in scan order
    edge = 0 if reverse else BLOCK - 1
    agg = doubling_scan(tuple(x[edge] for x in local), compose, reverse)  # [*lead, nb]
    ident = [torch.full_like(a[..., :1], i) for a, i in zip(agg, identity, strict=True)]
    if reverse:  # carry map of block c: everything after it
        carry = tuple(torch.cat([a[..., 1:], i_], dim=-1) for a, i_ in zip(agg, ident, strict=True))
    else:
        carry = tuple(torch.cat([i_, a[..., :-1]], dim=-1) for a, i_ in zip(agg, ident, strict=True))
    # 3. every step composed with its block's carry map
    full = compose(*local, *[c.unsqueeze(0) for c in carry])
    return tuple(f.movedim(0, -1).reshape(*lead, nb * BLOCK)[..., :T] for f in full)


def compose_all(elems, compose, identity, reverse):
    """The composition of all the maps along the last dim: the inclusive scan at the row's first
    element in scan order (``reverse=True``: step 0, the map from ``Z_T`` to ``Z_0``; forward: step
    ``T−1``, the map from ``F_{−1}`` to ``F_{T−1}``), without the scan's per-step outputs.

    A pairwise tree reduction (``ceil(log2 T)`` halvings, ``O(N·T)`` work); elements may have
    broadcastable leading shapes. ``T = 0`` gives the identity.
    """
    while elems[0].shape[-1] > 1:
        if elems[0].shape[-1] % 2:  # identity past the row's end: applied innermost / outermost
            elems = tuple(torch.cat([e, e.new_full((*e.shape[:-1], 1), i)], dim=-1)
                          for e, i in zip(elems, identity, strict=True))
        even = [e[..., 0::2] for e in elems]
        odd = [e[..., 1::2] for e in elems]
        # backward: step t is applied after step t+1 (t outer); forward: t+1 outer
        elems = compose(*even, *odd) if reverse else compose(*odd, *even)
    if elems[0].shape[-1] == 0:
        return tuple(e.new_full(e.shape[:-1], i) for e, i in zip(elems, identity, strict=True))
    return tuple(e[..., 0] for e in elems)


def _torch_scan(alpha, beta, reverse, initial):
    a, b = blocked_scan((alpha, beta), C.compose, (0.0, 1.0), reverse)
    return a + b * initial.unsqueeze(-1)


def _fused_scan(alpha, beta, reverse, initial):
    """The same scan on the fused kernel (``Family.AFFINE``)."""
    from rollbuf import kernels  # needs triton: imported only when a fused scan is asked for

    lead, T = alpha.shape[:-1], alpha.shape[-1]
    if T == 0 or alpha.numel() == 0:  # nothing to scan (and no row to reshape to)
        return torch.empty(alpha.shape, dtype=alpha.dtype, device=alpha.device)
    p = Problem(family=Family.AFFINE, outputs=("y", "final"),
                fields={"alpha": alpha.reshape(-1, T), "beta": beta.reshape(-1, T)},
                carry=initial.reshape(-1).contiguous(), compute_dtype=alpha.dtype,
                out_dtype=alpha.dtype, reverse=reverse)
    return kernels.run(p)[0][0].reshape(*lead, T)


def scan_values(alpha, beta, reverse, initial, fused=False):
    """The scan itself, no autograd node: the fused kernel when ``fused`` (eager only), else torch."""
    if fused and not torch.compiler.is_compiling():
        return _fused_scan(alpha, beta, reverse, initial)
    return _torch_scan(alpha, beta, reverse, initial)


class AffineScanFunction(torch.autograd.Function):
    """``y = affine_scan(α, β, reverse, initial)`` with the adjoint scan as its backward."""

    @staticmethod
    def forward(ctx, alpha, beta, initial, reverse, fused):
        y = scan_values(alpha, beta, reverse, initial, fused)
        ctx.save_for_backward(beta, y, initial)
        ctx.reverse = reverse
        ctx.fused = fused
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        beta, y, init = ctx.saved_tensors
        if y.shape[-1] == 0:
            return torch.zeros_like(y), torch.zeros_like(beta), torch.zeros_like(init), None, None
        zero = torch.zeros_like(beta[..., :1])
        if not ctx.reverse:  # y_t = a_t + b_t·y_{t−1}: the adjoint runs backward in time
            g = scan_values(gy, torch.cat([beta[..., 1:], zero], -1), True, torch.zeros_like(init), ctx.fused)
            y_before = torch.cat([init.unsqueeze(-1).to(y.dtype), y[..., :-1]], -1)
            d_init = beta[..., 0] * g[..., 0]
        else:  # y_t = a_t + b_t·y_{t+1}: the adjoint runs forward in time
            g = scan_values(gy, torch.cat([zero, beta[..., :-1]], -1), False, torch.zeros_like(init), ctx.fused)
            y_before = torch.cat([y[..., 1:], init.unsqueeze(-1).to(y.dtype)], -1)
            d_init = beta[..., -1] * g[..., -1]
        return g, g * y_before, d_init.to(init.dtype), None, None


def affine_scan(alpha, beta, reverse, initial, fused=False):
    """Differentiable ``y_t = α_t + β_t·y_{t±1}`` along the last dim (``initial``: ``y`` just
    outside the row); ``alpha`` and ``beta`` broadcast against each other."""
    alpha, beta = torch.broadcast_tensors(alpha, beta)
    if torch.is_grad_enabled() and (alpha.requires_grad or beta.requires_grad or initial.requires_grad):
        return AffineScanFunction.apply(alpha, beta, initial, reverse, fused)
    return scan_values(alpha, beta, reverse, initial, fused)
