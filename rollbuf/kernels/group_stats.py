"""The group statistics of :func:`rollbuf.groups.group_stats` in one Triton kernel (no atomics,
deterministic, ``O(B × group size)``), optionally fused with verl's per-row GRPO or vectorized
RLOO formula.

A group's members are ``perm[start:start + size]`` of a permutation ``perm`` that lists the samples
group by group, each group's in ascending sample order. Either the host made that layout
(:func:`rollbuf.groups.group_layout`, from NumPy labels: ``perm`` and, per sample, its group's
``start`` and ``size``, one ``[3, B]`` copy to the device; the kernel loads each sample's two
numbers: one launch, no sort), or the ids (any integer labels, compared for equality only) are
sorted on the device (``srt, perm = sort(ids, stable=True)``: one sort and one launch) and each
program finds each of its samples' ``[start, end)`` in ``srt`` by a vectorised binary search (the
``p_start`` absent). Either way each program takes ``BLOCK_I`` samples and walks each one's
group members in tiles of ``BLOCK_K`` twice, in the same order, so both give the same outputs bit
for bit: first the extremes (``hi``, ``lo``; NaN for a group with a NaN member), then the sums
about them, accumulated in float64 exactly as the torch path forms them (docs/semantics.md, "Group
statistics"): ``n``, ``Σ(x−hi)``, ``Σ(x−hi)²``, ``Σ(x−lo)``, ``Σ(x−lo)²``, the count of members at
``hi``, the best score below ``hi``, ``Σw``, ``Σw(x−hi)``. A sample's leave-one-out sums are its
group's sums about ``hi`` (``lo`` at a unique maximum) less its own term, so equal members and
equal other members give exactly zero spread. The loop bound is the longest group of the
program's samples, read on the device: no host read.
"""

from __future__ import annotations

import functools
from collections import namedtuple

import torch
import triton
import triton.language as tl

from rollbuf.kernels import host

__all__ = ["run", "STATS", "GRPO", "RLOO"]

STATS, GRPO, RLOO = 0, 1, 2  # EST: the seven statistics; verl's GRPO advantage; vectorized RLOO's
BLOCK_I, BLOCK_K, WARPS = 32, 16, 4
# the kernel's ``groups``: either the ids and their sort (ids, sorted ids, the sort's permutation; start
# and size None: found by binary search), or the host's layout (permutation, start, size; ids None)
Groups = namedtuple("Groups", "p_ids p_srt p_perm p_start p_size")


@triton.jit
def _bisect(p_srt, g, lo, hi, B, UPPER: tl.constexpr):
    """One step of the search for the first position in ``srt`` whose id is ``> g`` (``UPPER``) or ``>= g``."""
    mid = (lo + hi) // 2
    v = tl.load(p_srt + mid, mask=mid < B, other=0)
    right = (v <= g) if UPPER else (v < g)
    live = lo < hi
    return tl.where(live & right, mid + 1, lo), tl.where(live & ~right, mid, hi)


@triton.jit
def _group(p_srt, g, B, steps):
    """Each sample's group ``[start, end)`` in ``srt``: two binary searches, stepped together (their
    loads are independent)."""
    lo = tl.zeros(g.shape, tl.int32)
    hi, lo2, hi2 = lo + B, lo, lo + B
    for _step in range(steps):
        lo, hi = _bisect(p_srt, g, lo, hi, B, False)
        lo2, hi2 = _bisect(p_srt, g, lo2, hi2, B, True)
    return lo, lo2


@triton.jit
def _members(p_x, p_perm, start, ln, k0, BLOCK_K: tl.constexpr):
    """The tile ``[BLOCK_I, BLOCK_K]`` of members ``k0 + k`` of each sample's group: index, score
    (float64), mask."""
    k = k0 + tl.arange(0, BLOCK_K)
    mk = k[None, :] < ln[:, None]
    j = tl.load(p_perm + start[:, None] + k[None, :], mask=mk, other=0)
    return j, tl.load(p_x + j, mask=mk, other=0).to(tl.float64), mk


@triton.jit
def _extremes(p_x, p_perm, start, ln, kmax, BLOCK_K: tl.constexpr):
    """Each sample's group maximum and minimum, both NaN for a group with a NaN member."""
    hi = tl.full(start.shape, float("-inf"), tl.float64)
    lo = tl.full(start.shape, float("inf"), tl.float64)
    bad = tl.zeros(start.shape, tl.int32)
    for k0 in range(0, kmax, BLOCK_K):
        _, xj, mk = _members(p_x, p_perm, start, ln, k0, BLOCK_K)
        hi = tl.maximum(hi, tl.max(tl.where(mk & (xj == xj), xj, float("-inf")), 1))
        lo = tl.minimum(lo, tl.min(tl.where(mk & (xj == xj), xj, float("inf")), 1))
        bad += tl.sum((mk & (xj != xj)).to(tl.int32), 1)
    return tl.where(bad > 0, float("nan"), hi), tl.where(bad > 0, float("nan"), lo)


