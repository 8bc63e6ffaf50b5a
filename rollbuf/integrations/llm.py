"""Token-level credit assignment for LLM reinforcement learning (PPO on multi-turn agent rollouts).

A row is one trajectory of up to ``T`` tokens: ``response_mask`` marks the model-generated tokens
(1) against tool/observation/padding tokens (0); ``token_level_rewards`` holds per-token rewards
(KL penalties plus a final score) and ``values`` the critic's per-token values. Every function here
is a thin layer over :mod:`rollbuf.functional`: one call of a fused estimator (the Triton kernels on
CUDA tensors, the vectorised ``torch`` scan on the CPU; ``backend=`` as in rollbuf.functional), with
no Python loop over tokens, rows or sequences.

Semantics ("as if deleted", docs/semantics.md): tokens with ``response_mask = 0`` are skipped — the
successor of a model token is the next model token, across any tool span — and their rewards and
values are ignored (a NaN there never leaks). The **row end** is the last model token of the row.
It is **terminal** (an EOS: no bootstrap), unless the row is flagged ``truncated`` (cut by a token
limit or a turn cap): then it bootstraps from ``bootstrap_values[row]`` = ``V(s')``, the value of
the state after the cut.

* :func:`compute_gae_advantage_return`: verl's multi-turn ``compute_gae_advantage_return``, same
  arguments, shapes and values on masked-in positions; optional truncation, whitening and verl's
  values at masked positions (``fill_masked="carry"``).
* :func:`discounted_returns`: REINFORCE-style discounted returns across masked spans.
* :func:`packed_gae`, :func:`packed_discounted_returns`: several trajectories packed in one row
  without padding, described by ``cu_seqlens`` (the flash-attention varlen convention).
* :func:`masked_whiten`: verl's ``masked_whiten`` (batch statistics over masked-in tokens).

Inputs may be float32, bfloat16, float16 or float64; rollbuf accumulates in float32 (float64 stays
float64) and returns the promoted input dtype unless ``out_dtype`` says otherwise.
"""

from __future__ import annotations

import torch

from rollbuf import functional as F
from rollbuf import validation
from rollbuf.boundary.conventions import fields_from_verl
from rollbuf.functional import GAEResult

__all__ = [
    "compute_gae_advantage_return",
    "discounted_returns",
    "packed_gae",
    "packed_discounted_returns",
    "masked_whiten",
    "FILL_MASKED",
]

#: Values of ``fill_masked``: what the outputs hold at tokens with ``response_mask = 0``.
FILL_MASKED = ("zero", "carry")



# ----------------------------------------------------------------------------------- helpers


def _scalar(name, v):
    """A hyper-parameter: a Python number, or a 0-d tensor (verl's type hints say ``Tensor``)."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor, got shape {tuple(v.shape)}")
        v = v.item()  # a host sync for a CUDA tensor; pass a Python float to avoid it
    return v  # range/type checks: rollbuf.functional


def _float_tensor(name, x):
    return validation.check_tensor(name, x, validation.FLOATS, "a floating-point tensor")


def _row_flags(name, x, batch_shape, device):
    """``truncated`` per row: ``[*B]`` bool/integer/0-1 float → bool."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name} must be a flag tensor (bool, integer or 0/1 float), got dtype {x.dtype}")
    if tuple(x.shape) != tuple(batch_shape):
        raise ValueError(f"{name} must have shape {tuple(batch_shape)} (one flag per row), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the rollout is on {device}")
    return x if x.dtype == torch.bool else x != 0


def _row_values(name, x, batch_shape, device):
    _float_tensor(name, x)
    if tuple(x.shape) != tuple(batch_shape):
        raise ValueError(f"{name} must have shape {tuple(batch_shape)} (one value per row), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the rollout is on {device}")
    return x


def _fill_choice(fill_masked):
    if fill_masked not in FILL_MASKED:
        raise ValueError(f"fill_masked must be one of {FILL_MASKED}, got {fill_masked!r}")
    return fill_masked


