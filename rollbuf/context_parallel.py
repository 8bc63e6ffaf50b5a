"""The LLM token estimators on sequences sharded across a context-parallel process group.

:mod:`rollbuf.integrations.llm`'s functions (verl-style GAE, discounted / REINFORCE++ returns,
their packed ``cu_seqlens`` forms, ``masked_whiten``) with ``layout=``, ``split=`` and ``group=``
added: each rank passes its local shard of every sequence and gets its local shard of the outputs,
equal to the one-process result on the whole sequences (docs/distributed.md).

**Layouts** (``group`` of ``W`` ranks; ``C`` chunks per sequence, in time order):

* ``"contiguous"``: ``C = W``, rank ``i`` holds chunk ``i``;
* ``"zigzag"``: ``C = 2W``, rank ``i`` holds chunks ``i`` and ``2W−1−i``, concatenated in that
  order; ``split`` is where its second chunk starts (default: half the local length).

Chunks may be uneven and empty. Padded ``[*B, L]`` batches: every row is cut at the same local
columns of a rank. Packed streams: ``cu_seqlens`` is the rank's **local** ``[S + 1]`` (the same
``S`` on every rank): local segment ``s`` holds the rank's tokens of sequence ``s`` (for
``"zigzag"``: its two chunks, ``split`` ``[S]`` where the second starts, default half).

**How.** Both estimators are one affine scan ``Z_t = α_t + β_t·Z_{next model token}`` per sequence
(:func:`rollbuf.boundary.coefficients.lambda_step`). Every (sequence, chunk) *piece* of a rank is
one affine map ``(a, b)`` from the state past the piece to the state at its start; each rank
computes its pieces' maps (one ``affine_scan`` with the scan cut at the piece ends), and, for the
piece whose last model token may be its sequence's end (the last model token of the sequence, which
is on the rank holding the last chunk with a model token), the map with that token ending the
sequence. One ``all_gather`` of ``[S + 1, P, 4]`` numbers per rank (``P`` = 1 or 2 chunks per
rank: the maps, and whether the piece has a model token) lets every rank find each sequence's end
chunk and compose, in chunk order, the state past each of its pieces. The local estimator then runs
once on the local shard, with that state entering at the last model token of each piece that is not
its sequence's end: a truncation there, bootstrapping from the state, is the same arithmetic
(``r + γ·Z`` for the return, ``(1−λ)V + λ(r + γ·Z)`` for the state). ``masked_whiten`` merges
per-rank ``(count, mean, M2)`` (Chan's formula; one ``all_gather`` of 3 numbers per rank).
Nothing reads tensors back to the host. The group estimators' per-sequence statistics start from
:func:`sequence_sums`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from rollbuf import functional as F
from rollbuf import validation
from rollbuf.backends import scan
from rollbuf.boundary import coefficients as C
from rollbuf.estimators import unit_interval

__all__ = [
    "compute_gae_advantage_return",
    "discounted_returns",
    "packed_gae",
    "packed_discounted_returns",
    "masked_whiten",
    "sequence_sums",
    "LAYOUTS",
]

#: Values of ``layout``.
LAYOUTS = ("contiguous", "zigzag")


class _Shard(NamedTuple):
    """A rank's tokens as one ``[N, L]`` block: padded rows (``N = B``) or one packed stream."""

    r: torch.Tensor  # rewards [N, L], as given
    v: torch.Tensor | None  # values [N, L], as given (None: the returns)
    m: torch.Tensor  # [N, L] bool, model tokens
    key: torch.Tensor  # [N·L] long: the piece of each token, line · P + slot
    trunc: torch.Tensor  # [lines] bool per line (row / sequence); the last line holds no token
    boot: torch.Tensor  # [lines] V(s') where truncated, else 0
    bad: torch.Tensor  # 0-d bool: this rank's layout arguments broke their convention


class _Call(NamedTuple):
    gamma: float
    lam: float
    layout: str
    group: object
    backend: str
    out_dtype: torch.dtype | None


def _dist(group):
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "rollbuf.context_parallel needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group); for one process use rollbuf.integrations.llm"
        )
    return dist, dist.get_rank(group), dist.get_world_size(group)


def _all_gather(x, group):
    """``x`` of every rank, stacked on a new last dim (list all_gather: gloo and NCCL)."""
    dist, _, world = _dist(group)
    x = x.contiguous()
    out = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(out, x, group=group)
    return torch.stack(out, -1)


