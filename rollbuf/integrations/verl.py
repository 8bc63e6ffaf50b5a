"""verl's advantage estimators (``verl.trainer.ppo.core_algos``, verl 0.9.1) under verl's names,
signatures, defaults and ``config`` reads, as thin layers over :mod:`rollbuf.groups` and
:mod:`rollbuf.integrations.llm`: no loop over rows, groups or tokens. Their outputs equal verl's at
every token with ``response_mask = 1`` (to float32 rounding) and hold 0 at the others.
:func:`register` adds them to verl's ``ADV_ESTIMATOR_REGISTRY`` as ``"rollbuf_<verl's name>"``.
``index``: verl's ``uid`` array (strings or ints) or an integer tensor. docs/llm.md, "verl's estimators".
"""

from __future__ import annotations

import numpy as np
import torch

from rollbuf import groups
from rollbuf.integrations import llm

__all__ = ["compute_gae_advantage_return", "compute_grpo_outcome_advantage", "compute_grpo_vectorized_outcome_advantage",
           "compute_gdpo_outcome_advantage", "compute_grpo_passk_outcome_advantage",
           "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_rloo_outcome_advantage",
           "compute_rloo_vectorized_outcome_advantage", "compute_opo_outcome_advantage",
           "compute_reinforce_plus_plus_outcome_advantage", "compute_remax_outcome_advantage",
           "compute_gpg_outcome_advantage", "register"]


def _stats(x, index, weights=None):
    ids, n = groups.group_ids(index, x.device)
    if ids.shape != x.shape:
        raise ValueError(f"index must hold one label per row ({x.numel()}), got {ids.numel()}")
    return groups.group_stats(x, ids, n, weights)


def _out(a, mask, dtype):
    a = groups.to_tokens(a.to(dtype), mask)
    return a, a


def _grpo(x, s, epsilon, norm):
    """verl's GRPO scalar: a group of one has mean 0 and std 1."""
    one = s.count == 1
    a = x - torch.where(one, 0, s.mean)
    return a / (torch.where(one, 1, s.std) + epsilon) if norm else a


def _vectorized(r):
    return torch.promote_types(r.dtype, torch.float32)  # verl's vectorized forms return float32 for 16-bit input


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    """verl's GAE: whitened advantages and ``returns = advantages + values``, verl's values at every
    token (:func:`rollbuf.integrations.llm.compute_gae_advantage_return`, ``whiten=True``, ``"carry"``)."""
    return llm.compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, whiten=True,
                                            fill_masked="carry")


def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=True, config=None):
    """verl's GRPO: ``(score − group mean) / (group std + epsilon)``; ``norm_adv_by_std_in_grpo=False``
    (Dr.GRPO): ``score − group mean``. A group of one: mean 0, std 1. ``config`` is not read."""
    x = groups.sequence_scores(token_level_rewards)
    return _out(_grpo(x, _stats(x, index), epsilon, norm_adv_by_std_in_grpo), response_mask, token_level_rewards.dtype)


def compute_grpo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                              norm_adv_by_std_in_grpo=True, config=None):
    """verl's vectorized GRPO: :func:`compute_grpo_outcome_advantage`, float32 for 16-bit rewards."""
    x = groups.sequence_scores(token_level_rewards)
    return _out(_grpo(x, _stats(x, index), epsilon, norm_adv_by_std_in_grpo), response_mask,
                _vectorized(token_level_rewards))


def compute_gdpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=True, config=None, non_tensor_batch=None, batch=None,
                                   **kwargs):
    """verl's GDPO: the GRPO advantage of each reward component (``config.gdpo_reward_keys`` in
    ``non_tensor_batch``, weighted by ``config.gdpo_reward_weights``), summed and whitened over the
    batch's tokens; without ``config``, ``non_tensor_batch`` or ``batch``: of ``token_level_rewards``."""
    scores, weights = [groups.sequence_scores(token_level_rewards)], None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = config.get("gdpo_reward_keys", None)
        if not keys or any(k not in non_tensor_batch for k in keys):
            raise ValueError(f"GDPO reads config.gdpo_reward_keys ({keys}) from non_tensor_batch "
                             f"(keys: {list(non_tensor_batch)})")
        scores = [torch.as_tensor(np.asarray(non_tensor_batch[k], dtype=np.float32), device=response_mask.device)
                  for k in keys]
        weights = config.get("gdpo_reward_weights", None)
    a = sum((1.0 if weights is None else float(weights[k])) * _grpo(x, _stats(x, index), epsilon,
                                                                      norm_adv_by_std_in_grpo)
            for k, x in enumerate(scores))
    return _out(groups.masked_whiten(a, response_mask), response_mask, _vectorized(token_level_rewards))


def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                         norm_adv_by_std_in_grpo=True, config=None, **kwargs):
    """verl's pass@k GRPO: a group's unique best sample gets ``best − second best`` (divided by
    ``group std + epsilon`` unless ``config.norm_adv_by_std_in_grpo`` is False; the argument is not
    read, as in verl), every other sample 0. ``config`` is required; a NumPy ``index`` with a group
    of one raises (with a tensor ``index``, checked without a host sync, such a group gets 0)."""
    if config is None:
        raise ValueError("config is required: pass@k reads config.norm_adv_by_std_in_grpo")
    if not isinstance(index, torch.Tensor) and np.unique(np.asarray(index).astype(str), return_counts=True)[1].min(
            initial=2) < 2:
        raise ValueError("index: pass@k needs at least 2 samples per group")
    x = groups.sequence_scores(token_level_rewards)
    s = _stats(x, index)
    a = s.top2_gap / (s.std + epsilon) if config.get("norm_adv_by_std_in_grpo", True) else s.top2_gap
    return _out(a, response_mask, token_level_rewards.dtype)