def _window_end_bootstrap(truncated, bootstrap_values, batch_shape, device):
    """Per-row window-end bootstrap: ``V(s')`` for truncated rows, 0 (terminal) for the others.

    The row end is the window end of ``rollbuf.functional`` (its last unmasked token). With
    ``window_end="bootstrap"``, a window-end value of exactly 0 is the same arithmetic as a terminal
    end (``r + γ·0``, scan carry 0), so one ``[*B]`` tensor encodes "terminal or bootstrap" per row
    without a ``[*B, T]`` flag tensor and without a device sync. ``torch.where`` selects: a NaN in
    ``bootstrap_values`` of a row that is not truncated never reaches an output.
    """
    if truncated is None:
        if bootstrap_values is not None:
            raise ValueError(
                "bootstrap_values is given without truncated: say which rows were cut "
                "(truncated, [*B] bool); rows that are not truncated end terminally"
            )
        return None
    tr = _row_flags("truncated", truncated, batch_shape, device)
    if bootstrap_values is None:
        raise ValueError(
            "bootstrap_values ([*B], V(s') after the cut) is required when truncated is given: a "
            "truncated row bootstraps from it"
        )
    bv = _row_values("bootstrap_values", bootstrap_values, batch_shape, device)
    return torch.where(tr, bv, torch.zeros((), dtype=bv.dtype, device=device))


def _next_unmasked(m, segment=None):
    """For every token, the index of the first unmasked token at or after it in the same row
    (``T`` if none); with ``segment`` (``[*B, T]`` ids), only within the same segment."""
    T = m.shape[-1]
    pos = torch.arange(T, device=m.device)
    idx = torch.where(m, pos, T)
    nxt = torch.flip(torch.cummin(torch.flip(idx, (-1,)), dim=-1).values, (-1,))
    valid = nxt < T
    if segment is not None:
        seg_next = segment.gather(-1, nxt.clamp(max=T - 1))
        valid = valid & (seg_next == segment)
    return nxt, valid


def _carry_fill(out, m, segment=None):
    """verl's value at masked tokens: the output of the next unmasked token (0 if none)."""
    T = m.shape[-1]
    if T == 0:
        return out
    nxt, valid = _next_unmasked(m, segment)
    carried = out.gather(-1, nxt.clamp(max=T - 1))
    return torch.where(m, out, torch.where(valid, carried, torch.zeros((), dtype=out.dtype, device=out.device)))


def masked_whiten(values, mask, shift_mean: bool = True, *, out_dtype=None):
    """verl's ``masked_whiten``: ``(values − mean)·rsqrt(var + 1e-8)`` with the mean and the
    Bessel-corrected variance over **all** masked-in entries of the batch (one mean, one variance).

    As verl (``verl.utils.torch_functional.masked_whiten``): every entry is whitened, the masked
    ones too (with the masked-in statistics); ``shift_mean=False`` adds the mean back. Unlike the
    multiplication ``values * mask`` of older verl versions, entries at masked positions never enter
    the statistics, even NaN. Computed in float32 (float64 for float64 input), on the device: the
    count and the correction ``n/(n−1)`` are tensor arithmetic, so no device sync. Fewer than two
    masked-in entries (where verl raises) leave the variance undefined and every output NaN; under
    :class:`rollbuf.check_finite` that is a ``ValueError`` instead (the check reads the count back).
    """
    _float_tensor("values", values)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(values.shape):
        raise ValueError(f"mask must have shape {tuple(values.shape)}, got {tuple(mask.shape)}")
    m = mask if mask.dtype == torch.bool else mask != 0
    dt = torch.float64 if values.dtype == torch.float64 else torch.float32
    x = values.to(dt)
    n = m.sum()
    if validation.checking_finite() and not torch.compiler.is_compiling():
        count = int(n)  # the debug mode reads it back
        if count < 2:
            raise ValueError(
                f"masked_whiten needs at least two masked-in entries (Bessel correction n/(n−1)), "
                f"got {count} (rollbuf.check_finite is on; without it the outputs are NaN)"
            )
    n = n.to(dt)  # 0 entries: the mean is 0/0; one: n/(n−1) = 1/0 and the variance 0·inf: NaN
    zero = torch.zeros((), dtype=dt, device=x.device)
    mean = torch.where(m, x, zero).sum() / n
    var = torch.where(m, (x - mean) ** 2, zero).sum() / n * (n / (n - 1))
    w = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        w = w + mean
    return w.to(values.dtype if out_dtype is None else out_dtype)


def _finish_gae(res, values, m, fill_masked, whiten, segment=None):
    adv, ret = res
    if fill_masked == "carry":
        adv = _carry_fill(adv, m, segment)
        # verl: returns = advantages + values at every token, the masked ones included
        ret = torch.where(m, ret, (adv.to(torch.promote_types(adv.dtype, torch.float32))
                                   + values.to(torch.promote_types(values.dtype, torch.float32))).to(ret.dtype))
    if whiten:
        adv_w = masked_whiten(adv, m)
        adv = adv_w if fill_masked == "carry" else torch.where(
            m, adv_w, torch.zeros((), dtype=adv_w.dtype, device=adv_w.device))
    return GAEResult(adv, ret)