def _dtype(x):
    """The accumulation dtype: float64 for float64 inputs, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _slots(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return 1 if layout == "contiguous" else 2


def _chunk_of(layout, rank, world, device):
    """``[P]``: the chunk (time order) of each of ``rank``'s slots."""
    chunks = [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]
    return torch.tensor(chunks, dtype=torch.long, device=device)


# ------------------------------------------------------------------------------------ the exchange


class _Pieces(NamedTuple):
    cut: torch.Tensor  # [N·L] bool: the last token of its piece
    end: torch.Tensor  # [N·L] bool: the last model token of its piece
    first: torch.Tensor  # [K] the index of each piece's first token (N·L: an empty piece)
    live: torch.Tensor  # [K] bool: the piece has a model token


def _pieces(sh: _Shard, P):
    """Where each piece (line, slot) starts and ends; pieces are runs of tokens of one key."""
    n = sh.key.numel()
    idx = torch.arange(n, device=sh.key.device)
    K = sh.trunc.numel() * P

    def reduce(src, how, fill):
        start = torch.full((K,), fill, dtype=torch.long, device=idx.device)
        return start.scatter_reduce(0, sh.key, src, reduce=how)

    last, live = reduce(idx, "amax", -1), reduce(torch.where(sh.m.reshape(-1), idx, -1), "amax", -1)
    return _Pieces(idx == last[sh.key], idx == live[sh.key], reduce(idx, "amin", n), live >= 0)


def _payload(sh: _Shard, c: _Call, pc: _Pieces, dt):
    """``[lines, P, 4]``: per piece ``(a, b)``, ``a`` if its last model token ends the sequence, and
    whether it has a model token (the last line: this rank's ``bad`` flag)."""
    N, L = sh.m.shape
    P = _slots(c.layout)
    cut, end = pc.cut, pc.end
    line = sh.key // P
    m = sh.m.reshape(-1)
    r = torch.where(m, sh.r.reshape(-1).to(dt), 0)
    v = torch.zeros_like(r) if sh.v is None else torch.where(m, sh.v.reshape(-1).to(dt), 0)
    tr = sh.trunc[line].to(dt)
    alpha, beta = C.lambda_step(r, v, 0.0, 0.0, None, c.gamma, c.lam)
    alpha_end, _ = C.lambda_step(r, v, 1.0 - tr, tr, sh.boot[line], c.gamma, c.lam)
    a_in = torch.where(m, alpha, 0)
    b_in = torch.where(m, torch.as_tensor(beta, dtype=dt, device=r.device), 1)
    b_cut = torch.where(cut, 0, b_in)  # the scan stops at each piece's last token
    alphas = torch.stack([a_in, torch.where(cut, b_in, 0), torch.where(end, alpha_end, a_in)])
    betas = torch.stack([b_cut, b_cut, torch.where(end, 0, b_cut)])
    y = F.affine_scan(alphas.view(3, N, L), betas.view(3, N, L), reverse=True, backend="torch")
    y = torch.cat([y.reshape(3, -1), y.new_tensor([[0.0], [1.0], [0.0]])], -1)  # empty piece: identity
    out = torch.cat([y[:, pc.first].T, pc.live.to(dt).unsqueeze(-1)], -1).view(-1, P, 4)
    out[-1, 0, 3] = sh.bad.to(dt)
    return out


def _carries(sh: _Shard, c: _Call, pc: _Pieces, dt):
    """Per piece of this rank ``[lines, P]``: the state past it, whether it holds its line's end;
    and whether any rank's layout arguments were bad (0-d)."""
    _, rank, world = _dist(c.group)
    P = _slots(c.layout)
    g = _all_gather(_payload(sh, c, pc, dt), c.group)  # [lines, P, 4, W]
    order = torch.stack([_chunk_of(c.layout, q, world, g.device) for q in range(world)], -1)  # [P, W]
    g = g.permute(0, 2, 1, 3).reshape(g.shape[0], 4, -1)[..., torch.argsort(order.reshape(-1))]
    bad = g[-1, 3].amax() > 0
    a, b, a_end, live = g[:-1].unbind(1)  # [lines − 1, C], chunk order
    chunk = torch.arange(a.shape[-1], device=g.device)
    e = torch.where(live > 0, chunk, -1).amax(-1, keepdim=True)  # each line's end chunk
    a, b = torch.where(chunk == e, a_end, a), torch.where(chunk == e, 0, b)
    za = scan.doubling_scan((a, b), C.compose, reverse=True)[0]
    z_after = torch.cat([za[:, 1:], torch.zeros_like(za[:, :1])], -1)
    mine = _chunk_of(c.layout, rank, world, g.device)
    pad = torch.zeros(1, P, device=g.device)
    return torch.cat([z_after[:, mine], pad.to(dt)]), torch.cat([e == mine, pad.bool()]), bad


