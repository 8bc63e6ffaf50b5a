"""The LLM token estimators of :mod:`rollbuf.integrations.llm` on sequences sharded across a
context-parallel process group (``layout="contiguous"``: rank ``i`` of ``W`` holds chunk ``i`` of
every sequence; ``"zigzag"``: of ``2W`` chunks, ``i`` and ``2W−1−i``). Each rank passes its shard and
gets its shard of the one-process result. Every (sequence, chunk) piece is one affine map of the scan
``Z_t = α_t + β_t·Z_{next model token}``; one ``all_gather`` of ``[S + 1, P, 4]`` numbers per rank
(the maps, the map if the piece holds its sequence's end, whether it has a model token) gives every
rank the state past each of its pieces, which enters the local call as a truncation's bootstrap
value (the same arithmetic). No host reads and no tensor built from host data: on CUDA nothing
synchronises but the collectives (``check_finite`` on, or a NumPy ``index`` to ``outcome_advantages``,
aside). docs/distributed.md: layouts, contract, bytes.
"""

from __future__ import annotations

import collections
import math

import torch

from rollbuf import functional as F
from rollbuf import groups, validation
from rollbuf.backends import scan
from rollbuf.boundary.coefficients import compose
from rollbuf.estimators import unit_interval
from rollbuf.kernels.td_lambda.coefficients import lambda_step

__all__ = ["compute_gae_advantage_return", "discounted_returns", "packed_gae", "packed_discounted_returns",
           "masked_whiten", "sequence_sums", "outcome_advantages", "LAYOUTS"]

#: Values of ``layout``.
LAYOUTS = ("contiguous", "zigzag")

# A rank's tokens as one [N, L] block (padded rows, or one packed stream): rewards and values as given
# (v None: the returns), m the model tokens, key [N·L] each token's piece (line · P + slot); per line
# (row / sequence; the last line holds no token) trunc, and boot = V(s') where truncated; bad (0-d):
# this rank's layout arguments broke their convention.
_Shard = collections.namedtuple("_Shard", "r v m key trunc boot bad")
_Call = collections.namedtuple("_Call", "gamma lam layout group backend out_dtype")


def _dist(group):
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("rollbuf.context_parallel needs an initialised torch.distributed process group "
                           "(torch.distributed.init_process_group); for one process use rollbuf.integrations.llm")
    return dist, dist.get_rank(group), dist.get_world_size(group)


def _all_gather(x, group):
    """``x`` of every rank, stacked on a new last dim (list all_gather: gloo and NCCL)."""
    dist, _, world = _dist(group)
    out = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(out, x.contiguous(), group=group)
    return torch.stack(out, -1)


