"""Token-level credit assignment for LLM reinforcement learning (PPO on multi-turn agent rollouts).

A row is one trajectory of up to ``T`` tokens: ``response_mask`` marks the model-generated tokens
(1) against tool/observation/padding tokens (0); ``token_level_rewards`` holds per-token rewards
(KL penalties plus a final score) and ``values`` the critic's per-token values. Every function here
is a thin layer over :mod:`rollbuf.functional`: one call of a fused estimator (``backend="auto"``:
the Triton kernels on CUDA tensors, the compiled ``numba`` loops on CPU tensors, the vectorised
``torch`` scan where numba is absent or the inputs require grad; ``backend=`` as in
rollbuf.functional), with no Python loop over tokens, rows or sequences.

Semantics ("as if deleted", docs/semantics.md): tokens with ``response_mask = 0`` are skipped — the
successor of a model token is the next model token, across any tool span — and their rewards and
values are ignored (a NaN there never leaks). The **row end** is the last model token of the row.
It is **terminal** (an EOS: no bootstrap), unless the row is flagged ``truncated`` (cut by a token
limit or a turn cap): then it bootstraps from ``bootstrap_values[row]`` = ``V(s')``, the value of
the state after the cut. ``mask_mode="zero"`` gives OpenRLHF's recursion instead: masked tokens
stay in it with reward and value 0, and the row end is its last position (docs/llm.md, section 1, mask modes).

* :func:`compute_gae_advantage_return`: verl's multi-turn ``compute_gae_advantage_return``, same
  arguments, shapes and values on masked-in positions; optional truncation, whitening and verl's
  values at masked positions (``fill_masked="carry"``).
* :func:`discounted_returns`: REINFORCE-style discounted returns across masked spans.
* :func:`packed_gae`, :func:`packed_discounted_returns`: several trajectories packed in one row
  without padding, described by ``cu_seqlens`` (the flash-attention varlen convention).
* :func:`turn_returns`, :func:`turn_gae` (:func:`packed_turn_returns`, :func:`packed_turn_gae` on
  ``cu_seqlens``): the turn (a run of model tokens) as the time step: ROLL's turn-level returns,
  turn-level GAE.
* :func:`length_adaptive_lam`: VAPO's per-row λ ``1 − 1/(α·len)``. ``gamma`` and ``lam`` of the token
  estimators may be ``[*B]`` tensors (one per row; ``[num_seqs]`` when packed), and the GAE functions
  take a separate ``lam_returns`` for the value targets.
* :func:`masked_whiten`: verl's ``masked_whiten`` (batch statistics over masked-in tokens).

Inputs may be float32, bfloat16, float16 or float64; rollbuf accumulates in float32 (float64 stays
float64) and returns the promoted input dtype unless ``out_dtype`` says otherwise.
"""

from __future__ import annotations

import functools

import torch

from rollbuf import backends, validation
from rollbuf import functional as F
from rollbuf.boundary.conventions import as_flags, fields_from_verl
from rollbuf.estimators import positive, unit_interval
from rollbuf.functional import GAEResult
from rollbuf.problem import Family, Problem

__all__ = [
    "compute_gae_advantage_return",
    "discounted_returns",
    "packed_gae",
    "packed_discounted_returns",
    "turn_returns",
    "turn_gae",
    "packed_turn_returns",
    "packed_turn_gae",
    "length_adaptive_lam",
    "masked_whiten",
    "MASK_MODES",
    "FILL_MASKED",
]

#: Values of ``mask_mode``: how the token recursions treat tokens with ``response_mask = 0``.
#: ``"skip"``: as if deleted (verl, NeMo-RL); ``"zero"``: run through, reward and value 0 (OpenRLHF).
MASK_MODES = ("skip", "zero")
#: Values of ``fill_masked``: what the outputs hold at tokens with ``response_mask = 0``.
FILL_MASKED = ("zero", "carry", "keep")


# ----------------------------------------------------------------------------------- helpers


def _scalar(name, v):
    """A hyper-parameter: a Python number, or a 0-d tensor (verl's type hints say ``Tensor``)."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor, got shape {tuple(v.shape)}")
        v = v.item()  # a host sync for a CUDA tensor; pass a Python float to avoid it
    return v  # range/type checks: rollbuf.functional


def _hyper(name, v, shape, device):
    """``gamma``/``lam``: a number for the fused path (:func:`_scalar`: a Python number, a 0-d tensor, or a
    one-element tensor not of ``shape``), or a floating-point tensor of ``shape`` (``[*B]``: one value per row;
    ``[num_seqs]``: per packed sequence) for the per-row path (:func:`_coef_scan`). Nothing is broadcast. A
    per-row value outside [0, 1] (NaN included) is a ``ValueError`` naming the argument where it can be read
    without a device sync (a CPU tensor, outside ``torch.compile``) or under :class:`rollbuf.check_finite`;
    otherwise its row's outputs are NaN."""
    if not isinstance(v, torch.Tensor) or v.dim() == 0 or (v.shape != shape and v.numel() == 1):
        return _scalar(name, v)
    if v.shape != shape:
        raise ValueError(f"{name} must be a number or a tensor of shape {tuple(shape)} (one value per row, or per "
                         f"sequence of a packed row), got shape {tuple(v.shape)}; nothing is broadcast")
    _float_tensor(name, v)
    if v.device != device:
        raise ValueError(f"{name} is on {v.device} but the rollout is on {device}")
    if (v.device.type == "cpu" or validation.checking_finite()) and not torch.compiler.is_compiling():
        bad = ~((v >= 0) & (v <= 1))
        if bool(bad.any()):
            at = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{name} must lie in [0, 1], got {float(v[at])} at row {at[0] if len(at) == 1 else at}")
    return v


def _per_row(*params):
    return any(isinstance(x, torch.Tensor) for x in params)


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