@triton.jit
def _sums(p_x, p_w, p_perm, start, ln, kmax, hi, lo, HAS_W: tl.constexpr, BLOCK_K: tl.constexpr):
    """Per sample, its group's sums about ``hi`` and ``lo`` (module docstring)."""
    z = tl.zeros(start.shape, tl.float64)
    n, sh, qh, sl, ql, ntop, sw, swd = z, z, z, z, z, z, z, z
    hi2 = tl.full(start.shape, float("-inf"), tl.float64)
    for k0 in range(0, kmax, BLOCK_K):
        j, xj, mk = _members(p_x, p_perm, start, ln, k0, BLOCK_K)
        dh, dl, top = xj - hi[:, None], xj - lo[:, None], xj == hi[:, None]
        n += tl.sum(mk.to(tl.float64), 1)
        sh += tl.sum(tl.where(mk, dh, 0.0), 1)
        qh += tl.sum(tl.where(mk, dh * dh, 0.0), 1)
        sl += tl.sum(tl.where(mk, dl, 0.0), 1)
        ql += tl.sum(tl.where(mk, dl * dl, 0.0), 1)
        ntop += tl.sum((mk & top).to(tl.float64), 1)
        hi2 = tl.maximum(hi2, tl.max(tl.where(mk & ~top, xj, float("-inf")), 1))
        wj = tl.load(p_w + j, mask=mk, other=0).to(tl.float64) if HAS_W else mk.to(tl.float64)
        sw += tl.sum(tl.where(mk, wj, 0.0), 1)
        swd += tl.sum(tl.where(mk, wj * dh, 0.0), 1)
    return n, sh, qh, sl, ql, ntop, hi2, sw, swd


@triton.jit
def _spread(q, s, m):
    """The unbiased standard deviation from the sums ``s``, ``q`` of ``m`` values about a shift
    (0 for ``m < 2``; a negative rounding residue of the variance is 0, NaN stays)."""
    v = q - s * s / m
    v = tl.where(v < 0, 0.0, v)
    return tl.where(m > 1, tl.sqrt(v / (m - 1)), 0.0)


@triton.jit
def group_stats_kernel(p_x, p_w, groups, p_out, B, steps, eps, EST: tl.constexpr, NORM: tl.constexpr,
                       BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr):
    """``p_out``: ``[7, B]`` statistics in GroupStats order (``EST == STATS``), else the ``[B]``
    advantage; in ``p_out``'s dtype, computed in float64 and the advantage in that dtype; ``p_w``:
    the weights, None = 1 each. A group's members are ``perm[start:start + size]`` (:data:`Groups`):
    with ``p_start`` None each sample's ``start`` and ``size`` found by binary search of its id
    ``p_ids`` in the sorted ids ``p_srt`` (``steps`` bisection steps), else loaded from ``p_start``
    and ``p_size`` (the host's layout; ``p_ids``, ``p_srt`` and ``steps`` not read)."""
    G = Groups(*groups)
    p_ids, p_srt, p_perm, p_start, p_size = G.p_ids, G.p_srt, G.p_perm, G.p_start, G.p_size
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    ok = i < B
    if p_start is None:
        g = tl.load(p_ids + i, mask=ok, other=0)
        start, end = _group(p_srt, g, B, steps)
        ln = tl.where(ok, end - start, 0)
    else:  # two independent loads instead of 2·log2(B) dependent ones
        start = tl.load(p_start + i, mask=ok, other=0)
        ln = tl.load(p_size + i, mask=ok, other=0)
    kmax = tl.max(ln, 0)
    x = tl.load(p_x + i, mask=ok, other=0).to(tl.float64)
    hi, lo = _extremes(p_x, p_perm, start, ln, kmax, BLOCK_K)
    n, sh, qh, sl, ql, ntop, hi2, sw, swd = _sums(p_x, p_w, p_perm, start, ln, kmax, hi, lo, p_w is not None, BLOCK_K)
    mean = hi + sh / n
    bad = mean != mean  # a NaN member: every statistic NaN, the spreads of a group of one or two too
    std = tl.where(bad, mean, _spread(qh, sh, n))
    alone = (x == hi) & (ntop == 1)  # a unique maximum: its others are summed about the minimum
    d = tl.where(alone, x - lo, x - hi)
    s, q, m = tl.where(alone, sl, sh) - d, tl.where(alone, ql, qh) - d * d, n - 1
    loo_mean = tl.where(m > 0, tl.where(alone, lo, hi) + s / m, x)
    dt = p_out.dtype.element_ty
    if EST == 0:
        gap = tl.where(alone & (n > 1), x - hi2, 0.0)
        tl.store(p_out + i, n.to(dt), mask=ok)
        tl.store(p_out + B + i, mean.to(dt), mask=ok)
        tl.store(p_out + 2 * B + i, std.to(dt), mask=ok)
        tl.store(p_out + 3 * B + i, loo_mean.to(dt), mask=ok)
        tl.store(p_out + 4 * B + i, tl.where(bad, mean, _spread(q, s, m)).to(dt), mask=ok)
        tl.store(p_out + 5 * B + i, tl.where(bad, mean, gap).to(dt), mask=ok)
        tl.store(p_out + 6 * B + i, tl.where(sw > 0, hi + swd / sw, mean).to(dt), mask=ok)
    elif EST == 1:  # verl: a group of one has mean 0 and std 1; in the statistics' dtype, as torch
        a = x.to(dt) - tl.where(n == 1, 0.0, mean.to(dt)).to(dt)
        if NORM:
            a = tl.math.div_rn(a, tl.where(n == 1, 1.0, std.to(dt)).to(dt) + eps)
        tl.store(p_out + i, a, mask=ok)
    else:
        tl.store(p_out + i, x.to(dt) - loo_mean.to(dt), mask=ok)