def _dtype(x):  # the accumulation dtype
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _slots(layout):
    """``P``: a rank's chunks of each sequence (1: contiguous, 2: zigzag)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return 1 if layout == "contiguous" else 2


def _chunks(layout, world, device):
    """``[P, W]``: the chunk (time order) of each slot of each rank, made on ``device`` (no copy of
    host data: zigzag rank ``q`` holds chunks ``q`` and ``2W−1−q``)."""
    q = torch.arange(world, device=device)
    return q.unsqueeze(0) if _slots(layout) == 1 else torch.stack([q, 2 * world - 1 - q])


# ------------------------------------------------------------------------------------ the exchange


def _pieces(sh: _Shard, P):
    """Per token ``[N·L]``: the last token, the last model token of its piece; per piece ``[K]``:
    its first token (``N·L`` if empty), whether it has a model token."""
    n = sh.key.numel()
    idx = torch.arange(n, device=sh.key.device)

    def reduce(src, how, fill):
        start = torch.full((sh.trunc.numel() * P,), fill, dtype=torch.long, device=idx.device)
        return start.scatter_reduce(0, sh.key, src, reduce=how)

    last, live = reduce(idx, "amax", -1), reduce(torch.where(sh.m.reshape(-1), idx, -1), "amax", -1)
    return idx == last[sh.key], idx == live[sh.key], reduce(idx, "amin", n), live >= 0


def _payload(sh: _Shard, c: _Call, pieces, dt):
    """``[lines, P, 4]``: per piece ``(a, b)``, ``a`` if its last model token ends the sequence, and
    whether it has a model token (the last line: this rank's ``bad`` flag)."""
    (N, L), P = sh.m.shape, _slots(c.layout)
    cut, end, first, live = pieces
    m, line = sh.m.reshape(-1), sh.key // P
    r = torch.where(m, sh.r.reshape(-1).to(dt), 0)
    v = torch.zeros_like(r) if sh.v is None else torch.where(m, sh.v.reshape(-1).to(dt), 0)
    tr = sh.trunc[line].to(dt)
    alpha, beta = lambda_step(r, v, 0.0, 0.0, None, c.gamma, c.lam)
    alpha_end, _ = lambda_step(r, v, 1.0 - tr, tr, sh.boot[line], c.gamma, c.lam)
    a_in, b_in = torch.where(m, alpha, 0), torch.where(m, torch.full_like(r, beta), 1)
    b_cut = torch.where(cut, 0, b_in)  # the scan stops at each piece's last token
    alphas = torch.stack([a_in, torch.where(cut, b_in, 0), torch.where(end, alpha_end, a_in)])
    betas = torch.stack([b_cut, b_cut, torch.where(end, 0, b_cut)])
    y = F.affine_scan(alphas.view(3, N, L), betas.view(3, N, L), reverse=True, backend="torch")
    identity = torch.stack([y.new_zeros(1), y.new_ones(1), y.new_zeros(1)])  # [3, 1]: an empty piece's map
    y = torch.cat([y.reshape(3, -1), identity], -1)
    out = torch.cat([y[:, first].T, live.to(dt).unsqueeze(-1)], -1).view(-1, P, 4)
    out[-1, 0, 3] = sh.bad.to(dt)
    return out


def _carries(sh: _Shard, c: _Call, pieces, dt):
    """Per piece of this rank ``[lines, P]``: the state past it, whether it holds its line's end;
    and whether any rank's layout arguments were bad (0-d)."""
    _, rank, world = _dist(c.group)
    g = _all_gather(_payload(sh, c, pieces, dt), c.group)  # [lines, P, 4, W]
    order = _chunks(c.layout, world, g.device)  # [P, W]
    g = g.permute(0, 2, 1, 3).reshape(g.shape[0], 4, -1)[..., torch.argsort(order.reshape(-1))]
    a, b, a_end, live = g[:-1].unbind(1)  # [lines − 1, C], chunk order
    chunk = torch.arange(a.shape[-1], device=g.device)
    e = torch.where(live > 0, chunk, -1).amax(-1, keepdim=True)  # each line's end chunk
    a, b = torch.where(chunk == e, a_end, a), torch.where(chunk == e, 0, b)
    za = scan.doubling_scan((a, b), compose, reverse=True)[0]
    mine = order[:, rank]
    z, owns = torch.cat([za[:, 1:], torch.zeros_like(za[:, :1])], -1)[:, mine], e == mine
    z, owns = (torch.cat([x, x.new_zeros(1, x.shape[1])]) for x in (z, owns))  # the last line: no token
    return z, owns, g[-1, 3].amax() > 0


def _run(sh: _Shard, c: _Call):
    """The estimator on this rank's shard: the outputs ``[N, L]`` (GAE: ``(advantages, returns)``)."""
    P, shape = _slots(c.layout), sh.m.shape
    pieces = _pieces(sh, P)
    z, owns_end, bad = _carries(sh, c, pieces, _dtype(sh.r))
    end, line, tr = pieces[1], sh.key // P, sh.trunc[sh.key // P]
    tok_end = end & owns_end.reshape(-1)[sh.key]  # the last model token of its line
    inject = end & ~tok_end  # the sequence goes on in a later chunk: its state enters here
    flags = dict(terminated=(tok_end & ~tr).view(shape), truncated=((tok_end & tr) | inject).view(shape),
                 bootstrap_values=torch.where(inject, z.reshape(-1)[sh.key], sh.boot[line]).view(shape),
                 mask=sh.m, window_end="terminal", backend=c.backend)
    out = c.out_dtype or (sh.r.dtype if sh.v is None else torch.promote_types(sh.r.dtype, sh.v.dtype))
    if sh.v is None:
        res = (F.discounted_returns(c.gamma, rewards=sh.r, bootstrap=True, out_dtype=out, **flags),)
    else:
        res = tuple(F.gae(c.gamma, c.lam, rewards=sh.r, values=sh.v, out_dtype=out, **flags))
    return tuple(torch.where(bad | sh.bad, math.nan, x) for x in res)


# ------------------------------------------------------------------------------------ the inputs


def _tensor(name, x, like=None, flags=False):
    """``x`` checked (float, or flags → bool; ``like``'s shape and device), naming the argument."""
    if not isinstance(x, torch.Tensor) or x.is_complex() or not (flags or x.dtype in validation.FLOATS):
        raise TypeError(f"{name} must be a {'flag' if flags else 'floating-point'} tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if like is not None and (x.shape != like.shape or x.device != like.device):
        raise ValueError(f"{name} must have shape {tuple(like.shape)} on {like.device} (the rewards' shard), got "
                         f"{tuple(x.shape)} on {x.device}")
    return x if not flags or x.dtype == torch.bool else x != 0


def _per_line(rows, shape, like):
    """``[n + 1]`` truncation flags and bootstrap values (0 where not truncated) from ``rows =
    (truncated, bootstrap_values)``, each one per row / sequence (``shape``) or both None."""
    device, dt, n = like.device, _dtype(like), math.prod(shape)
    if (rows[0] is None) != (rows[1] is None):
        raise ValueError("truncated and bootstrap_values go together (a truncated sequence bootstraps from "
                         "bootstrap_values, V(s') after the cut)")
    tr, bv = torch.zeros(n + 1, dtype=torch.bool, device=device), torch.zeros(n + 1, dtype=dt, device=device)
    for name, x in zip(("truncated", "bootstrap_values"), rows, strict=True) if rows[0] is not None else ():
        if _tensor(name, x, flags=name == "truncated").shape != shape or x.device != device:
            raise ValueError(f"{name} must be a {list(shape)} tensor on {device} (one per row / sequence), got "
                             f"{list(x.shape)} on {x.device}")
        (tr if name == "truncated" else bv)[:n] = _tensor(name, x, flags=name == "truncated").reshape(n)
    return tr, torch.where(tr, bv, 0)


def _padded(rewards, values, mask, rows, layout, split):
    """The shard of a padded ``[*B, L]`` batch (``rows``: ``(truncated, bootstrap_values)``)."""
    if _tensor("token_level_rewards", rewards).dim() < 1:
        raise ValueError("token_level_rewards must be [*B, L] (time last), got a 0-d tensor")
    m = _tensor("response_mask", mask, rewards, flags=True)
    L, N, P = rewards.shape[-1], math.prod(rewards.shape[:-1]), _slots(layout)
    slot = torch.zeros(L, dtype=torch.long, device=rewards.device)
    if layout == "zigzag":
        split = L // 2 if split is None else split
        if isinstance(split, bool) or not isinstance(split, int) or not 0 <= split <= L:
            raise ValueError(f"split must be an int in [0, {L}] (where the rank's second chunk starts), got {split!r}")
        slot = (torch.arange(L, device=rewards.device) >= split).long()
    key = (torch.arange(N, device=rewards.device).unsqueeze(-1) * P + slot).reshape(-1)
    v = None if values is None else _tensor("values", values, rewards).reshape(N, L)
    tr, bv = _per_line(rows, rewards.shape[:-1], rewards)
    return _Shard(rewards.reshape(N, L), v, m.reshape(N, L), key, tr, bv, torch.zeros((), dtype=torch.bool,
                                                                                 device=rewards.device))


def _packed(rewards, values, mask, cu_seqlens, rows, layout, split):
    """The shard of a packed stream ``[1, L]`` / ``[L]`` with local ``cu_seqlens`` ``[S + 1]``."""
    if _tensor("token_level_rewards", rewards).dim() not in (1, 2) or rewards.numel() != rewards.shape[-1]:
        raise ValueError(f"token_level_rewards must be [1, total] or [total], got {tuple(rewards.shape)}")
    m = _tensor("response_mask", mask, rewards, flags=True).reshape(1, -1)
    device, ints = rewards.device, (torch.int32, torch.int64)
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in ints or cu_seqlens.dim() != 1 \
            or cu_seqlens.numel() < 1 or cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens must be this rank's int [num_seqs + 1] local segment offsets on {device}")
    L, S, P, cu = rewards.shape[-1], cu_seqlens.numel() - 1, _slots(layout), cu_seqlens.long()
    pos = torch.arange(L, device=device)
    seg = torch.searchsorted(cu[1:].contiguous(), pos, right=True)  # S: past the last segment
    lengths = cu[1:] - cu[:-1]
    bad, slot = (cu[0] != 0) | (cu[-1] > L) | (lengths < 0).any(), torch.zeros_like(pos)
    if layout == "zigzag":
        sp = lengths // 2 if split is None else split
        if not isinstance(sp, torch.Tensor) or sp.shape != (S,) or sp.dtype not in ints or sp.device != device:
            raise ValueError(f"split must be an int [{S}] tensor on {device} (each segment's second chunk's start)")
        bad = bad | (sp < 0).any() | (sp > lengths).any()
        first = torch.cat([sp.long(), sp.new_zeros(1, dtype=torch.long)])[seg]
        slot = (pos - torch.cat([cu, cu[-1:]])[seg] >= first).long()
    if validation.checking_finite() and not torch.compiler.is_compiling() and bool(bad):
        raise ValueError("cu_seqlens (or split) break the convention: cu_seqlens[0] = 0, non-decreasing, at most the "
                         "local length; split within each segment (rollbuf.check_finite is on: else all NaN)")
    v = None if values is None else _tensor("values", values, rewards).reshape(1, L)
    tr, bv = _per_line(rows, (S,), rewards)
    return _Shard(rewards.reshape(1, L), v, m & (seg < S), seg * P + slot, tr, bv, bad)


# ------------------------------------------------------------------------------------ the estimators


def _estimate(sh_args, packed, c, whiten=False):
    """The estimator on the shard ``_padded(*sh_args)`` / ``_packed(*sh_args)``, in its shape."""
    c = _Call(unit_interval("gamma", c.gamma), unit_interval("lam", c.lam), *c[2:])
    if c.layout == "contiguous" and sh_args[-1] is not None:
        raise ValueError("split is for layout='zigzag' (where a rank's second chunk starts), got it with "
                         "layout='contiguous'")
    sh = (_packed if packed else _padded)(*sh_args)
    out = _run(sh, c)
    if len(out) == 1:
        return out[0].reshape(sh_args[0].shape)
    adv = torch.where(sh.m, masked_whiten(out[0], sh.m, group=c.group), 0) if whiten else out[0]
    return F.GAEResult(adv.reshape(sh_args[0].shape), out[1].reshape(sh_args[0].shape))


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, *, layout="contiguous",
                                 split=None, group=None, truncated=None, bootstrap_values=None,
                                 whiten: bool = False, out_dtype=None, backend: str = "auto"):
    """:func:`rollbuf.integrations.llm.compute_gae_advantage_return` on this rank's shard ``[*B, L_r]``
    of every row: its shard of ``(advantages, returns)``, 0 at masked tokens; ``whiten`` over ``group``."""
    return _estimate((token_level_rewards, values, response_mask, (truncated, bootstrap_values), layout, split),
                     False, _Call(gamma, lam, layout, group, backend, out_dtype), whiten)


def discounted_returns(token_level_rewards, response_mask, gamma, *, layout="contiguous", split=None, group=None,
                       truncated=None, bootstrap_values=None, out_dtype=None, backend: str = "auto"):
    """:func:`rollbuf.integrations.llm.discounted_returns` on this rank's shard ``[*B, L_r]`` (not reset
    at masked tokens). REINFORCE++ advantages: ``masked_whiten(returns, mask, group=group) * mask``."""
    return _estimate((token_level_rewards, None, response_mask, (truncated, bootstrap_values), layout, split),
                     False, _Call(gamma, 1.0, layout, group, backend, out_dtype))


def packed_gae(token_level_rewards, values, response_mask, cu_seqlens, gamma, lam, truncated=None,
               bootstrap_values=None, *, layout="contiguous", split=None, group=None, whiten: bool = False,
               out_dtype=None, backend: str = "auto"):
    """:func:`rollbuf.integrations.llm.packed_gae` on this rank's stream ``[1, L_r]``, ``cu_seqlens`` its
    local ``[S + 1]``; malformed ``cu_seqlens`` / ``split`` on any rank: every output NaN."""
    return _estimate((token_level_rewards, values, response_mask, cu_seqlens, (truncated, bootstrap_values), layout,
                      split), True, _Call(gamma, lam, layout, group, backend, out_dtype), whiten)


def packed_discounted_returns(token_level_rewards, response_mask, cu_seqlens, gamma, truncated=None,
                              bootstrap_values=None, *, layout="contiguous", split=None, group=None,
                              out_dtype=None, backend: str = "auto"):
    """:func:`discounted_returns` on a packed stream (``cu_seqlens`` as in :func:`packed_gae`)."""
    return _estimate((token_level_rewards, None, response_mask, cu_seqlens, (truncated, bootstrap_values), layout,
                      split), True, _Call(gamma, 1.0, layout, group, backend, out_dtype))


def masked_whiten(values, mask, shift_mean: bool = True, *, group=None, out_dtype=None):
    """:func:`rollbuf.integrations.llm.masked_whiten` over the model tokens of every rank of ``group``
    (any layout): each rank's ``(count, mean, M2)`` all-gathered and merged (Chan et al.)."""
    m, dt = _tensor("mask", mask, _tensor("values", values), flags=True), _dtype(values)
    x, zero = values.to(dt), torch.zeros((), dtype=dt, device=values.device)
    n = m.sum().to(dt)
    mu = torch.where(m, x, zero).sum() / n.clamp(min=1)
    ns, mus, m2s = _all_gather(torch.stack([n, mu, torch.where(m, (x - mu) ** 2, zero).sum()]), group).unbind(0)
    n = ns.sum()
    if validation.checking_finite() and not torch.compiler.is_compiling() and int(n) < 2:
        raise ValueError(f"masked_whiten needs at least two masked-in entries over the group, got {int(n)} "
                         "(rollbuf.check_finite is on; without it the outputs are NaN)")
    mean = (ns * mus).sum() / n  # 0 entries: 0/0; one: the variance 0/0 — NaN, as in one process
    w = (x - mean) * torch.rsqrt((m2s.sum() + (ns * (mus - mean) ** 2).sum()) / (n - 1) + 1e-8)
    return (w if shift_mean else w + mean).to(values.dtype if out_dtype is None else out_dtype)


def _sums(xs, like, m, cu_seqlens, group):
    """Each tensor of ``xs`` (``like``'s shape) summed over each line's tokens of every rank, in the
    accumulation dtype: ``[k, *B]`` (padded) or ``[k, S]`` (packed, local ``cu_seqlens``; malformed
    on any rank: NaN), one ``all_reduce``; the packed shard (None if padded). No ``[k, ...]`` copy of
    the tokens is made: each tensor is reduced where it is."""
    dt = _dtype(like)
    sh = None if cu_seqlens is None else _packed(like, None, m, cu_seqlens, (None, None), "contiguous", None)
    if sh is None:
        s = torch.stack([x.sum(-1, dtype=dt) for x in xs])
    else:
        s = like.new_zeros(len(xs), sh.trunc.numel(), dtype=dt)
        for row, x in zip(s, xs, strict=True):
            row.index_add_(0, sh.key, x.reshape(-1).to(dt))
        s = torch.where(sh.bad, math.nan, s[:, :-1])
    _dist(group)[0].all_reduce(s, group=group)
    return s, sh


def sequence_sums(values, mask, *, cu_seqlens=None, group=None):
    """Per-sequence sums of ``values`` over the model tokens of every rank of ``group`` (any layout),
    on every rank: ``[*B]`` (padded ``[*B, L_r]``) or ``[S]`` (packed, local ``cu_seqlens``); one
    ``all_reduce`` of ``O(sequences)`` numbers."""
    m = _tensor("mask", mask, _tensor("values", values), flags=True)
    return _sums((torch.where(m, values.to(_dtype(values)), 0),), values, m, cu_seqlens, group)[0][0]


def outcome_advantages(token_level_rewards, response_mask, index, estimator: str = "grpo", *, cu_seqlens=None,
                       group=None, epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                       f_norm: float = 1.0, out_dtype=None):
    """:func:`rollbuf.groups.outcome_advantages` (verl's GRPO, RLOO, OPO, ...) on this rank's shard (any
    layout; padded ``[B, L_r]``, or packed with local ``cu_seqlens``): the advantages at its tokens,
    0 at masked ones. Each row's score (the sum of all its rewards, as verl's) and response length:
    one ``all_reduce`` of ``2·B`` numbers, then the group statistics on every rank. ``index``: one
    label per row / sequence, the same on every rank."""
    r = _tensor("token_level_rewards", token_level_rewards)
    m = _tensor("response_mask", response_mask, r, flags=True)
    if cu_seqlens is None and r.dim() != 2:
        raise ValueError(f"token_level_rewards must be [B, L_r] (or packed, with cu_seqlens), got {tuple(r.shape)}")
    n, sh = _sums((r, response_mask), r, m, cu_seqlens, group)
    a = groups.outcome_advantages(n[0], index, n[1], estimator, epsilon=epsilon, f_norm=f_norm,
                                  norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo).to(out_dtype or r.dtype)
    if sh is None:
        return groups.to_tokens(a, response_mask)
    # past the last sequence: 0, or NaN where any rank's cu_seqlens were malformed (they made the lengths NaN)
    v = torch.cat([a, torch.where(n[1].isnan().any(), math.nan, a.new_zeros(1))])[sh.key]
    return (v * response_mask.reshape(-1)).reshape(response_mask.shape)