def _modes(mask_mode, fill_masked):
    if mask_mode not in MASK_MODES:
        raise ValueError(f"mask_mode must be one of {MASK_MODES}, got {mask_mode!r}")
    if fill_masked not in FILL_MASKED:
        raise ValueError(f"fill_masked must be one of {FILL_MASKED}, got {fill_masked!r}")
    if fill_masked != "zero" and (fill_masked == "carry") != (mask_mode == "skip"):
        raise ValueError(
            f"fill_masked={fill_masked!r} does not go with mask_mode={mask_mode!r}: \"carry\" (the next "
            "model token's outputs) is for mask_mode=\"skip\", \"keep\" (the recursion's own outputs) "
            "for mask_mode=\"zero\""
        )


def _zero_masked(x, m):
    """``x`` with 0 at masked tokens, selected (a NaN there does not survive, as it would ``x * m``)."""
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


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


def _finish_gae(res, values, m, fill_masked, whiten, segment=None, zeroed=False):
    """``fill_masked`` and ``whiten`` on a GAE result; ``zeroed``: it came from ``mask_mode="zero"``
    (the scan wrote every token, so ``"zero"`` has to clear the masked ones)."""
    adv, ret = res
    if fill_masked == "carry":
        adv = _carry_fill(adv, m, segment)
        # verl: returns = advantages + values at every token, the masked ones included
        ret = torch.where(m, ret, (adv.to(torch.promote_types(adv.dtype, torch.float32))
                                   + values.to(torch.promote_types(values.dtype, torch.float32))).to(ret.dtype))
    elif fill_masked == "zero" and zeroed:
        adv, ret = _zero_masked(adv, m), _zero_masked(ret, m)
    return GAEResult(_whitened(adv, m, fill_masked) if whiten else adv, ret)


def _whitened(adv, m, fill_masked):
    """``whiten=True``: :func:`masked_whiten` over the model tokens (masked ones 0 again for ``"zero"``)."""
    adv_w = masked_whiten(adv, m)
    return _zero_masked(adv_w, m) if fill_masked == "zero" else adv_w


def _fill_returns(g, m, fill_masked, zeroed, segment=None):
    """``fill_masked`` on discounted returns (``zeroed`` as in :func:`_finish_gae`)."""
    if fill_masked == "carry":
        return _carry_fill(g, m, segment)
    return _zero_masked(g, m) if fill_masked == "zero" and zeroed else g


def _successor(s, segment=None):
    """For every token, the index of the first token of ``s`` after it in the same row (clamped into the row)
    and whether there is one; with ``segment`` (``[*B, T]`` ids), only one of the same segment."""
    nxt, valid = _next_unmasked(torch.nn.functional.pad(s, (0, 1))[..., 1:])
    nxt = (nxt + 1).clamp(max=max(s.shape[-1] - 1, 0))
    if segment is not None:
        valid = valid & (segment.gather(-1, nxt) == segment)
    return nxt, valid


def _coef(name, x, ct, seg, device):
    """A hyper-parameter as a ``ct`` tensor that broadcasts over the tokens, clamped into [0, 1] (NaN: 0), and
    where it was not in [0, 1] (``None`` for a number, which is checked): a number → 0-d; a ``[*B]`` tensor →
    ``[*B, 1]``; a ``[num_seqs]`` tensor → per token of the packed row (``seg``: each token's sequence)."""
    if not isinstance(x, torch.Tensor):
        return torch.full((), unit_interval(name, x), dtype=ct, device=device), None
    x = x.to(ct)
    x = x.unsqueeze(-1) if seg is None else torch.cat([x, x.new_zeros(1)]).gather(0, seg.reshape(-1)).reshape(seg.shape)
    safe = x.nan_to_num(0.0).clamp(0.0, 1.0)
    return safe, safe != x


def _coef_scan(r, v, lay, coefs, fill_masked, out_dtype, backend):
    r"""The token estimators with per-row (per-sequence) ``gamma``/``lam`` tensors or a separate ``lam_returns``.

    Built elementwise, per token: ``α_t = δ_t = r_t + γ·V_{t'} − V_t`` (``t'`` the next token of the recursion
    ``scan`` in the same row or segment; past the last one ``V_{t'}`` is ``boot``, ``V(s')`` of a truncated row,
    else 0) and ``β_t = γλ``; then **one** :func:`rollbuf.functional.affine_scan` ``y_t = α_t + β_t·y_{t'}``
    over one channel per λ of ``coefs`` (``{"gamma": γ, "lam": λ[, "lam_returns": λ']}``). A token outside the
    recursion has ``α = 0, β = 1`` (it carries the next token's ``y``: verl's value there), ``β = 0`` where no
    token follows in its row or segment. ``v=None``: discounted returns (``V ≡ 0``, ``λ = 1``). ``lay`` is
    ``(m, scan, segment, boot)``. Returns ``(y of the first channel, y of the last + V)`` (``None`` for the
    second when ``v`` is ``None``), ``fill_masked`` applied, in the promoted dtype (or ``out_dtype``); a row
    (sequence) whose γ or λ is outside [0, 1] gets NaN everywhere."""
    m, s, seg, boot = lay
    dts = [x.dtype for x in (r, v, boot) if x is not None]
    if out_dtype is not None and out_dtype not in validation.FLOATS:
        raise TypeError(f"out_dtype must be a floating-point dtype, got {out_dtype}")
    ct = torch.float64 if torch.float64 in dts else torch.float32
    out = out_dtype or functools.reduce(torch.promote_types, dts)
    (gamma, bad), *lams = (_coef(name, x, ct, seg, r.device) for name, x in coefs.items())
    for _, b in lams:
        if b is not None:
            bad = b if bad is None else bad | b
    zero = torch.zeros((), dtype=ct, device=r.device)
    v0 = torch.zeros_like(r, dtype=ct) if v is None else torch.where(m, v.to(ct), zero)
    nxt, valid = _successor(s, seg)
    v_next = torch.where(valid, v0.gather(-1, nxt), zero if boot is None else boot.to(ct))
    alpha = torch.where(s, torch.where(m, r.to(ct), zero) + gamma * v_next - v0, zero)
    beta = torch.stack([torch.where(valid, torch.where(s, gamma * lam, 1.0), 0.0) for lam, _ in lams])
    y = F.affine_scan(alpha.expand_as(beta), beta, reverse=True, backend=backend)
    nan = torch.full((), float("nan"), dtype=ct, device=r.device)

    def finish(x):
        x = _zero_masked(x, m) if fill_masked == "zero" else x
        return (x if bad is None else torch.where(bad, nan, x)).to(out)

    return finish(y[0]), None if v is None else finish(y[-1] + (v.to(ct) if fill_masked == "carry" else v0))