def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                                           config=None, **kwargs):
    """verl's REINFORCE++-baseline: ``score − group mean`` (0 for a group of one's mean), whitened
    over the batch's response tokens (each row's value counted once per token)."""
    x = groups.sequence_scores(token_level_rewards)
    s = _stats(x, index)
    a = groups.masked_whiten(x - torch.where(s.count == 1, 0, s.mean), response_mask)
    return _out(a, response_mask, token_level_rewards.dtype)


def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    """verl's RLOO: ``score − mean of the group's other samples``; a group of one keeps its score."""
    x = groups.sequence_scores(token_level_rewards)
    s = _stats(x, index)
    return _out(torch.where(s.count > 1, x - s.loo_mean, x), response_mask, token_level_rewards.dtype)


def compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None,
                                              **kwargs):
    """verl's vectorized RLOO: as :func:`compute_rloo_outcome_advantage`, but a group of one gets 0
    (as verl's vectorized form); float32 for 16-bit rewards."""
    x = groups.sequence_scores(token_level_rewards)
    return _out(x - _stats(x, index).loo_mean, response_mask, _vectorized(token_level_rewards))


def compute_opo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    """verl's OPO: ``score − Σ len·score / Σ len`` over the group (len: response tokens); a group of
    one has baseline 0; a group whose rows are all masked, the plain mean (verl: NaN)."""
    x = groups.sequence_scores(token_level_rewards)
    s = _stats(x, index, response_mask.sum(-1, dtype=x.dtype))
    return _out(x - torch.where(s.count == 1, 0, s.weighted_mean), response_mask, token_level_rewards.dtype)


def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, f_norm=1.0, alpha=1.0,
                                  config=None, **kwargs):
    """verl's GPG: ``B / max(#nonzero scores, 1) · (score − group mean) / f_norm`` (a group of one:
    mean 0); the ``alpha`` argument is not read, as in verl."""
    x = groups.sequence_scores(token_level_rewards)
    s = _stats(x, index)
    a = x.numel() / torch.count_nonzero(x).clamp(min=1) * (x - torch.where(s.count == 1, 0, s.mean)) / f_norm
    return _out(a, response_mask, token_level_rewards.dtype)


def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, config=None, **kwargs):
    """verl's REINFORCE++: discounted returns (``config.gamma``) carried across masked tokens, whitened
    over the response tokens; returns 0 at masked tokens. Returns ``(advantages, returns)``."""
    if config is None:
        raise ValueError("config is required: REINFORCE++ reads config.gamma")
    returns = llm.discounted_returns(token_level_rewards, response_mask, config.gamma)
    return groups.masked_whiten(returns, response_mask) * response_mask, returns


def compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask, config=None, **kwargs):
    """verl's ReMax: ``returns`` = undiscounted reward-to-go over the response tokens (at a masked
    token: that of the next response token); ``advantages = returns − reward_baselines`` there."""
    returns = llm.discounted_returns(token_level_rewards, response_mask, 1.0, fill_masked="carry")
    returns = returns.to(torch.promote_types(returns.dtype, response_mask.dtype))
    return returns - reward_baselines.unsqueeze(-1) * response_mask, returns


def _reads_config(fn):
    """verl's trainer passes only ``config`` to a registered estimator: read the GRPO flag from it."""
    def estimator(token_level_rewards, response_mask, index, config=None, **kwargs):
        norm = True if config is None else config.get("norm_adv_by_std_in_grpo", True)
        return fn(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=norm, config=config,
                  **{k: v for k, v in kwargs.items() if k in ("non_tensor_batch", "batch")})
    return estimator


ESTIMATORS = {"grpo": _reads_config(compute_grpo_outcome_advantage),
              "grpo_vectorized": _reads_config(compute_grpo_vectorized_outcome_advantage),
              "gdpo": _reads_config(compute_gdpo_outcome_advantage), "grpo_passk": compute_grpo_passk_outcome_advantage,
              "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage,
              "rloo": compute_rloo_outcome_advantage, "rloo_vectorized": compute_rloo_vectorized_outcome_advantage,
              "opo": compute_opo_outcome_advantage, "gpg": compute_gpg_outcome_advantage,
              "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage}


def register(prefix: str = "rollbuf_") -> list[str]:
    """Add :data:`ESTIMATORS` to verl's ``ADV_ESTIMATOR_REGISTRY`` as ``prefix + name`` (e.g.
    ``algorithm.adv_estimator=rollbuf_grpo``); returns the names. GAE and ReMax are left out: verl's
    trainer calls them by their own names only (values, critic, baseline rollouts)."""
    from verl.trainer.ppo import core_algos

    for name, fn in ESTIMATORS.items():
        core_algos.register_adv_est(prefix + name)(fn)
    return [prefix + name for name in ESTIMATORS]
