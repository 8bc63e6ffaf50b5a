"""Group statistics for outcome-reward advantages (GRPO, RLOO, OPO, pass@k, ...), framework-neutral.

``[B]`` scores, one per sample, with a group id each (the samples of one prompt): the statistics of
each sample's group, of its other members (leave-one-out), whitening over masked tokens (optionally
over a process group), and the broadcast of ``[B]`` values to ``[B, L]`` padded or ``[total]``
packed tokens. Plain torch ops (``index_add_``, ``scatter_reduce``): no loop, no host sync, the
same code on CPU and GPU (capturable in a CUDA graph). Edge rules: docs/semantics.md, "Groups".
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from rollbuf.validation import FLOATS

__all__ = ["GroupStats", "group_ids", "group_stats", "sequence_scores", "to_tokens", "masked_whiten"]


class GroupStats(NamedTuple):
    """Per sample, ``[B]``: ``count``, ``mean``, unbiased ``std`` and length-``weighted_mean`` of its
    group; ``loo_mean``, unbiased ``loo_std`` of the group's other members; ``top2_gap``: the best
    score minus the second best at a group's unique best sample, 0 at every other sample."""

    count: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    loo_mean: torch.Tensor
    loo_std: torch.Tensor
    top2_gap: torch.Tensor
    weighted_mean: torch.Tensor


def _float(name, x, dim=None):
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOATS:
        raise TypeError(f"{name} must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must be {dim}-d, got shape {tuple(x.shape)}")
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)  # fp16/bf16 accumulate in fp32


def group_ids(index, device=None) -> tuple[torch.Tensor, int]:
    """``(ids, num_groups)``: ``[B]`` int64 ids in ``[0, num_groups)``, equal ids for equal labels.

    ``index``: a 1-d NumPy array (or list) of labels, strings or ints (verl's ``uid``), converted
    once on the host; or a 1-d integer tensor, ranked on its device with no host sync (then
    ``num_groups = B``, an upper bound: unused ids are empty groups)."""
    if isinstance(index, torch.Tensor):
        if index.dim() != 1 or index.is_floating_point() or index.is_complex():
            raise ValueError(f"index must be a 1-d integer tensor, got {index.dtype} shape {tuple(index.shape)}")
        srt, perm = torch.sort(index.to(device))
        first = torch.cat([srt.new_ones(min(1, srt.numel()), dtype=torch.bool), srt[1:] != srt[:-1]])
        return torch.empty_like(perm).scatter_(0, perm, first.cumsum(0) - 1), index.numel()
    arr = np.asarray(index)
    if arr.ndim != 1:
        raise ValueError(f"index must be 1-d (one label per sample), got shape {arr.shape}")
    try:
        inv = np.unique(arr, return_inverse=True)[1]
    except TypeError:  # labels of mixed types: compared as strings
        inv = np.unique(arr.astype(str), return_inverse=True)[1]
    return torch.as_tensor(inv.reshape(-1), dtype=torch.int64, device=device), int(inv.max(initial=-1)) + 1


def _all_reduce(x, group, op=None):
    if group is not None:
        dist.all_reduce(x, op=op or dist.ReduceOp.SUM, group=group)
    return x


def group_stats(scores, ids, num_groups: int, weights=None, *, group=None) -> GroupStats:
    """:class:`GroupStats` of ``scores`` ``[B]`` grouped by ``ids`` ``[B]`` (from :func:`group_ids`).

    Accumulated in float32 (float64 for float64 scores) as per-group partial sums about a shift
    (the group's maximum, or its minimum for the leave-one-out statistics of a unique maximum):
    equal members give exactly zero spread, and so do the other members of a sample when they are
    all equal. ``weights`` ``[B]`` (e.g. response lengths) give ``weighted_mean``; ``group``: a
    process group whose ranks hold other samples of the same groups (sums all-reduced)."""
    x, w = _float("scores", scores, 1), None if weights is None else _float("weights", weights, 1)
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.shape != x.shape:
        raise ValueError(f"ids must be an int64 tensor of shape {tuple(x.shape)} (group_ids gives it)")
    inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
    ext = x.new_full((2, num_groups), -inf).scatter_reduce_(1, ids.expand(2, -1), torch.stack([x, -x]), "amax")
    hi, lo = _all_reduce(ext, group, dist.ReduceOp.MAX)[:, ids] * torch.tensor([[1], [-1]], device=x.device)
    dh, dl, top = x - hi, x - lo, x == hi
    hi2 = _all_reduce(x.new_full((num_groups,), -inf).scatter_reduce_(0, ids, torch.where(top, -inf, x), "amax"),
                      group, dist.ReduceOp.MAX)[ids]
    w = torch.ones_like(x) if w is None else w
    cols = torch.stack([torch.ones_like(x), dh, dh * dh, dl, dl * dl, top.to(x.dtype), w, w * dh], 1)
    n, sh, qh, sl, ql, ntop, sw, swd = _all_reduce(x.new_zeros(num_groups, 8).index_add_(0, ids, cols), group)[ids].T
    zero = x.new_zeros(())
    mean = hi + sh / n
    std = torch.where(n > 1, ((qh - sh * sh / n).clamp_min(0) / (n - 1)).sqrt(), zero)
    alone = top & (ntop == 1)  # the unique maximum: its others' shift is the group minimum
    c, d = torch.where(alone, lo, hi), torch.where(alone, dl, dh)
    s, q, m = torch.where(alone, sl, sh) - d, torch.where(alone, ql, qh) - d * d, n - 1
    loo_mean = torch.where(m > 0, c + s / m, x)
    loo_std = torch.where(m > 1, ((q - s * s / m).clamp_min(0) / (m - 1)).sqrt(), zero)
    gap = torch.where(mean.isnan(), mean, torch.where(alone & (n > 1), x - hi2, zero))
    return GroupStats(n, mean, std, loo_mean, loo_std, gap, torch.where(sw > 0, hi + swd / sw, mean))