# -------------------------------------------------------------------------- padded rows [*B, T]


def _padded(m, boot, mask_mode):
    """:func:`_coef_scan`'s ``lay`` for padded rows: the recursion runs over the model tokens (``"skip"``) or
    every token (``"zero"``); past its end ``boot`` (``[*B]``, or ``None``: terminal)."""
    scan = m if mask_mode == "skip" else torch.ones_like(m)
    return m, scan, None, None if boot is None else boot.unsqueeze(-1)


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, *, lam_returns=None,
                                 truncated=None, bootstrap_values=None, whiten: bool = False,
                                 mask_mode: str = "skip", fill_masked: str = "zero", out_dtype=None,
                                 backend: str = "auto"):
    r"""verl's multi-turn GAE (``verl.trainer.ppo.core_algos.compute_gae_advantage_return``) as one
    fused scan; a drop-in for its first five arguments.

    ``token_level_rewards``, ``values``, ``response_mask``: ``[bs, response_length]`` (any
    ``[*B, T]``, time last). ``response_mask`` may be bool, integer or 0/1 float (nonzero = model
    token). ``gamma``, ``lam``: numbers in [0, 1] (or one-element tensors), or ``[*B]`` float tensors, one
    value per row (VAPO's length-adaptive λ, :func:`length_adaptive_lam`; see ``lam_returns``).

    Returns ``GAEResult(advantages, returns)`` (a named tuple: ``adv, ret = ...`` works), ``[*B, T]``,
    ``returns = advantages + values`` before any whitening (with ``lam_returns``: the advantages of
    ``λ = lam_returns`` + values). On every token with
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
    * ``"keep"`` (``mask_mode="zero"`` only): the recursion's own outputs there (OpenRLHF's).

    All are discarded by a loss masked with ``response_mask``.

    Keyword-only extensions:

    * ``mask_mode``: ``"skip"`` (default) as above — verl's multi-turn loop, and NeMo-RL's
      ``GeneralizedAdvantageEstimator`` (its "carry-forward" is the same recursion; it writes 0
      advantages and the carried ``returns`` at masked tokens). ``"zero"``: OpenRLHF's
      ``get_advantages_and_returns`` — the recursion runs through masked tokens, whose rewards and
      values count as 0 (``δ_t = m_t r_t + γ m_{t+1} V_{t+1} − m_t V_t``,
      ``A_t = δ_t + γλ A_{t+1}``, ``returns = A + m·V``); the row end is its last position
      (terminal, or ``bootstrap_values`` for a ``truncated`` row); masked values are selected
      out, not multiplied (NaN there never leaks). Costs two ``[*B, T]`` temporaries (``r``, ``V``
      with masked entries 0).

    * ``truncated`` (``[*B]`` flags) and ``bootstrap_values`` (``[*B]`` float): a truncated row (cut
      by a token limit or a turn cap, no EOS) bootstraps at its last model token from
      ``bootstrap_values[row]`` = ``V(s')``, the value of the state after the cut;
      ``bootstrap_values`` of the other rows is not read (NaN allowed).
    * ``whiten=True``: the returned advantages are :func:`masked_whiten`-ed over ``response_mask``,
      as verl does (statistics over every model token of the batch); masked tokens then hold 0
      (``"zero"``) or verl's whitened carried values (``"carry"``). verl always whitens; pass
      ``whiten=True`` for its exact output.
    * ``lam_returns`` (a number or ``[*B]``; default ``None``: ``lam``): the critic's own λ, as VAPO
      (AReaL, NeMo-RL) decouple them: the value targets are ``returns = A(γ, lam_returns) + V``, the
      advantages ``A(γ, lam)`` (e.g. ``lam_returns=1.0``: unbiased Monte-Carlo targets with a
      length-adaptive actor λ).
    * per-row ``gamma``/``lam`` tensors or ``lam_returns``: δ and ``β = γλ`` are built per token and
      **one** :func:`rollbuf.functional.affine_scan` runs the advantage and return recursions together
      (two channels), the same values as the fused path (to fp32 rounding). A per-row value outside
      [0, 1] is a ``ValueError`` naming the argument for CPU tensors (and under :class:`rollbuf.check_finite`);
      on a GPU (and under ``torch.compile``) it is not read back (no host sync): that row's outputs are NaN.
    * ``out_dtype``, ``backend``: as in :func:`rollbuf.functional.gae`.
    """
    _modes(mask_mode, fill_masked)
    f = fields_from_verl(token_level_rewards, values, response_mask)
    m = f["mask"]
    B, dev = m.shape[:-1], m.device
    gamma, lam = _hyper("gamma", gamma, B, dev), _hyper("lam", lam, B, dev)
    boot = _window_end_bootstrap(truncated, bootstrap_values, B, dev)
    if lam_returns is not None or _per_row(gamma, lam):
        coefs = dict(gamma=gamma, lam=lam, lam_returns=lam if lam_returns is None else
                     _hyper("lam_returns", lam_returns, B, dev))
        adv, ret = _coef_scan(f["rewards"], f["values"], _padded(m, boot, mask_mode), coefs, fill_masked,
                              out_dtype, backend)
        return GAEResult(_whitened(adv, m, fill_masked) if whiten else adv, ret)
    if boot is not None:
        f["window_end"] = "bootstrap"
        f["bootstrap_values"] = boot
    zeroed = mask_mode == "zero"
    if zeroed:  # OpenRLHF: every token in the scan, masked rewards and values 0
        f.update(rewards=_zero_masked(f["rewards"], m), values=_zero_masked(f["values"], m), mask=None)
    res = F.gae(gamma, lam, **f, out_dtype=out_dtype, backend=backend)
    return _finish_gae(res, values, m, fill_masked, whiten, zeroed=zeroed)


