"""Group statistics for outcome-reward advantages (GRPO, RLOO, ...), framework-neutral: ``[B]`` scores
with a group id each, their broadcast to padded or packed tokens, masked whitening (optionally over a
process group). Torch ops (or, for the statistics on CUDA tensors, one Triton kernel:
:mod:`rollbuf.kernels.group_stats`), no loop, no host sync (capturable in a CUDA graph) but the copy
of a NumPy ``index`` (verl's uid array) to the device. Such an index is grouped on the host; on the
kernel, :func:`outcome_advantages` copies it as its :func:`group_layout` (the samples group by group,
each one's group start and size: one copy) and the kernel sorts nothing. A tensor ``index`` is
grouped on its device: on the kernel, its labels sorted once. Edge rules: docs/semantics.md, "Group
statistics"."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from rollbuf import backends
from rollbuf.validation import FLOATS, checking_finite

__all__ = ["GroupStats", "group_ids", "group_layout", "group_stats", "sequence_scores", "to_tokens", "masked_whiten",
           "outcome_advantages", "token_baseline", "path_weights", "optimal_token_baseline",
           "OUTCOME_ESTIMATORS", "READS_LENGTHS", "BACKENDS"]

#: The backends :func:`group_stats` and :func:`outcome_advantages` take: ``"torch"`` (torch's scatter
#: and index-add reductions, any device, the reference), ``"triton"`` (one kernel: CUDA tensors, or CPU
#: tensors under ``TRITON_INTERPRET=1``), ``"auto"`` (triton for CUDA tensors when Triton is
#: importable, else torch).
BACKENDS = ("auto", "torch", "triton")


class GroupStats(NamedTuple):
    """Per sample, ``[B]``: ``size``, ``mean``, unbiased ``std`` and ``weighted_mean`` of its group;
    ``loo_mean`` and unbiased ``loo_std`` of the group's other members; ``top2_gap``: best minus
    second best score at a group's unique best sample, 0 elsewhere."""

    size: torch.Tensor
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
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def _tensor_index(index, device):
    """An integer tensor ``index`` checked (1-d), on ``device``: its labels as given."""
    if index.dim() != 1 or index.is_floating_point() or index.is_complex():
        raise ValueError(f"index must be a 1-d integer tensor, got {index.dtype} shape {tuple(index.shape)}")
    return index.to(device)


def _host_ranks(index) -> tuple[np.ndarray, np.ndarray]:
    """``(inv, counts)`` of NumPy (or list) labels: each label's group number (int64 ``[B]``, groups
    numbered in order of first appearance for string and object labels, of value for numeric ones)
    and each group's size (``[num_groups]``). String and object labels (verl's uids) are grouped in
    one hashing pass over them (no sort); labels that mix strings with other types, or that cannot
    be hashed, are compared as strings."""
    arr = np.asarray(index)
    if arr.ndim != 1:
        raise ValueError(f"index must be 1-d (one label per sample), got shape {arr.shape}")
    if arr.dtype != object and arr.dtype.kind not in "US":  # numbers: NumPy's sort is fast
        _, inv, counts = np.unique(arr, return_inverse=True, return_counts=True)
        return inv.reshape(-1).astype(np.int64, copy=False), counts
    labels = arr.tolist()
    kinds = set(map(type, labels))
    if len(kinds) > 1 and str in kinds:  # strings among other labels: compared as strings
        labels = [str(x) for x in labels]
    seen: dict = {}
    try:
        inv = np.fromiter((seen.setdefault(x, len(seen)) for x in labels), dtype=np.int64, count=len(labels))
    except TypeError:  # an unhashable label
        seen = {}
        inv = np.fromiter((seen.setdefault(str(x), len(seen)) for x in labels), dtype=np.int64, count=len(labels))
    return inv, np.bincount(inv, minlength=len(seen))