# -------------------------------------------------------------------------- padded rows [*B, T]


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, *,
                                 truncated=None, bootstrap_values=None, whiten: bool = False,
                                 fill_masked: str = "zero", out_dtype=None, backend: str = "auto"):
    r"""verl's multi-turn GAE (``verl.trainer.ppo.core_algos.compute_gae_advantage_return``) as one
    fused scan; a drop-in for its first five arguments.

    ``token_level_rewards``, ``values``, ``response_mask``: ``[bs, response_length]`` (any
    ``[*B, T]``, time last). ``response_mask`` may be bool, integer or 0/1 float (nonzero = model
    token). ``gamma``, ``lam``: numbers in [0, 1] (or one-element tensors).

    Returns ``GAEResult(advantages, returns)`` (a named tuple: ``adv, ret = ...`` works), ``[*B, T]``,
    ``returns = advantages + values`` before any whitening. On every token with
    ``response_mask = 1`` they equal verl's loop (to fp32 rounding; verl computes in the input
    dtype, rollbuf accumulates in fp32):

    * tokens with ``response_mask = 0`` are skipped (``nextvalues`` and ``lastgaelam`` carried
      across them), their rewards and values ignored — NaN there never leaks (verl's ``values *
      mask`` arithmetic would spread a NaN to the whole row);
    * the last model token of a row is terminal (verl starts from ``nextvalues = 0``), unless the
      row is ``truncated``.

    At tokens with ``response_mask = 0`` (``fill_masked``):

    * ``"zero"`` (default): advantages and returns are 0 (rollbuf's convention);
    * ``"carry"``: verl's values — the advantage of the next model token of the row (0 after the
      last one) and ``returns = that + values[t]`` (so a garbage value there gives a garbage
      return, as in verl). Costs one ``cummin`` and one gather over ``[*B, T]``.

    Both are discarded by a loss masked with ``response_mask``.

    Keyword-only extensions:

    * ``truncated`` (``[*B]`` flags) and ``bootstrap_values`` (``[*B]`` float): a truncated row (cut
      by a token limit or a turn cap, no EOS) bootstraps at its last model token from
      ``bootstrap_values[row]`` = ``V(s')``, the value of the state after the cut;
      ``bootstrap_values`` of the other rows is not read (NaN allowed).
    * ``whiten=True``: the returned advantages are :func:`masked_whiten`-ed over ``response_mask``,
      as verl does (statistics over every model token of the batch); masked tokens then hold 0
      (``"zero"``) or verl's whitened carried values (``"carry"``). verl always whitens; pass
      ``whiten=True`` for its exact output.
    * ``out_dtype``, ``backend``: as in :func:`rollbuf.functional.gae`.
    """
    gamma, lam = _scalar("gamma", gamma), _scalar("lam", lam)
    _fill_choice(fill_masked)
    f = fields_from_verl(token_level_rewards, values, response_mask)
    m = f["mask"]
    boot = _window_end_bootstrap(truncated, bootstrap_values, m.shape[:-1], m.device)
    if boot is not None:
        f["window_end"] = "bootstrap"
        f["bootstrap_values"] = boot
    res = F.gae(gamma, lam, **f, out_dtype=out_dtype, backend=backend)
    return _finish_gae(res, values, m, fill_masked, whiten)