def discounted_returns(token_level_rewards, response_mask, gamma, *, truncated=None,
                       bootstrap_values=None, mask_mode: str = "skip", fill_masked: str = "zero",
                       out_dtype=None, backend: str = "auto"):
    r"""REINFORCE-style discounted returns ``G_t = r_t + γ·G_{next model token}`` across masked spans.

    Tokens with ``response_mask = 0`` are skipped (as if deleted: the return flows across a tool
    span unchanged, undiscounted by its length; their rewards are ignored). The last model token of
    a row is terminal (``G = r``), or, for a ``truncated`` row, bootstraps:
    ``G = r + γ·bootstrap_values[row]``. ``fill_masked="carry"`` writes the return of the next model
    token at masked tokens (the value a carry-forward loop holds there), ``"zero"`` writes 0.

    ``mask_mode="zero"``: OpenRLHF's ``get_cumulative_returns`` — ``G_t = m_t r_t + γ G_{t+1}``
    over every token (a masked token costs a discount ``γ`` and adds nothing), the row end its last
    position (``G = m r``, or ``+ γ·bootstrap_values[row]`` if truncated); one ``[*B, T]``
    temporary (``r`` with masked entries 0); ``fill_masked="keep"`` leaves the running return at
    masked tokens (OpenRLHF's outputs), ``"zero"`` writes 0.

    verl 0.9.1's REINFORCE++ loop (``compute_reinforce_plus_plus_outcome_advantage``) carries its
    running return across masked tokens the same way, writing 0 there (this function with the
    default ``mask_mode="skip"``, ``fill_masked="zero"``); older verl versions reset it at every
    masked token (``running_return *= response_mask[:, t]``), cutting the return at a tool span
    inside a row. For REINFORCE++ advantages whiten the result:
    ``masked_whiten(returns, response_mask) * response_mask``.
    """
    _modes(mask_mode, fill_masked)
    rewards = _float_tensor("token_level_rewards", token_level_rewards)
    m = fields_from_verl(rewards, rewards, response_mask)["mask"]
    gamma = _hyper("gamma", gamma, m.shape[:-1], m.device)
    boot = _window_end_bootstrap(truncated, bootstrap_values, m.shape[:-1], m.device)
    if _per_row(gamma):
        return _coef_scan(rewards, None, _padded(m, boot, mask_mode), dict(gamma=gamma, lam=1.0), fill_masked,
                          out_dtype, backend)[0]
    end = dict(window_end="terminal") if boot is None else dict(window_end="bootstrap", bootstrap_values=boot)
    zeroed = mask_mode == "zero"
    g = F.discounted_returns(gamma, rewards=_zero_masked(rewards, m) if zeroed else rewards,
                             mask=None if zeroed else m, bootstrap=True, **end, out_dtype=out_dtype,
                             backend=backend)
    return _fill_returns(g, m, fill_masked, zeroed)


# ------------------------------------------------------------------ turn-level estimators [*B, T]


def _model_mask(response_mask):
    """``response_mask`` checked: a ``[*B, T]`` flag tensor (nonzero: a model token)."""
    if not isinstance(response_mask, torch.Tensor) or response_mask.dim() < 1 or response_mask.is_complex():
        raise ValueError("response_mask must be a [*B, T] flag tensor (bool, integer or 0/1 float)")
    return response_mask


def _turns(response_mask, turn_ids, segment=None):
    """``(on, start, end)`` ``[*B, T]`` bool: the model tokens, each turn's first and last model token.
    A turn is a maximal run of model tokens, or (``turn_ids``, ``[*B, T]`` integers) the model tokens
    of a row that share an id, consecutive among the row's model tokens (an id that comes back later
    starts a new turn); with ``segment`` (packed rows: each token's sequence), within one sequence."""
    on = as_flags(_model_mask(response_mask), "response_mask")
    if turn_ids is not None:
        if not isinstance(turn_ids, torch.Tensor) or turn_ids.shape != on.shape or turn_ids.is_floating_point():
            raise ValueError(f"turn_ids must be an integer tensor of response_mask's shape {tuple(on.shape)}")
        if turn_ids.device != on.device:
            raise ValueError(f"turn_ids is on {turn_ids.device} but response_mask is on {on.device}")
    T = on.shape[-1]
    if turn_ids is None and segment is None and T:  # a run's edges, by shifted views (no padded copies)
        return on, _edge(on, on[..., 1:], on[..., :-1], 0), _edge(on, on[..., :-1], on[..., 1:], -1)
    if turn_ids is None:  # a run: the next (previous) token is a model token
        nxt = torch.arange(1, T + 1, device=on.device).clamp(max=max(T - 1, 0)).expand_as(on)
        prev = torch.arange(-1, T - 1, device=on.device).clamp(min=0).expand_as(on)
        has_next = torch.nn.functional.pad(on, (0, 1))[..., 1:]
        has_prev = torch.nn.functional.pad(on, (1, 0))[..., :T]
    else:  # the next (previous) model token has the same id
        nxt, has_next = _successor(on)
        prev = torch.cummax(torch.where(on, torch.arange(T, device=on.device), -1), dim=-1).values  # at or before t
        prev = torch.nn.functional.pad(prev, (1, 0), value=-1)[..., :T]  # ... before t
        has_prev, prev = prev >= 0, prev.clamp(min=0)
    for ids in (turn_ids, segment):  # and the same sequence
        if ids is not None:
            has_next = has_next & (ids.gather(-1, nxt) == ids)
            has_prev = has_prev & (ids.gather(-1, prev) == ids)
    return on, on & ~has_prev, on & ~has_next


def _edge(on, inner, neighbour, at):
    """``on`` where the neighbouring token is not a model token: ``inner``/``neighbour`` are ``on`` without
    its first and last token (or the reverse), ``at`` the end a row's neighbour is missing at (0 or −1)."""
    out = torch.empty_like(on)
    torch.logical_and(inner, torch.logical_not(neighbour), out=out[..., 1:] if at == 0 else out[..., :-1])
    out[..., at] = on[..., at]
    return out