def _run(sh: _Shard, c: _Call):
    """The estimator on this rank's shard: the outputs ``[N, L]`` (GAE: ``(advantages, returns)``)."""
    dt = _dtype(sh.r)
    P = _slots(c.layout)
    pc = _pieces(sh, P)
    z, owns_end, bad = _carries(sh, c, pc, dt)
    end = pc.end
    line = sh.key // P
    tok_end = end & owns_end.reshape(-1)[sh.key]  # the last model token of its line
    inject = end & ~tok_end  # the sequence goes on in a later chunk: enter its state here
    tr = sh.trunc[line]
    shape = sh.m.shape
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
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not flags:
        validation.check_tensor(name, x, validation.FLOATS, "a floating-point tensor")
    elif x.is_complex():
        raise TypeError(f"{name} must be a flag tensor (bool, integer or 0/1 float), got dtype {x.dtype}")
    if like is not None:
        if tuple(x.shape) != tuple(like.shape):
            raise ValueError(f"{name} must have shape {tuple(like.shape)} (the rewards' shard), got {tuple(x.shape)}")
        if x.device != like.device:
            raise ValueError(f"{name} is on {x.device} but token_level_rewards is on {like.device}")
    return x if not flags or x.dtype == torch.bool else x != 0


def _per_line(rows, shape, device, dt):
    """``[n + 1]`` truncation flags and bootstrap values (0 where not truncated; the extra line: none)
    from ``rows = (truncated, bootstrap_values)``, each ``shape`` (one per row / sequence) or None."""
    truncated, bootstrap_values = rows
    if (truncated is None) != (bootstrap_values is None):
        raise ValueError("truncated and bootstrap_values go together: a truncated sequence bootstraps from "
                         "bootstrap_values (V(s') after the cut), one per row / sequence")
    n = math.prod(shape)
    tr = torch.zeros(n + 1, dtype=torch.bool, device=device)
    if truncated is None:
        return tr, torch.zeros(n + 1, dtype=dt, device=device)
    for name, x in (("truncated", truncated), ("bootstrap_values", bootstrap_values)):
        _tensor(name, x, flags=name == "truncated")
        if tuple(x.shape) != tuple(shape) or x.device != device:
            raise ValueError(f"{name} must be a {list(shape)} tensor (one per row / sequence) on {device}, got "
                             f"{list(x.shape)} on {x.device}")
    tr[:n] = _tensor("truncated", truncated, flags=True).reshape(n)
    bv = torch.cat([bootstrap_values.reshape(n).to(dt), torch.zeros(1, dtype=dt, device=device)])
    return tr, torch.where(tr, bv, 0)


def _padded(rewards, values, mask, rows, layout, split):
    """The shard of a padded ``[*B, L]`` batch (``rows``: ``(truncated, bootstrap_values)``)."""
    _tensor("token_level_rewards", rewards)
    if rewards.dim() < 1:
        raise ValueError("token_level_rewards must be [*B, L] (time last), got a 0-d tensor")
    if values is not None:
        _tensor("values", values, rewards)
    m = _tensor("response_mask", mask, rewards, flags=True)
    L, N = rewards.shape[-1], math.prod(rewards.shape[:-1])
    P = _slots(layout)
    slot = torch.zeros(L, dtype=torch.long, device=rewards.device)
    if layout == "zigzag":
        split = L // 2 if split is None else split
        if isinstance(split, bool) or not isinstance(split, int) or not 0 <= split <= L:
            raise ValueError(f"split must be an int in [0, {L}] (where this rank's second chunk starts), got {split!r}")
        slot = (torch.arange(L, device=rewards.device) >= split).long()
    elif split is not None:
        raise ValueError("split is for layout='zigzag' (where a rank's second chunk starts), got it with "
                         f"layout={layout!r}")
    key = (torch.arange(N, device=rewards.device).unsqueeze(-1) * P + slot).reshape(-1)
    tr, bv = _per_line(rows, rewards.shape[:-1], rewards.device, _dtype(rewards))
    v = None if values is None else values.reshape(N, L)
    return _Shard(rewards.reshape(N, L), v, m.reshape(N, L), key, tr, bv,
                  torch.zeros((), dtype=torch.bool, device=rewards.device))