def sequence_scores(token_level_rewards, cu_seqlens=None):
    """The score of each row (``[B, L]`` → ``[B]``) or packed sequence (``[total]`` or ``[1, total]``
    with ``cu_seqlens`` ``[S + 1]`` → ``[S]``): the sum of its rewards, accumulated in float32."""
    dt = _float("token_level_rewards", token_level_rewards[..., :0]).dtype  # checks without a [B, L] copy
    if cu_seqlens is None:
        return token_level_rewards.sum(-1, dtype=dt)
    return torch.segment_reduce(token_level_rewards.reshape(-1).to(dt), "sum", offsets=cu_seqlens.long())


def to_tokens(values, mask, cu_seqlens=None):
    """``values`` ``[B]`` (``[S]``) broadcast to the tokens of ``mask`` ``[B, L]`` (packed: ``[total]``
    or ``[1, total]`` with ``cu_seqlens``) as the product ``value · mask``: 0 at masked tokens
    (NaN for a NaN value), the dtype promoted as a product's."""
    if not isinstance(mask, torch.Tensor) or not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise TypeError("to_tokens takes values, a 1-d tensor, and mask, a tensor")
    if cu_seqlens is None:
        if mask.shape[:-1] != values.shape:
            raise ValueError(f"mask must be [B, L] with B = {values.numel()}, got {tuple(mask.shape)}")
        return values.unsqueeze(-1) * mask
    cu = cu_seqlens.long()
    lens = torch.cat([cu[:1], cu.diff(), mask.numel() - cu[-1:]])
    v = torch.cat([values.new_zeros(1), values, values.new_zeros(1)])
    return (v.repeat_interleave(lens, output_size=mask.numel()) * mask.reshape(-1)).reshape(mask.shape)


def masked_whiten(values, mask, *, shift_mean: bool = True, eps: float = 1e-8, group=None):
    """``(values − mean)·rsqrt(var + eps)`` with the mean and Bessel-corrected variance over the
    masked-in tokens (over every rank of ``group`` when given). ``values``: ``[B, L]`` like ``mask``,
    or ``[B]`` row values, each counted once per masked-in token of its row. Masked-out entries
    never enter the statistics (NaN included) but are whitened too; fewer than two masked-in
    tokens give NaN. Float32 statistics (float64 for float64), the output in ``values``' dtype."""
    x = _float("values", values)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    m = mask if mask.dtype == torch.bool else mask != 0
    row = x.dim() == m.dim() - 1
    if m.shape[: x.dim()] != x.shape or not (row or x.dim() == m.dim()):
        raise ValueError(f"mask must have shape {tuple(x.shape)} or [*{tuple(x.shape)}, L], got {tuple(m.shape)}")
    w = m.sum(-1, dtype=x.dtype) if row else m
    xm = torch.where(w > 0, x, 0)
    ns = _all_reduce(torch.stack([w.sum(dtype=x.dtype), (w * xm).sum()]), group)
    mean = ns[1] / ns[0]
    var = _all_reduce((w * (xm - mean).square()).sum(), group) / (ns[0] - 1)
    out = (x - mean) * torch.rsqrt(var + eps)
    return (out if shift_mean else out + mean).to(values.dtype)