def turn_returns(token_level_rewards, response_mask, gamma, *, turn_ids=None, out_dtype=None, backend="auto"):
    r"""Turn-level discounted returns (ROLL's ``agentic_reinforce``): each turn ``k`` of a row (a maximal
    run of model tokens, or ``turn_ids``) gets ``R_k = r_k + γ·R_{k+1}``, ``r_k`` the reward at the
    turn's last model token (where the frameworks put a turn's reward; other rewards are not read),
    ``R`` of a row's last turn its own reward, broadcast over the turn's model tokens; 0 at the other
    tokens. ``gamma``: a number, or ``[*B]`` (one per row). One affine scan over the tokens,
    ``y_t = α_t + β_t·y_{t+1}`` with ``(α, β) = (r_t, γ)`` at a turn's last token and ``(0, 1)`` elsewhere
    (a token carries the return of its turn's end). ``[*B, T]``; docs/llm.md, section 12."""
    model = _model_mask(response_mask)
    rewards = _float_tensor("token_level_rewards", token_level_rewards)
    if rewards.shape != model.shape:
        raise ValueError(f"token_level_rewards must have response_mask's shape {tuple(model.shape)}, "
                         f"got {tuple(rewards.shape)}")
    if out_dtype is not None and out_dtype not in validation.FLOATS:
        raise TypeError(f"out_dtype must be a floating-point dtype, got {out_dtype}")
    ct = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    gamma = _hyper("gamma", gamma, model.shape[:-1], model.device)
    if turn_ids is None and _on_turn_kernel(gamma, rewards, model, backend):
        return _turn_kernel(rewards, model, unit_interval("gamma", gamma), ct, out_dtype or rewards.dtype)
    on, _, end = _turns(response_mask, turn_ids)
    g, bad = _coef("gamma", gamma, ct, None, on.device)
    zero = torch.zeros((), dtype=ct, device=on.device)
    y = F.affine_scan(torch.where(end, rewards.to(ct), zero), torch.where(end, g, 1.0),
                      reverse=True, backend=backend)
    y = torch.where(on, y, zero)
    return (y if bad is None else torch.where(bad, float("nan"), y)).to(out_dtype or rewards.dtype)


def _on_turn_kernel(gamma, rewards, model, backend) -> bool:
    """Whether :func:`turn_returns` runs on the turn kernel: a number ``gamma``, the triton backend (``auto``
    on CUDA tensors), the mask on the rewards' device, no gradient asked for (the kernel has no backward:
    the affine scan's path has), not under :class:`rollbuf.check_finite` (the torch path checks)."""
    if isinstance(gamma, torch.Tensor) or rewards.shape[-1] == 0 or model.device != rewards.device:
        return False
    if validation.checking_finite():  # the torch path reads the inputs back and names a non-finite one
        return False
    if torch.is_grad_enabled() and rewards.requires_grad:
        return False
    return backends.resolve(backend, rewards.device) == "triton"


def _turn_kernel(rewards, model, gamma, ct, out_dtype):
    """Turn-level returns on the turn kernel (:mod:`rollbuf.kernels.turns`, the mask's flags read as they
    are: nonzero is a model token, as :func:`_turns` reads them): rows flattened to ``[N, T]``."""
    from rollbuf import kernels  # the kernels need Triton: imported when asked for

    shape = rewards.shape
    T = shape[-1]
    p = Problem(family=Family.TURN, outputs=("returns",), fields={"rewards": rewards.reshape(-1, T),
                                                                   "model": model.reshape(-1, T)},
                gamma=gamma, compute_dtype=ct, out_dtype=out_dtype)
    (y,), _ = kernels.run(p)
    return y.reshape(shape)


def turn_gae(token_level_rewards, values, response_mask, gamma, lam, *, lam_returns=None, turn_ids=None,
             value_at="first", truncated=None, bootstrap_values=None, out_dtype=None, backend="auto"):
    r"""Turn-level GAE: the turn is the time step. ``δ_k = r_k + γ·V_{k+1} − V_k``,
    ``A_k = δ_k + γλ·A_{k+1}`` over a row's turns (a maximal run of model tokens, or ``turn_ids``),
    ``r_k`` the reward at the turn's last model token, ``V_k`` the value at its first model token
    (``value_at="first"``, the state the turn was generated from) or its last (``"last"``); the row's
    last turn is terminal unless the row is ``truncated`` (then ``V_{K}`` = ``bootstrap_values[row]``).
    Returns ``GAEResult(advantages, returns)``, ``returns = A_k + V_k`` (``A`` of ``λ = lam_returns``
    when given), broadcast over each turn's model tokens, 0 elsewhere. ``gamma``, ``lam``,
    ``lam_returns``: numbers or ``[*B]``, as in :func:`compute_gae_advantage_return`. One masked GAE scan
    over the turn ends (:func:`compute_gae_advantage_return`); docs/llm.md, section 12."""
    if turn_ids is None and value_at == "first" and lam_returns is None:
        res = _turn_gae_kernel(token_level_rewards, values, response_mask, gamma, lam, (truncated, bootstrap_values),
                               out_dtype, backend)
        if res is not None:
            return res
    on, start, end = _turns(response_mask, turn_ids)
    v = _turn_values(values, on, start, value_at)
    adv, ret = compute_gae_advantage_return(token_level_rewards, v, end, gamma, lam, lam_returns=lam_returns,
                                            truncated=truncated, bootstrap_values=bootstrap_values,
                                            fill_masked="carry", out_dtype=out_dtype, backend=backend)
    return _turn_outputs(adv, ret, on, end, value_at)