def discounted_returns(token_level_rewards, response_mask, gamma, *, truncated=None,
                       bootstrap_values=None, fill_masked: str = "zero", out_dtype=None,
                       backend: str = "auto"):
    r"""REINFORCE-style discounted returns ``G_t = r_t + γ·G_{next model token}`` across masked spans.

    Tokens with ``response_mask = 0`` are skipped (as if deleted: the return flows across a tool
    span unchanged, undiscounted by its length; their rewards are ignored). The last model token of
    a row is terminal (``G = r``), or, for a ``truncated`` row, bootstraps:
    ``G = r + γ·bootstrap_values[row]``. ``fill_masked="carry"`` writes the return of the next model
    token at masked tokens (the value a carry-forward loop holds there), ``"zero"`` writes 0.

    Note: verl's REINFORCE++ loop (``compute_reinforce_plus_plus_outcome_advantage``) *resets* the
    running return at every masked token instead (``running_return *= response_mask[:, t]``),
    meant for padding after EOS. The two agree on rows whose masked tokens are all trailing
    padding; with a tool span inside a row, verl's loop cuts the return there and this function
    carries it across. For REINFORCE++ advantages whiten the result:
    ``masked_whiten(returns, response_mask) * response_mask``.
    """
    gamma = _scalar("gamma", gamma)
    _fill_choice(fill_masked)
    rewards = _float_tensor("token_level_rewards", token_level_rewards)
    f = fields_from_verl(rewards, rewards, response_mask)
    m = f["mask"]
    boot = _window_end_bootstrap(truncated, bootstrap_values, m.shape[:-1], m.device)
    if boot is None:
        g = F.discounted_returns(gamma, rewards=rewards, mask=m, bootstrap=True, window_end="terminal",
                                 out_dtype=out_dtype, backend=backend)
    else:
        g = F.discounted_returns(gamma, rewards=rewards, mask=m, bootstrap=True, window_end="bootstrap",
                                 bootstrap_values=boot, out_dtype=out_dtype, backend=backend)
    return _carry_fill(g, m) if fill_masked == "carry" else g


# ------------------------------------------------------------------ packed rows (varlen, cu_seqlens)


def _packed_layout(rewards, response_mask, cu_seqlens, truncated, bootstrap_values, check):
    """Per-token flags of a packed row: the sequence of each token, the end of each sequence (its
    last model token), and the truncation flag and bootstrap value placed there. Vectorised: one
    ``searchsorted``, a ``scatter_reduce`` (amax) and gathers; no loop over sequences or tokens."""
    _float_tensor("token_level_rewards", rewards)
    if rewards.dim() == 2:
        if rewards.shape[0] != 1:
            raise ValueError(f"token_level_rewards must be [1, total] or [total], got {tuple(rewards.shape)}")
    elif rewards.dim() != 1:
        raise ValueError(f"token_level_rewards must be [1, total] or [total], got {tuple(rewards.shape)}")
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(
            "cu_seqlens must be a 1-d int32 (or int64) tensor [num_seqs + 1] of cumulative sequence "
            f"lengths starting at 0, got dtype {cu_seqlens.dtype}, shape {tuple(cu_seqlens.shape)}"
        )
    if cu_seqlens.device != rewards.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but token_level_rewards is on {rewards.device}")
    total = rewards.shape[-1]
    device = rewards.device
    S = cu_seqlens.numel() - 1
    cu = cu_seqlens.to(torch.int64)
    bad = None
    if check:  # on the device: NaN outputs, no host read (check_finite reads it back and raises)
        bad = (cu[0] != 0) | (cu[-1] > total)
        if S:
            bad = bad | (cu[1:] < cu[:-1]).any()
        if validation.checking_finite() and not torch.compiler.is_compiling() and bool(bad):
            raise ValueError(
                f"cu_seqlens must start at 0, be non-decreasing and end at most at total = {total} "
                "(flash-attention varlen convention; rollbuf.check_finite is on: without it every "
                "output is NaN)"
            )
    m = response_mask.reshape(-1) if isinstance(response_mask, torch.Tensor) else response_mask
    f = fields_from_verl(rewards.reshape(-1), rewards.reshape(-1), m)
    m = f["mask"]
    pos = torch.arange(total, device=device)
    seg = torch.searchsorted(cu[1:].contiguous(), pos, right=True)  # sequence of each token; S = none
    m = m & (seg < S)  # tokens past cu_seqlens[-1] belong to no sequence
    # last model token of each sequence (-1: none); slot S collects the tokens of no sequence
    last = torch.full((S + 1,), -1, dtype=torch.int64, device=device)
    last = last.scatter_reduce(0, seg, torch.where(m, pos, -1), reduce="amax", include_self=True)
    is_end = m & (pos == last.gather(0, seg))
    tr_tok = None
    boot_tok = None
    if truncated is not None or bootstrap_values is not None:
        if truncated is None or bootstrap_values is None:
            raise ValueError(
                "packed truncation needs both truncated ([num_seqs] flags) and bootstrap_values "
                "([num_seqs], V(s') after each cut)"
            )
        tr = _row_flags("truncated", truncated, (S,), device)
        bv = _row_values("bootstrap_values", bootstrap_values, (S,), device)
        tr_ext = torch.cat([tr, tr.new_zeros(1)])
        bv_ext = torch.cat([bv, bv.new_zeros(1)])
        tr_tok = is_end & tr_ext.gather(0, seg)
        # read only where truncated (bootstrap_values elsewhere is ignored, NaN included)
        boot_tok = bv_ext.gather(0, seg)
    terminated = is_end if tr_tok is None else is_end & ~tr_tok
    shape = rewards.shape
    out = dict(mask=m.reshape(shape), terminated=terminated.reshape(shape))
    if tr_tok is not None:
        out["truncated"] = tr_tok.reshape(shape)
        out["bootstrap_values"] = boot_tok.reshape(shape)
    return out, seg.reshape(shape), bad