@functools.cache
def _kernel(est: int, norm: bool) -> host.Kernel:
    const = dict(EST=est, NORM=norm, BLOCK_I=BLOCK_I, BLOCK_K=BLOCK_K)
    return host.Kernel(group_stats_kernel, const, WARPS, ("p_x", "p_w", "groups", "p_out", "B", "steps", "eps"))


_NARROW = (torch.bool, torch.int8, torch.uint8, torch.int16)


def _keys(ids: torch.Tensor) -> torch.Tensor:
    """``ids`` as the sort's keys: int32 and int64 as they are (a 32-bit radix sort is the cheaper),
    narrower integers as int32, wider unsigned ones as int64 (the kernel compares keys for equality
    only: a one-to-one conversion is all it needs)."""
    if ids.dtype in (torch.int32, torch.int64):
        return ids
    return ids.to(torch.int32 if ids.dtype in _NARROW else torch.int64)


def _groups(ids: torch.Tensor | None, layout: torch.Tensor | None, B: int, device) -> dict:
    """The kernel's group arguments: the host's ``layout`` as it is, or ``ids`` sorted on the device
    (stable: a group's members in ascending sample order, as in the layout)."""
    if layout is None:
        if not isinstance(ids, torch.Tensor) or ids.shape != (B,) or ids.is_floating_point() or ids.is_complex():
            raise ValueError(f"ids must be a [{B}] integer tensor when no layout is given")
        keys = _keys(ids.contiguous())
        srt, perm = torch.sort(keys, stable=True)
        return dict(groups=(keys, srt, perm, None, None), steps=B.bit_length())
    if not isinstance(layout, torch.Tensor) or layout.shape != (3, B) or layout.device != device \
            or layout.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"layout must be a [3, {B}] int32 or int64 tensor on {device} (groups.group_layout "
                         f"gives it), got {getattr(layout, 'dtype', type(layout).__name__)} "
                         f"{tuple(getattr(layout, 'shape', ()))}")
    perm, start, size = layout.contiguous()
    return dict(groups=(None, None, perm, start, size), steps=0)


def run(x: torch.Tensor, ids: torch.Tensor | None, w: torch.Tensor | None = None, est: int = STATS, *,
        norm: bool = True, eps: float = 0.0, layout: torch.Tensor | None = None) -> torch.Tensor:
    """The ``[7, B]`` statistics of ``x`` ``[B]`` (any float dtype, read as float64) grouped by
    ``ids`` ``[B]`` (integer labels of any values, compared for equality only) with weights ``w``
    ``[B]`` (None: 1 each), float32 (float64 for float64 ``x``); or, with ``est`` GRPO or RLOO, the
    ``[B]`` advantage (float32 statistics only: ``eps`` reaches the kernel as a float32). ``layout``:
    the ``[3, B]`` group layout made on the host (:func:`rollbuf.groups.group_layout`): one launch,
    ``ids`` not read (None will do); without it, ``ids`` are sorted on the device (int32 and int64
    in their own dtype): one sort and one launch. No host read; the same outputs either way."""
    B = x.numel()
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = torch.empty((7, B) if est == STATS else (B,), dtype=dt, device=x.device)
    if B == 0:
        return out
    x = x.contiguous()
    args = dict(p_x=x, p_w=None if w is None else w.contiguous(), p_out=out, B=B, eps=float(eps),
                **_groups(ids, layout, B, x.device))
    kernel = _kernel(est, bool(norm))
    grid = triton.cdiv(B, BLOCK_I)
    if x.device.type == "cuda":
        with torch.cuda.device(x.device):
            kernel(grid, args, x.device.index)
    else:
        kernel(grid, args, None)
    return out