def _host_layout(inv: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``[3, B]``: the samples group by group (a stable sort of the ranks ``inv``: each group's in
    ascending sample order), and per sample its group's start in that order and its size; int32
    (int64 from 2^31 samples on). NumPy only, no Python loop; up to 2^16 groups the ranks are sorted
    as uint16, which NumPy's stable sort takes by radix sort (wider ranks: timsort)."""
    b = inv.size
    out = np.empty((3, b), dtype=np.int32 if b < 2**31 else np.int64)
    out[0] = _group_order(inv, counts)
    out[1] = (np.cumsum(counts) - counts)[inv]
    out[2] = counts[inv]
    return out


def _group_order(inv: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The samples group by group, each group's in ascending sample order: a stable sort of the ranks
    ``inv`` (up to 2^16 groups as uint16, which NumPy's stable sort takes by radix sort)."""
    return np.argsort(inv.astype(np.uint16) if counts.size <= 2**16 else inv, kind="stable")


def _to_device(arr: np.ndarray, device) -> torch.Tensor:
    """A host array as a tensor on ``device``: one host-to-device copy."""
    t = torch.from_numpy(arr)
    return t if device is None else t.to(device)


def group_ids(index, device=None) -> tuple[torch.Tensor, int]:
    """``(ids, num_groups)``: ``[B]`` int64 ids in ``[0, num_groups)``, equal for equal labels. ``index``:
    a 1-d NumPy array (or list) of labels (verl's ``uid``), converted on the host (strings in one
    hashing pass, numbered in order of first appearance; numbers in order of value); or a 1-d integer
    tensor, ranked on its device (``num_groups = B`` then, an upper bound: the rest are empty)."""
    if isinstance(index, torch.Tensor):
        index = _tensor_index(index, device)
        srt, perm = torch.sort(index)
        first = torch.cat([srt.new_ones(min(1, srt.numel()), dtype=torch.bool), srt[1:] != srt[:-1]])
        return torch.empty_like(perm).scatter_(0, perm, first.cumsum(0) - 1), index.numel()
    inv, counts = _host_ranks(index)
    return torch.as_tensor(inv, dtype=torch.int64, device=device), counts.size


def group_layout(index, device=None) -> torch.Tensor:
    """The ``[3, B]`` group layout of a 1-d NumPy array (or list) of labels, as :func:`group_ids`
    groups them, made on the host and copied to ``device`` in one copy: row 0 the samples group by
    group (each group's in ascending sample order), rows 1 and 2 each sample's group's start in row 0
    and its size; int32 (int64 from 2^31 samples on). The Triton kernel of :func:`outcome_advantages`
    reads it instead of sorting ids on the device."""
    if isinstance(index, torch.Tensor):
        raise TypeError("index must be a NumPy array or a list of labels (the layout is made on the host); "
                        "a tensor index is grouped on its device (group_ids)")
    return _to_device(_host_layout(*_host_ranks(index)), device)


def _all_reduce(x, group, op=None):
    if group is not None:
        dist.all_reduce(x, op=op or dist.ReduceOp.SUM, group=group)
    return x


def _backend(backend, device, group) -> str:
    """The concrete backend (``"torch"`` or ``"triton"``) of ``backend`` for tensors on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and group is None and backends.triton_available() else "torch"
    if backend == "triton" and group is not None:
        raise ValueError("backend='triton' takes no process group: use backend='torch' with group=")
    return backends.resolve(backend, device)


def _checked(scores, ids, weights):
    """``(x, w)``: the scores and weights checked (the weights converted, None stays None)."""
    x = _float("scores", scores, 1)
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.shape != x.shape:
        raise ValueError(f"ids must be an int64 tensor of shape {tuple(x.shape)} (group_ids gives it)")
    w = None if weights is None else _float("weights", weights, 1)
    if w is not None and w.shape != x.shape:
        raise ValueError(f"weights must have shape {tuple(x.shape)} (one per score), got {tuple(w.shape)}")
    for name, t in (("ids", ids), ("weights", w)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} must be on the scores' device ({x.device}), got {t.device}")
    return x, w


def _check_groups(ids, num_groups, read_back: bool) -> None:
    """``num_groups`` a non-negative int, and (``read_back``: the torch path on CPU tensors, which
    indexes by them) every id in ``[0, num_groups)``. Ids on a GPU are not read back (no host sync;
    :func:`group_ids` gives ids in range; the kernel compares them for equality only)."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups < 0:
        raise ValueError(f"num_groups must be a non-negative int, got {num_groups!r}")
    if read_back and ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(ids))
        if lo < 0 or hi >= num_groups:
            raise ValueError(f"ids must lie in [0, num_groups) = [0, {num_groups}) (group_ids gives such ids), "
                             f"got ids from {lo} to {hi}")


def group_stats(scores, ids, num_groups: int, weights=None, *, group=None, backend: str = "auto") -> GroupStats:
    """:class:`GroupStats` of ``scores`` ``[B]`` grouped by ``ids`` ``[B]`` (:func:`group_ids`), in float32
    (float64 for float64 scores). ``weights`` ``[B]`` (e.g. response lengths): ``weighted_mean``.
    ``group``: a process group whose ranks hold other samples of the same groups (torch backend).
    Accumulated in float64 as per-group sums about a member's value (docs/semantics.md): equal
    members, and equal other members, give exactly zero spread. ``backend``: :data:`BACKENDS`.
    Ids outside ``[0, num_groups)`` are a ValueError naming ``ids`` on the torch backend with CPU
    tensors; on a GPU they are not read back (no host sync), and the kernel compares ids for equality
    only."""
    x, w = _checked(scores, ids, weights)
    on_kernel = _backend(backend, scores.device, group) == "triton"
    _check_groups(ids, num_groups, read_back=not on_kernel and ids.device.type == "cpu")
    if on_kernel:
        from rollbuf.kernels import group_stats as kernel  # the kernel needs Triton: imported when asked for

        return GroupStats(*kernel.run(scores, ids, weights))
    return _stats(x, ids, num_groups, w, group)


def _stats(x, ids, num_groups: int, w, group=None) -> GroupStats:
    """:func:`group_stats`'s torch path on checked inputs (``ids`` in ``[0, num_groups)``)."""
    dt, x = x.dtype, x.double()
    w = torch.ones_like(x) if w is None else w.double()
    ext = x.new_full((2, num_groups), -math.inf).scatter_reduce_(1, ids.expand(2, -1), torch.stack([x, -x]), "amax")
    hi, lo = _all_reduce(ext, group, dist.ReduceOp.MAX)[:, ids]
    lo, dh, top = -lo, x - hi, x == hi
    hi2 = x.new_full((num_groups,), -math.inf).scatter_reduce_(0, ids, torch.where(top, -math.inf, x), "amax")
    cols = torch.stack([torch.ones_like(x), dh, dh * dh, x - lo, (x - lo) ** 2, top.double(), w, w * dh], 1)
    sums = _all_reduce(x.new_zeros(num_groups, 8).index_add_(0, ids, cols), group)[ids].T
    n, sh, qh, sl, ql, ntop, sw, swd = sums
    mean, alone = hi + sh / n, top & (ntop == 1)  # a unique maximum: its others are summed about the minimum
    c, d = torch.where(alone, lo, hi), torch.where(alone, x - lo, dh)
    s, q, m = torch.where(alone, sl, sh) - d, torch.where(alone, ql, qh) - d * d, n - 1
    gap = torch.where(alone & (n > 1), x - _all_reduce(hi2, group, dist.ReduceOp.MAX)[ids], 0)
    std = torch.where(n > 1, ((qh - sh * sh / n).clamp_min(0) / (n - 1)).sqrt(), 0)
    loo_std = torch.where(m > 1, ((q - s * s / m).clamp_min(0) / (m - 1)).sqrt(), 0)
    bad = mean.isnan()  # a NaN member: every statistic NaN, the spreads of a group of one or two too
    return GroupStats(*(t.to(dt) for t in (
        n, mean, torch.where(bad, mean, std), torch.where(m > 0, c + s / m, x), torch.where(bad, mean, loo_std),
        torch.where(bad, mean, gap), torch.where(sw > 0, hi + swd / sw, mean))))


def _packed(cu_seqlens, total, device):
    """``cu_seqlens`` as int64 after its checks, and a 0-d bool tensor: it is malformed (negative,
    decreasing or ending past ``total``). On the device, no host read (under
    :func:`rollbuf.check_finite`, a malformed ``cu_seqlens`` raises a ``ValueError`` instead)."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be an int32 or int64 torch.Tensor, got "
                        f"{getattr(cu_seqlens, 'dtype', type(cu_seqlens).__name__)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"cu_seqlens must be 1-d [num_seqs + 1], got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device}, the tokens on {device}")
    cu = cu_seqlens.long()
    bad = (cu[0] < 0) | (cu[-1] > total) | (cu[1:] < cu[:-1]).any()
    if checking_finite() and not torch.compiler.is_compiling() and bool(bad):
        raise ValueError(f"cu_seqlens must be non-negative, non-decreasing and end at most at total = {total} "
                         "(rollbuf.check_finite is on: without it every output is NaN)")
    return cu, bad


def _segments(cu_seqlens, total, device):
    """Per token of a packed row of ``total`` tokens, 1 + its sequence (0 before ``cu_seqlens[0]``,
    S + 1 from ``cu_seqlens[-1]`` on), and whether ``cu_seqlens`` is malformed (:func:`_packed`)."""
    cu, bad = _packed(cu_seqlens, total, device)
    # searchsorted of an unsorted (malformed) cu still gives indices in [0, S + 1]: safe to index with
    return torch.searchsorted(cu, torch.arange(total, device=device), right=True), bad


def _spans(cu_seqlens, total, device):
    """The token counts ``[S + 2]`` of the span before ``cu_seqlens[0]``, each sequence and the span
    after ``cu_seqlens[-1]``: never negative and summing to ``total`` even for a malformed
    ``cu_seqlens`` (its outputs are NaN then), so ``repeat_interleave`` can take them with
    ``output_size=total`` and no host read; and whether ``cu_seqlens`` is malformed."""
    cu, bad = _packed(cu_seqlens, total, device)
    c = torch.cummax(cu.clamp(0, total), 0).values
    return torch.diff(c, prepend=c.new_zeros(1), append=c.new_full((1,), total)), bad


def _nan_where(x, bad):
    return torch.where(bad, torch.full((), math.nan, dtype=x.dtype, device=x.device), x)


def sequence_scores(token_level_rewards, cu_seqlens=None):
    """Each row's (``[B, L]`` → ``[B]``) or packed sequence's (``[total]`` or ``[1, total]`` with
    ``cu_seqlens`` ``[S + 1]``, int32 or int64 → ``[S]``) sum of rewards, accumulated in float32
    (float64 stays). Malformed ``cu_seqlens`` (negative, decreasing, or ending past ``total``): every
    output NaN (no host read; a ``ValueError`` naming ``cu_seqlens`` under :func:`rollbuf.check_finite`)."""
    r = token_level_rewards
    dt = _float("token_level_rewards", r[..., :0]).dtype  # checks without a copy
    if cu_seqlens is None:
        return r.sum(-1, dtype=dt)
    if r.dim() not in (1, 2) or r.numel() != r.shape[-1]:
        raise ValueError(f"token_level_rewards must be a packed row, [total] or [1, total], with cu_seqlens; "
                         f"got shape {tuple(r.shape)}")
    seg, bad = _segments(cu_seqlens, r.numel(), r.device)
    out = r.new_zeros(cu_seqlens.numel() + 1, dtype=dt).index_add_(0, seg, r.reshape(-1).to(dt))[1:-1]
    return _nan_where(out, bad)


def to_tokens(values, mask, cu_seqlens=None):
    """``values`` ``[B]`` at the tokens of ``mask`` ``[B, L]`` (``[S]`` at packed ``[total]`` or ``[1, total]``
    tokens, with ``cu_seqlens`` ``[S + 1]``), as the product ``value · mask``: 0 at masked tokens, the
    dtype of a product. The output is the only ``[B, L]`` tensor made. Malformed ``cu_seqlens``: every
    output NaN, as in :func:`sequence_scores`."""
    if not isinstance(values, torch.Tensor) or not isinstance(mask, torch.Tensor) or values.dim() != 1:
        raise TypeError("to_tokens takes values, a 1-d tensor, and mask, a tensor")
    if cu_seqlens is not None:
        if mask.dim() not in (1, 2) or mask.numel() != mask.shape[-1]:
            raise ValueError(f"mask must be a packed row, [total] or [1, total], with cu_seqlens; "
                             f"got {tuple(mask.shape)}")
        spans, bad = _spans(cu_seqlens, mask.numel(), mask.device)
        if values.numel() != cu_seqlens.numel() - 1:
            raise ValueError(f"values must hold one value per sequence of cu_seqlens ({cu_seqlens.numel() - 1}), "
                             f"got {values.numel()}")
        m = mask.reshape(-1)
        v = torch.cat([values.new_zeros(1), values, values.new_zeros(1)])
        v = v.repeat_interleave(spans, output_size=m.numel())  # each token's value: the one [total] tensor
        out = v.mul_(m) if torch.result_type(v, m) == v.dtype else v * m
        return out.masked_fill_(bad, math.nan).reshape(mask.shape)
    if mask.shape[:-1] != values.shape:
        raise ValueError(f"mask must be [B, L] with B = {values.numel()}, got {tuple(mask.shape)}")
    return values.unsqueeze(-1) * mask


def masked_whiten(values, mask, *, shift_mean: bool = True, eps: float = 1e-8, group=None):
    """``(values − mean)·rsqrt(var + eps)``, the mean and Bessel-corrected variance over the tokens
    with ``mask`` nonzero (on every rank of ``group``). ``values``: ``[B, L]`` like ``mask``, or ``[B]``
    row values counted once per masked-in token of their row. docs/semantics.md."""
    x = _float("values", values)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    m = mask if mask.dtype == torch.bool else mask != 0
    row = x.dim() == m.dim() - 1
    if m.shape[: x.dim()] != x.shape or not (row or x.dim() == m.dim()):
        raise ValueError(f"mask must have shape {tuple(x.shape)} or [*{tuple(x.shape)}, L], got {tuple(m.shape)}")
    return _whiten(x, m.sum(-1, dtype=x.dtype) if row else m, shift_mean, eps, group).to(values.dtype)


def _whiten(x, w, shift_mean=True, eps=1e-8, group=None):
    """:func:`masked_whiten` of ``x`` with each entry counted ``w`` times (its masked-in tokens)."""
    xm = torch.where(w > 0, x, 0)
    ns = _all_reduce(torch.stack([w.sum(dtype=x.dtype), (w * xm).sum()]), group)
    mean = ns[1] / ns[0]
    var = _all_reduce((w * (xm - mean).square()).sum(), group) / (ns[0] - 1)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


def _grpo(x, s, eps, norm):  # verl: a group of one has mean 0 and std 1
    a = x - torch.where(s.size == 1, 0, s.mean)
    return a / (torch.where(s.size == 1, 1, s.std) + eps) if norm else a


# verl's per-row advantage from the scores x, their GroupStats s (weights: the response lengths n)
# and k = (epsilon, norm_adv_by_std_in_grpo, f_norm); docs/llm.md, section 10
_OUTCOME = {
    "grpo": lambda x, s, n, k: _grpo(x, s, k[0], k[1]),
    "dr_grpo": lambda x, s, n, k: _grpo(x, s, k[0], False),
    # only a group's unique best has a gap; every other member is exactly 0 (even at 0 / 0)
    "grpo_passk": lambda x, s, n, k: torch.where(s.top2_gap != 0, s.top2_gap / (s.std + k[0]), 0) if k[1]
    else s.top2_gap,
    "rloo": lambda x, s, n, k: torch.where(s.size > 1, x - s.loo_mean, x),
    "rloo_vectorized": lambda x, s, n, k: x - s.loo_mean,
    "opo": lambda x, s, n, k: x - torch.where(s.size == 1, 0, s.weighted_mean),
    "gpg": lambda x, s, n, k: x.numel() / torch.count_nonzero(x).clamp(min=1) * (
        x - torch.where(s.size == 1, 0, s.mean)) / k[2],
    "reinforce_plus_plus_baseline": lambda x, s, n, k: _whiten(x - torch.where(s.size == 1, 0, s.mean), n),
    "gdpo": lambda x, s, n, k: _whiten(_grpo(x, s, k[0], k[1]), n),
}
#: The names :func:`outcome_advantages` takes.
OUTCOME_ESTIMATORS = tuple(_OUTCOME)
#: The estimators that read the response lengths (the others take ``lengths=None``).
READS_LENGTHS = frozenset({"opo", "reinforce_plus_plus_baseline", "gdpo"})
# the estimators the kernel computes whole (float32 statistics): its EST and NORM
_FUSED = {"grpo": (1, None), "dr_grpo": (1, False), "rloo_vectorized": (2, False)}


def outcome_epsilon(v) -> float:
    """``epsilon``, the std's offset: a finite number ``>= 0`` (0 divides an all-equal group by 0)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not 0 <= v < math.inf:
        raise ValueError(f"epsilon must be a finite number >= 0, got {v!r}")
    return float(v)


def _f_norm(v) -> float:
    """GPG's ``f_norm``, the advantages' divisor: a finite number ``> 0``."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not 0 < v < math.inf:
        raise ValueError(f"f_norm must be a finite number > 0, got {v!r}")
    return float(v)


def _lengths(lengths, x, estimator):
    """The response lengths ``[B]`` as weights in the scores' dtype (None stays None), checked."""
    if lengths is None and estimator in READS_LENGTHS:
        raise ValueError(f"lengths must be given for estimator {estimator!r} (it reads the response lengths)")
    if isinstance(lengths, torch.Tensor) and not (lengths.is_floating_point() or lengths.is_complex()):
        lengths = lengths.to(x.dtype)  # token counts, e.g. response_mask.sum(-1): exact in float
    return None if lengths is None else _float("lengths", lengths, 1).to(x.dtype)


def _on_kernel(x, labels, counts, w, estimator, k):
    """:func:`outcome_advantages` on the Triton kernel: NumPy labels (their host ranks ``labels``, the
    group sizes ``counts``) as the host's group layout, one copy to the device and no sort; a tensor
    index as its raw labels, sorted once on the device (no ranking first: the kernel compares labels
    for equality only)."""
    from rollbuf.kernels import group_stats as kernel  # the kernel needs Triton: imported when asked for

    layout = None if counts is None else _to_device(_host_layout(labels, counts), x.device)
    ids = labels if counts is None else None
    if estimator in _FUSED and x.dtype == torch.float32:
        est, norm = _FUSED[estimator]
        return kernel.run(x, ids, None, est, norm=k[1] if norm is None else norm, eps=k[0], layout=layout)
    return _OUTCOME[estimator](x, GroupStats(*kernel.run(x, ids, w, layout=layout)), w, k)


def outcome_advantages(scores, index, lengths=None, estimator: str = "grpo", *, epsilon: float = 1e-6,
                       norm_adv_by_std_in_grpo: bool = True, f_norm: float = 1.0, backend: str = "auto"):
    """verl's outcome advantage ``[B]`` of each row (docs/llm.md, section 10; ``"dr_grpo"``: GRPO
    unnormalised) from its score and response length (``lengths``: OPO's weights, the whitening's
    token counts; None for an estimator not in :data:`READS_LENGTHS`), ``[B]`` each; ``index``:
    :func:`group_ids`'s. ``backend``: :func:`group_stats`'s (on the kernel a NumPy ``index`` goes to
    the device as its :func:`group_layout`, a tensor one is sorted once). Broadcast with :func:`to_tokens`."""
    if estimator not in _OUTCOME:
        raise ValueError(f"estimator must be one of {OUTCOME_ESTIMATORS}, got {estimator!r}")
    x = _float("scores", scores, 1)
    # a tensor: its labels on the device (counts None); NumPy labels: their ranks and group sizes, on the host
    labels, counts = (_tensor_index(index, x.device), None) if isinstance(index, torch.Tensor) else _host_ranks(index)
    w = _lengths(lengths, x, estimator)
    if len(labels) != x.numel():
        raise ValueError(f"index must hold one label per row ({x.numel()}), got {len(labels)}")
    if w is not None and w.shape != x.shape:
        raise ValueError(f"lengths must hold one entry per row ({x.numel()}), got {len(w)}")
    if estimator == "grpo_passk" and counts is not None and counts.min(initial=2) < 2:
        raise ValueError("index: pass@k needs at least 2 samples per group")
    k = (outcome_epsilon(epsilon), norm_adv_by_std_in_grpo, _f_norm(f_norm))
    if _backend(backend, x.device, None) == "triton":
        return _on_kernel(x, labels, counts, w, estimator, k)
    ids, n = group_ids(labels) if counts is None else (torch.as_tensor(labels, device=x.device), counts.size)
    return _OUTCOME[estimator](x, _stats(x, ids, n, w), w, k)


def token_baseline(returns, weights, index, lengths, *, epsilon: float = 1e-8, zero_tail: bool = True,
                   member=None):
    """The optimal token baseline ``B[i, t] = Σ_g G_t·W_t / (Σ_g W_t + ε)`` ``[B, L]``: at each token
    position ``t``, the ``weights``-weighted mean of ``returns`` over the rows of row ``i``'s group
    (``index``: :func:`group_ids`'s labels), both ``[B, L]`` and already 0 where a row has no token.
    A group of one row has baseline 0. ``zero_tail``: a group's longest row (``lengths`` ``[B]``), if
    it is the only one that long, gets baseline 0 from the second longest row's length on.
    ``member`` ``[B]`` bool: the rows that belong to their group (None: all; the others count in no
    group's size and get baseline 0). One pass of per-group sums over ``[groups, L]``: no loop over rows
    or groups, no host read but a NumPy ``index``'s ranking (docs/llm.md, verl's optimal token baseline)."""
    ids, n = group_ids(index, returns.device)
    if len(ids) != returns.shape[0]:
        raise ValueError(f"index must hold one label per row ({returns.shape[0]}), got {len(ids)}")
    eps = outcome_epsilon(epsilon)
    one = torch.ones(ids.shape, dtype=returns.dtype, device=returns.device)
    if member is not None:
        one = one * member
        lengths = torch.where(member, lengths, -1)
    size = one.new_zeros(n).index_add_(0, ids, one)
    num = returns.new_zeros(n, returns.shape[1]).index_add_(0, ids, returns * weights)
    den = weights.new_zeros(n, returns.shape[1]).index_add_(0, ids, weights) + eps
    grouped = (size[ids] > 1) if member is None else (size[ids] > 1) & member
    b = torch.where(grouped[:, None], (num / den).to(returns.dtype)[ids], 0)
    if not zero_tail:
        return b
    longest = lengths.new_full((n,), -1).scatter_reduce_(0, ids, lengths, "amax")[ids]
    top = lengths == longest
    ties = one.new_zeros(n).index_add_(0, ids, top.to(one.dtype))[ids]
    second = lengths.new_full((n,), -1).scatter_reduce_(0, ids, torch.where(top, -1, lengths), "amax")[ids]
    steps = torch.arange(returns.shape[1], device=returns.device)
    tail = (grouped & top & (ties == 1))[:, None] & (steps >= second[:, None])
    return b.masked_fill(tail, 0)



def path_weights(old_log_probs, sum_pi_squared, rollout_is_weights, response_mask):
    """verl's ``W_t = Σ_{j≤t} (1 − 2π_j + Σπ²_j)·ρ̄_j²·m_j`` ``[B, L]`` (``π = exp(old_log_probs)``;
    ``rollout_is_weights`` ``ρ̄`` None: 1): the optimal token baseline's cumulative path-variance proxy."""
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights**2
    return (w * response_mask).cumsum(dim=-1)


_OTB_MASKS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32)


def optimal_token_baseline(returns, response_mask, index, weights, *, epsilon: float = 1e-8, zero_tail: bool = True,
                           backend: str = "auto"):
    """verl's optimal token baseline advantages ``(G − B)·m`` ``[B, L]`` from the returns ``G`` and the
    policy's ``weights = (old_log_probs, sum_pi_squared, rollout_is_weights or None)``, each ``[B, L]``:
    ``W_t = Σ_{j≤t} (1 − 2·exp(lp_j) + Σπ²_j)·ρ̄_j²·m_j`` and ``B`` of :func:`token_baseline`.
    On the kernel (``backend``: :func:`group_stats`'s; a NumPy ``index``, groups of at most
    :data:`rollbuf.kernels.token_baseline.MAX_GROUP` rows, float32 inputs and a bool, integer or
    float32 mask) one program per group reads every input once and writes the advantages once;
    otherwise torch ops over ``[B, L]`` and ``[groups, L]`` (the same values, summed in another order)."""
    lp, spi2, isw = weights
    m = response_mask
    if (_backend(backend, returns.device, None) == "triton" and not isinstance(index, torch.Tensor)
            and m.dtype in _OTB_MASKS and all(x is None or x.dtype == torch.float32 for x in (returns, lp, spi2, isw))):
        from rollbuf.kernels import token_baseline as kernel  # the kernel needs Triton: imported when asked for

        inv, counts = _host_ranks(index)
        if len(inv) != returns.shape[0]:
            raise ValueError(f"index must hold one label per row ({returns.shape[0]}), got {len(inv)}")
        if counts.max(initial=0) <= kernel.MAX_GROUP:
            b = inv.size
            host = np.concatenate([_group_order(inv, counts), np.cumsum(counts) - counts, counts])
            dev = _to_device(host.astype(np.int32 if b < 2**31 else np.int64), returns.device)
            layout = (dev[:b], dev[b:b + counts.size], dev[b + counts.size:], int(counts.max(initial=1)))
            return kernel.run(returns, m, lp, spi2, isw, layout, epsilon=outcome_epsilon(epsilon), zero_tail=zero_tail)
    W = path_weights(lp, spi2, isw, m)
    b = token_baseline(returns, W * m, index, m.sum(dim=-1).long(), epsilon=epsilon, zero_tail=zero_tail)
    return (returns - b) * m