def _poisoned(x, bad):
    """``x`` with every element NaN where ``bad`` (a 0-d bool tensor: cu_seqlens broke the convention)."""
    return x if bad is None else torch.where(bad, torch.full((), float("nan"), dtype=x.dtype, device=x.device), x)


def packed_gae(token_level_rewards, values, response_mask, cu_seqlens, gamma, lam, truncated=None,
               bootstrap_values=None, *, whiten: bool = False, fill_masked: str = "zero",
               out_dtype=None, check: bool = True, backend: str = "auto"):
    r"""GAE on packed sequences: several trajectories concatenated in one row without padding.

    ``token_level_rewards``, ``values``, ``response_mask``: ``[1, total]`` or ``[total]``.
    ``cu_seqlens``: int32 ``[num_seqs + 1]``, the flash-attention varlen convention — sequence
    ``i`` is ``[cu_seqlens[i], cu_seqlens[i+1])``, ``cu_seqlens[0] = 0``; tokens at or after
    ``cu_seqlens[-1]`` (if ``cu_seqlens[-1] < total``) belong to no sequence and are treated as
    masked. ``truncated`` / ``bootstrap_values``: optional ``[num_seqs]``, as in
    :func:`compute_gae_advantage_return`.

    Each sequence behaves exactly as its own padded row: it ends at its **last model token**
    (trailing masked tokens of a sequence are not its end), terminal or, if truncated,
    bootstrapping from its ``bootstrap_values``; nothing flows between sequences; a sequence with
    no model token contributes nothing (outputs 0). Computed as **one** call of
    :func:`rollbuf.functional.gae` on the packed row, with ``terminated``/``truncated`` flags (and
    bootstrap values) placed at each sequence's last model token by vectorised ops.
    ``fill_masked="carry"`` carries within a sequence only. ``check=True`` checks ``cu_seqlens``
    on the device: cu_seqlens that do not start at 0, decrease or end past ``total`` make every
    output NaN (no device sync; under :class:`rollbuf.check_finite` a ``ValueError`` naming
    cu_seqlens instead); ``check=False`` skips the check.

    Returns ``GAEResult(advantages, returns)`` in the input's shape.
    """
    gamma, lam = _scalar("gamma", gamma), _scalar("lam", lam)
    _fill_choice(fill_masked)
    flags, seg, bad = _packed_layout(token_level_rewards, response_mask, cu_seqlens, truncated,
                                     bootstrap_values, check)
    _float_tensor("values", values)
    if tuple(values.shape) != tuple(token_level_rewards.shape):
        raise ValueError(f"values must have shape {tuple(token_level_rewards.shape)}, got {tuple(values.shape)}")
    res = F.gae(gamma, lam, rewards=token_level_rewards, values=values, window_end="terminal",
                out_dtype=out_dtype, backend=backend, **flags)
    adv, ret = _finish_gae(res, values, flags["mask"], fill_masked, whiten, segment=seg)
    return GAEResult(_poisoned(adv, bad), _poisoned(ret, bad))


def packed_discounted_returns(token_level_rewards, response_mask, cu_seqlens, gamma, truncated=None,
                              bootstrap_values=None, *, fill_masked: str = "zero", out_dtype=None,
                              check: bool = True, backend: str = "auto"):
    """:func:`discounted_returns` on packed sequences (``cu_seqlens`` as in :func:`packed_gae`)."""
    gamma = _scalar("gamma", gamma)
    _fill_choice(fill_masked)
    flags, seg, bad = _packed_layout(token_level_rewards, response_mask, cu_seqlens, truncated,
                                     bootstrap_values, check)
    g = F.discounted_returns(gamma, rewards=token_level_rewards, bootstrap=True, window_end="terminal",
                             out_dtype=out_dtype, backend=backend, **flags)
    return _poisoned(_carry_fill(g, flags["mask"], seg) if fill_masked == "carry" else g, bad)