def _turn_gae_kernel(rewards, values, response_mask, gamma, lam, cut, out_dtype, backend):
    """:func:`turn_gae` on the turn kernels (numbers ``gamma`` and ``lam``, values of the mask's shape, the
    triton backend, no gradient asked for), else None: the returns ``G_k`` at every model token and the
    advantage ``G_k − V_k`` at each turn's first token in one backward scan, the advantage carried over
    the turn by a forward fill; ``cut``: ``(truncated, bootstrap_values)``. ``[*B, T]`` flattened to ``[N, T]``."""
    from rollbuf import kernels  # the kernels need Triton: imported when asked for

    model = _model_mask(response_mask)
    r, v = _float_tensor("token_level_rewards", rewards), _float_tensor("values", values)
    if r.shape != model.shape or v.shape != model.shape or out_dtype not in (None, *validation.FLOATS):
        return None  # the torch path names what is wrong
    B, dev = model.shape[:-1], model.device
    gamma, lam = _hyper("gamma", gamma, B, dev), _hyper("lam", lam, B, dev)
    truncated, bootstrap_values = cut
    floats = [x for x in (v, bootstrap_values) if isinstance(x, torch.Tensor)]
    if _per_row(gamma, lam) or not _on_turn_kernel(gamma, r, model, backend) or v.device != dev or (
            torch.is_grad_enabled() and any(x.requires_grad for x in floats)):
        return None
    boot = _window_end_bootstrap(truncated, bootstrap_values, B, dev)
    dtypes = [r.dtype, *(x.dtype for x in floats)]  # the torch path's promotion, bootstrap_values included
    ct = torch.float64 if torch.float64 in dtypes else torch.float32
    out = out_dtype or functools.reduce(torch.promote_types, dtypes)
    T = model.shape[-1]
    flat = {"rewards": r.reshape(-1, T), "model": model.reshape(-1, T), "values": v.reshape(-1, T)}
    carry = None if boot is None else boot.reshape(-1).to(ct).contiguous()
    (ret, first), _ = kernels.run(Problem(family=Family.TURN_GAE, outputs=("returns", "start_advantages"), fields=flat,
                                          gamma=unit_interval("gamma", gamma), lam=unit_interval("lam", lam),
                                          carry=carry, compute_dtype=ct, out_dtype=out))
    (adv,), _ = kernels.run(Problem(family=Family.TURN_FILL, outputs=("advantages",),
                                    fields={"start_advantages": first, "model": flat["model"]}, compute_dtype=ct,
                                    out_dtype=out))
    return GAEResult(adv.reshape(model.shape), ret.reshape(model.shape))


def _turn_values(values, on, start, value_at):
    """``values`` with each token holding its turn's first model token's value (``value_at="first"``)."""
    if value_at not in ("first", "last"):
        raise ValueError(f"value_at must be 'first' or 'last', got {value_at!r}")
    v = _float_tensor("values", values)
    if value_at == "first" and v.shape == on.shape:
        pos = torch.arange(on.shape[-1], device=on.device)
        v = v.gather(-1, torch.cummax(torch.where(start, pos, 0), dim=-1).values)
    return v


def _turn_outputs(adv, ret, on, end, value_at):
    """Turn GAE's outputs: 0 off the model tokens; with ``value_at="last"`` the carried returns read the
    token's own value, so the turn's end return is carried instead."""
    if value_at == "last":
        ret = _carry_fill(_zero_masked(ret, end), end)
    return GAEResult(_zero_masked(adv, on), _zero_masked(ret, on))


# ------------------------------------------------------------------ packed rows (varlen, cu_seqlens)


def _packed_rewards(rewards):
    _float_tensor("token_level_rewards", rewards)
    if rewards.dim() not in (1, 2) or (rewards.dim() == 2 and rewards.shape[0] != 1):
        raise ValueError(f"token_level_rewards must be [1, total] or [total], got {tuple(rewards.shape)}")
    return rewards


def _cu_seqlens(cu_seqlens, total, device, check):
    """``cu_seqlens`` as int64, and (``check``) a 0-d bool tensor: it breaks the convention."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(
            "cu_seqlens must be a 1-d int32 (or int64) tensor [num_seqs + 1] of cumulative sequence "
            f"lengths starting at 0, got dtype {cu_seqlens.dtype}, shape {tuple(cu_seqlens.shape)}"
        )
    if cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but token_level_rewards is on {device}")
    cu = cu_seqlens.to(torch.int64)
    if not check:
        return cu, None
    # on the device: NaN outputs, no host read (check_finite reads it back and raises)
    bad = (cu[0] != 0) | (cu[-1] > total)
    if cu.numel() > 1:
        bad = bad | (cu[1:] < cu[:-1]).any()
    if validation.checking_finite() and not torch.compiler.is_compiling() and bool(bad):
        raise ValueError(
            f"cu_seqlens must start at 0, be non-decreasing and end at most at total = {total} "
            "(flash-attention varlen convention; rollbuf.check_finite is on: without it every "
            "output is NaN)"
        )
    return cu, bad


def _segment_of(cu, total):
    """Each token's sequence (``num_seqs`` for the tokens past ``cu_seqlens[-1]``), from int64 ``cu``."""
    return torch.searchsorted(cu[1:].contiguous(), torch.arange(total, device=cu.device), right=True)


def _sequence_ends(candidates, seg, num_seqs):
    """Per token: it is the last of the ``candidates`` tokens of its sequence (``scatter_reduce``
    amax of the positions into ``num_seqs + 1`` slots, the last one for tokens of no sequence)."""
    pos = torch.arange(seg.shape[0], device=seg.device)
    last = torch.full((num_seqs + 1,), -1, dtype=torch.int64, device=seg.device)
    last = last.scatter_reduce(0, seg, torch.where(candidates, pos, -1), reduce="amax", include_self=True)
    return candidates & (pos == last.gather(0, seg))