def _packed(rewards, values, mask, cu_seqlens, rows, layout, split):
    """The shard of a packed stream ``[1, L]`` / ``[L]`` with local ``cu_seqlens`` ``[S + 1]``."""
    _tensor("token_level_rewards", rewards)
    if rewards.dim() not in (1, 2) or (rewards.dim() == 2 and rewards.shape[0] != 1):
        raise ValueError(f"token_level_rewards must be [1, total] or [total], got {tuple(rewards.shape)}")
    if values is not None:
        _tensor("values", values, rewards)
    m = _tensor("response_mask", mask, rewards, flags=True).reshape(1, -1)
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64) \
            or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or cu_seqlens.device != rewards.device:
        raise ValueError("cu_seqlens must be this rank's 1-d int32/int64 [num_seqs + 1] tensor of cumulative local "
                         f"segment lengths, on {rewards.device}")
    L, S, P, device = rewards.shape[-1], cu_seqlens.numel() - 1, _slots(layout), rewards.device
    cu = cu_seqlens.long()
    pos = torch.arange(L, device=device)
    seg = torch.searchsorted(cu[1:].contiguous(), pos, right=True)  # S: past the last segment
    m = m & (seg < S)
    lengths = cu[1:] - cu[:-1]
    bad = (cu[0] != 0) | (cu[-1] > L) | (lengths < 0).any()
    slot = torch.zeros_like(pos)
    if layout == "zigzag":
        sp = lengths // 2 if split is None else split
        if not isinstance(sp, torch.Tensor) or sp.shape != (S,) or sp.dtype not in (torch.int32, torch.int64) \
                or sp.device != device:
            raise ValueError(f"split must be an int [{S}] tensor on {device} (where each local segment's second "
                             "chunk starts)")
        bad = bad | (sp < 0).any() | (sp > lengths).any()
        ext = torch.cat([sp.long(), sp.new_zeros(1, dtype=torch.long)])
        slot = (pos - torch.cat([cu, cu[-1:]])[seg] >= ext[seg]).long()
    elif split is not None:
        raise ValueError("split is for layout='zigzag' (where each segment's second chunk starts)")
    if validation.checking_finite() and not torch.compiler.is_compiling() and bool(bad):
        raise ValueError("cu_seqlens (or split) break the convention: cu_seqlens[0] = 0, non-decreasing, at most the "
                         "local length; split within each segment (rollbuf.check_finite is on: without it every "
                         "output is NaN)")
    tr, bv = _per_line(rows, (S,), device, _dtype(rewards))
    v = None if values is None else values.reshape(1, L)
    return _Shard(rewards.reshape(1, L), v, m, seg * P + slot, tr, bv, bad)


# ------------------------------------------------------------------------------------ the estimators


def _call(gamma, lam, layout, group, backend, out_dtype):
    return _Call(unit_interval("gamma", gamma), unit_interval("lam", lam), layout, group, backend, out_dtype)


def _gae_out(sh, c, shape, whiten):
    adv, ret = _run(sh, c)
    if whiten:
        adv = torch.where(sh.m, masked_whiten(adv, sh.m, group=c.group), 0)
    return F.GAEResult(adv.reshape(shape), ret.reshape(shape))


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, *, layout="contiguous",
                                 split=None, group=None, truncated=None, bootstrap_values=None,
                                 whiten: bool = False, out_dtype=None, backend: str = "auto"):
    """:func:`rollbuf.integrations.llm.compute_gae_advantage_return` on a context-parallel shard
    ``[*B, L_r]`` of every row: this rank's slice of ``(advantages, returns)``, 0 at masked tokens.
    ``truncated``, ``bootstrap_values``: ``[*B]``, the same on every rank. ``whiten=True``: the
    advantages whitened over every model token of the batch on every rank of ``group``."""
    c = _call(gamma, lam, layout, group, backend, out_dtype)
    sh = _padded(token_level_rewards, values, response_mask, (truncated, bootstrap_values), layout, split)
    return _gae_out(sh, c, token_level_rewards.shape, whiten)


def discounted_returns(token_level_rewards, response_mask, gamma, *, layout="contiguous", split=None, group=None,
                       truncated=None, bootstrap_values=None, out_dtype=None, backend: str = "auto"):
    """:func:`rollbuf.integrations.llm.discounted_returns` on a context-parallel shard ``[*B, L_r]``:
    the return carried across masked (tool) tokens, not reset there. REINFORCE++ advantages:
    ``masked_whiten(returns, mask, group=group) * mask``."""
    c = _call(gamma, 1.0, layout, group, backend, out_dtype)
    sh = _padded(token_level_rewards, None, response_mask, (truncated, bootstrap_values), layout, split)
    return _run(sh, c)[0].reshape(token_level_rewards.shape)