def _packed_truncation(truncated, bootstrap_values, is_end, seg, num_seqs):
    """The truncation flag (at each truncated sequence's end) and the bootstrap value per token,
    or ``(None, None)``; ``bootstrap_values`` is read only where truncated (NaN elsewhere is fine)."""
    if truncated is None and bootstrap_values is None:
        return None, None
    if truncated is None or bootstrap_values is None:
        raise ValueError(
            "packed truncation needs both truncated ([num_seqs] flags) and bootstrap_values "
            "([num_seqs], V(s') after each cut)"
        )
    tr = _row_flags("truncated", truncated, (num_seqs,), seg.device)
    bv = _row_values("bootstrap_values", bootstrap_values, (num_seqs,), seg.device)
    tr_tok = is_end & torch.cat([tr, tr.new_zeros(1)]).gather(0, seg)
    return tr_tok, torch.cat([bv, bv.new_zeros(1)]).gather(0, seg)


def _packed_layout(rewards, response_mask, cu_seqlens, truncated, bootstrap_values, check, mask_mode):
    """Per-token flags of a packed row for one ``rollbuf.functional`` call, the response mask
    (restricted to tokens of a sequence), the sequence of each token and the ``cu_seqlens`` check.

    A sequence ends at its last model token (``mask_mode="skip"``) or its last token (``"zero"``:
    the scan runs through masked tokens, so the flags' ``mask`` only leaves out tokens of no
    sequence). Vectorised: one ``searchsorted``, a ``scatter_reduce`` (amax) and gathers."""
    total = _packed_rewards(rewards).shape[-1]
    cu, bad = _cu_seqlens(cu_seqlens, total, rewards.device, check)
    S = cu.numel() - 1
    m = response_mask.reshape(-1) if isinstance(response_mask, torch.Tensor) else response_mask
    m = fields_from_verl(rewards.reshape(-1), rewards.reshape(-1), m)["mask"]
    seg = _segment_of(cu, total)
    in_seq = seg < S  # tokens past cu_seqlens[-1] belong to no sequence
    m = m & in_seq
    scan = m if mask_mode == "skip" else in_seq
    is_end = _sequence_ends(scan, seg, S)
    tr_tok, boot_tok = _packed_truncation(truncated, bootstrap_values, is_end, seg, S)
    shape = rewards.shape
    flags = dict(mask=scan.reshape(shape), terminated=(is_end if tr_tok is None else is_end & ~tr_tok).reshape(shape))
    if tr_tok is not None:
        flags.update(truncated=tr_tok.reshape(shape), bootstrap_values=boot_tok.reshape(shape))
    return flags, m.reshape(shape), seg.reshape(shape), bad


def _packed_lay(flags, m, seg):
    """:func:`_coef_scan`'s ``lay`` for a packed row (from :func:`_packed_layout`'s flags): past a sequence's end,
    its bootstrap value if truncated, else 0."""
    tr = flags.get("truncated")
    return m, flags["mask"], seg, None if tr is None else _zero_masked(flags["bootstrap_values"], tr)


def _poisoned(x, bad):
    """``x`` with every element NaN where ``bad`` (a 0-d bool tensor: cu_seqlens broke the convention)."""
    return x if bad is None else torch.where(bad, torch.full((), float("nan"), dtype=x.dtype, device=x.device), x)


def packed_gae(token_level_rewards, values, response_mask, cu_seqlens, gamma, lam, truncated=None,
               bootstrap_values=None, *, lam_returns=None, whiten: bool = False, mask_mode: str = "skip",
               fill_masked: str = "zero", out_dtype=None, check: bool = True, backend: str = "auto"):
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
    ``fill_masked="carry"`` carries within a sequence only. ``mask_mode="zero"`` (OpenRLHF's
    recursion, as in :func:`compute_gae_advantage_return`): each sequence runs through its masked
    tokens and ends at its last token. ``check=True`` checks ``cu_seqlens``
    on the device: cu_seqlens that do not start at 0, decrease or end past ``total`` make every
    output NaN (no device sync; under :class:`rollbuf.check_finite` a ``ValueError`` naming
    cu_seqlens instead); ``check=False`` skips the check.

    ``gamma``, ``lam``, ``lam_returns``: as in :func:`compute_gae_advantage_return`, per sequence
    (``[num_seqs]`` tensors) instead of per row.

    Returns ``GAEResult(advantages, returns)`` in the input's shape.
    """
    _modes(mask_mode, fill_masked)
    flags, m, seg, bad = _packed_layout(token_level_rewards, response_mask, cu_seqlens, truncated,
                                        bootstrap_values, check, mask_mode)
    _float_tensor("values", values)
    if tuple(values.shape) != tuple(token_level_rewards.shape):
        raise ValueError(f"values must have shape {tuple(token_level_rewards.shape)}, got {tuple(values.shape)}")
    S, dev = (cu_seqlens.shape[0] - 1,), m.device
    gamma, lam = _hyper("gamma", gamma, S, dev), _hyper("lam", lam, S, dev)
    if lam_returns is not None or _per_row(gamma, lam):
        coefs = dict(gamma=gamma, lam=lam, lam_returns=lam if lam_returns is None else
                     _hyper("lam_returns", lam_returns, S, dev))
        adv, ret = _coef_scan(token_level_rewards, values, _packed_lay(flags, m, seg), coefs, fill_masked,
                              out_dtype, backend)
        adv = _whitened(adv, m, fill_masked) if whiten else adv
        return GAEResult(_poisoned(adv, bad), _poisoned(ret, bad))
    r, v, zeroed = token_level_rewards, values, mask_mode == "zero"
    if zeroed:
        r, v = _zero_masked(r, m), _zero_masked(v, m)
    res = F.gae(gamma, lam, rewards=r, values=v, window_end="terminal", out_dtype=out_dtype, backend=backend,
                **flags)
    adv, ret = _finish_gae(res, values, m, fill_masked, whiten, segment=seg, zeroed=zeroed)
    return GAEResult(_poisoned(adv, bad), _poisoned(ret, bad))


def packed_discounted_returns(token_level_rewards, response_mask, cu_seqlens, gamma, truncated=None,
                              bootstrap_values=None, *, mask_mode: str = "skip", fill_masked: str = "zero",
                              out_dtype=None, check: bool = True, backend: str = "auto"):
    """:func:`discounted_returns` on packed sequences (``cu_seqlens`` as in :func:`packed_gae`;
    ``mask_mode``, ``fill_masked`` as in :func:`discounted_returns`, within each sequence; ``gamma`` a number or
    ``[num_seqs]``)."""
    _modes(mask_mode, fill_masked)
    flags, m, seg, bad = _packed_layout(token_level_rewards, response_mask, cu_seqlens, truncated,
                                        bootstrap_values, check, mask_mode)
    gamma = _hyper("gamma", gamma, (cu_seqlens.shape[0] - 1,), m.device)
    if _per_row(gamma):
        g = _coef_scan(token_level_rewards, None, _packed_lay(flags, m, seg), dict(gamma=gamma, lam=1.0),
                       fill_masked, out_dtype, backend)[0]
        return _poisoned(g, bad)
    zeroed = mask_mode == "zero"
    g = F.discounted_returns(gamma, rewards=_zero_masked(token_level_rewards, m) if zeroed else token_level_rewards,
                             bootstrap=True, window_end="terminal", out_dtype=out_dtype, backend=backend, **flags)
    return _poisoned(_fill_returns(g, m, fill_masked, zeroed, seg), bad)


def _packed_turns(token_level_rewards, response_mask, cu_seqlens, turn_ids, check):
    """:func:`_turns` of a packed row (turns end at sequence boundaries; tokens past ``cu_seqlens[-1]`` form a
    sequence of their own) and :func:`_cu_seqlens`'s check."""
    total = _packed_rewards(token_level_rewards).shape[-1]
    cu, bad = _cu_seqlens(cu_seqlens, total, token_level_rewards.device, check)
    if not isinstance(response_mask, torch.Tensor) or response_mask.shape != token_level_rewards.shape:
        raise ValueError(f"response_mask must be a flag tensor of token_level_rewards' shape "
                         f"{tuple(token_level_rewards.shape)}")
    seg = _segment_of(cu, total)
    return (*_turns(response_mask, turn_ids, seg.reshape(response_mask.shape)), bad)


def packed_turn_returns(token_level_rewards, response_mask, cu_seqlens, gamma, *, turn_ids=None, out_dtype=None,
                        check: bool = True, backend: str = "auto"):
    """:func:`turn_returns` on packed sequences (``cu_seqlens`` and ``check`` as in :func:`packed_gae`; a turn
    never spans two sequences; ``gamma`` a number or ``[num_seqs]``): each sequence gives what it gives as
    its own padded row."""
    on, _, end, bad = _packed_turns(token_level_rewards, response_mask, cu_seqlens, turn_ids, check)
    g = packed_discounted_returns(token_level_rewards, end, cu_seqlens, gamma, fill_masked="carry",
                                  out_dtype=out_dtype, check=False, backend=backend)
    return _poisoned(_zero_masked(g, on), bad)


def packed_turn_gae(token_level_rewards, values, response_mask, cu_seqlens, gamma, lam, truncated=None,
                    bootstrap_values=None, *, lam_returns=None, turn_ids=None, value_at="first", out_dtype=None,
                    check: bool = True, backend: str = "auto"):
    """:func:`turn_gae` on packed sequences (``cu_seqlens``, ``truncated``, ``bootstrap_values`` and ``check``
    as in :func:`packed_gae`; a turn never spans two sequences; ``gamma``, ``lam``, ``lam_returns``
    numbers or ``[num_seqs]``): each sequence gives what it gives as its own padded row."""
    on, start, end, bad = _packed_turns(token_level_rewards, response_mask, cu_seqlens, turn_ids, check)
    v = _turn_values(values, on, start, value_at)
    adv, ret = packed_gae(token_level_rewards, v, end, cu_seqlens, gamma, lam, truncated, bootstrap_values,
                          lam_returns=lam_returns, fill_masked="carry", out_dtype=out_dtype, check=False,
                          backend=backend)
    adv, ret = _turn_outputs(adv, ret, on, end, value_at)
    return GAEResult(_poisoned(adv, bad), _poisoned(ret, bad))


def length_adaptive_lam(response_mask, alpha, *, turns: bool = False, turn_ids=None, cu_seqlens=None):
    r"""VAPO's length-adaptive λ for the actor's GAE: ``λ_i = 1 − 1/(α·ℓ_i)``, clamped to [0, 1], ``ℓ_i`` the
    number of model tokens of row ``i`` (``response_mask`` ``[*B, T]`` → ``[*B]``), or its number of turns
    (``turns=True``, as :func:`turn_gae` counts them: runs of model tokens, or ``turn_ids``); with
    ``cu_seqlens``, per packed sequence (``response_mask`` ``[1, total]`` or ``[total]`` → ``[num_seqs]``).
    ``alpha > 0`` (VAPO: 0.05); a row of at most ``1/α`` model tokens (none included) gets ``λ = 0``.
    float32, on ``response_mask``'s device, no host read: pass it as ``lam`` (docs/llm.md, section 13)."""
    alpha = positive("alpha", alpha)
    validation.check_bool("turns", turns)
    if not isinstance(response_mask, torch.Tensor) or response_mask.dim() < 1:
        raise ValueError("response_mask must be a [*B, T] flag tensor (bool, integer or 0/1 float)")
    on = as_flags(response_mask, "response_mask")
    seg, total = None, on.shape[-1]
    if cu_seqlens is not None:
        if on.dim() > 2 or (on.dim() == 2 and on.shape[0] != 1):
            raise ValueError(f"response_mask of packed sequences must be [1, total] or [total], got {tuple(on.shape)}")
        cu, _ = _cu_seqlens(cu_seqlens, total, on.device, False)
        seg = _segment_of(cu, total).reshape(on.shape)
    if turns:
        on = _turns(response_mask, turn_ids, seg)[1]  # each turn's first model token
    elif turn_ids is not None:
        raise ValueError("turn_ids is read with turns=True only (the lengths are then counted in turns)")
    on = on.to(torch.float32)
    n = on.sum(-1) if seg is None else on.new_zeros(cu.shape[0]).index_add_(0, seg.reshape(-1), on.reshape(-1))[:-1]
    return (1.0 - 1.0 / (alpha * n)).clamp(0.0, 1.0)