def packed_gae(token_level_rewards, values, response_mask, cu_seqlens, gamma, lam, truncated=None,
               bootstrap_values=None, *, layout="contiguous", split=None, group=None, whiten: bool = False,
               out_dtype=None, backend: str = "auto"):
    """:func:`rollbuf.integrations.llm.packed_gae` on this rank's packed stream ``[1, L_r]`` /
    ``[L_r]``; ``cu_seqlens``: the rank's local ``[S + 1]`` (segment ``s``: its tokens of sequence
    ``s``), ``truncated`` / ``bootstrap_values``: ``[S]``, the same on every rank. Malformed
    ``cu_seqlens`` / ``split`` on any rank make every output of every rank NaN (no host read)."""
    c = _call(gamma, lam, layout, group, backend, out_dtype)
    sh = _packed(token_level_rewards, values, response_mask, cu_seqlens, (truncated, bootstrap_values), layout, split)
    return _gae_out(sh, c, token_level_rewards.shape, whiten)


def packed_discounted_returns(token_level_rewards, response_mask, cu_seqlens, gamma, truncated=None,
                              bootstrap_values=None, *, layout="contiguous", split=None, group=None,
                              out_dtype=None, backend: str = "auto"):
    """:func:`discounted_returns` on a packed stream (``cu_seqlens`` as in :func:`packed_gae`)."""
    c = _call(gamma, 1.0, layout, group, backend, out_dtype)
    sh = _packed(token_level_rewards, None, response_mask, cu_seqlens, (truncated, bootstrap_values), layout, split)
    return _run(sh, c)[0].reshape(token_level_rewards.shape)


def masked_whiten(values, mask, shift_mean: bool = True, *, group=None, out_dtype=None):
    """:func:`rollbuf.integrations.llm.masked_whiten` with the statistics over the model tokens of
    every rank of ``group`` (any layout): the ranks all-gather their ``(count, mean, M2)`` and merge
    them (Chan et al.), so the mean and the Bessel-corrected variance are those of all the tokens."""
    _tensor("values", values)
    m = _tensor("mask", mask, values, flags=True)
    dt = _dtype(values)
    x = values.to(dt)
    zero = torch.zeros((), dtype=dt, device=x.device)
    n = m.sum().to(dt)
    mu = torch.where(m, x, zero).sum() / n.clamp(min=1)
    m2 = torch.where(m, (x - mu) ** 2, zero).sum()
    ns, mus, m2s = _all_gather(torch.stack([n, mu, m2]), group).unbind(0)  # each [W]
    n = ns.sum()
    if validation.checking_finite() and not torch.compiler.is_compiling() and int(n) < 2:
        raise ValueError(f"masked_whiten needs at least two masked-in entries over the group, got {int(n)} "
                         "(rollbuf.check_finite is on; without it the outputs are NaN)")
    mean = (ns * mus).sum() / n  # 0 entries: 0/0; one: the variance 0/0 — NaN, as in one process
    var = (m2s.sum() + (ns * (mus - mean) ** 2).sum()) / (n - 1)
    w = (x - mean) * torch.rsqrt(var + 1e-8)
    return (w if shift_mean else w + mean).to(values.dtype if out_dtype is None else out_dtype)


def sequence_sums(values, mask, *, cu_seqlens=None, group=None):
    """Per-sequence sums of ``values`` over the model tokens of every rank of ``group`` (any layout),
    on every rank: ``[*B]`` for padded rows ``[*B, L_r]``; ``[S]`` for a packed stream with local
    ``cu_seqlens`` ``[S + 1]``. One ``all_reduce`` of ``O(sequences)`` numbers: the per-sequence
    statistics (an outcome score spread over the tokens) that the group estimators start from."""
    _tensor("values", values)
    m = _tensor("mask", mask, values, flags=True)
    dt = _dtype(values)
    x = torch.where(m, values.to(dt), 0)
    if cu_seqlens is None:
        s = x.sum(-1)
    else:
        sh = _packed(values, None, m, cu_seqlens, (None, None), "contiguous", None)
        S = cu_seqlens.numel() - 1
        s = torch.zeros(S + 1, dtype=dt, device=x.device).index_add_(0, sh.key, x.reshape(-1))[:S]
        s = torch.where(sh.bad, math.nan, s)
    dist, _, _ = _dist(group)
    dist.all_reduce(s, group=group)
    return s
