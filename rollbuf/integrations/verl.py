"""verl 0.9.1's advantage estimators (``verl.trainer.ppo.core_algos``) under verl's names, signatures,
defaults and ``config`` reads, as thin layers over :mod:`rollbuf.groups` and
:mod:`rollbuf.integrations.llm` (no loop over rows, groups or tokens). ``index``: verl's ``uid``
array (strings or ints) or an integer tensor. :func:`register` adds them to verl's registry.
Semantics and the few differences from verl: docs/llm.md, "verl's estimators".
"""

from __future__ import annotations

import numpy as np
import torch

from rollbuf import groups
from rollbuf.integrations import llm


def _same_shape(rewards, mask):
    """verl broadcasts ``response_mask`` against ``token_level_rewards``; rollbuf requires their shape."""
    if not isinstance(mask, torch.Tensor) or not isinstance(rewards, torch.Tensor) or mask.shape != rewards.shape:
        raise ValueError(f"response_mask must have token_level_rewards' shape {tuple(getattr(rewards, 'shape', ()))}"
                         f" (not broadcast), got {tuple(getattr(mask, 'shape', ())) or type(mask).__name__}")


def _outcome(rewards, mask, index, estimator, dtype=None, **kw):
    """:func:`rollbuf.groups.outcome_advantages` → ``(advantages, advantages)`` ``[B, L]``, 0 at masked tokens
    (the response lengths, a read of the mask, only for an estimator that reads them)."""
    _same_shape(rewards, mask)
    lengths = mask.sum(-1, dtype=torch.float32) if estimator in groups.READS_LENGTHS else None
    a = groups.outcome_advantages(groups.sequence_scores(rewards), index, lengths, estimator, **kw)
    return (a := groups.to_tokens(a.to(dtype or rewards.dtype), mask)), a


def _f32(r):  # verl's vectorized forms return float32 for 16-bit rewards
    return torch.promote_types(r.dtype, torch.float32)


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    """verl's GAE: :func:`rollbuf.integrations.llm.compute_gae_advantage_return`, whitened, verl's values."""
    _same_shape(token_level_rewards, response_mask)
    return llm.compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, whiten=True,
                                            fill_masked="carry")


def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=True, config=None):
    """verl's GRPO; ``norm_adv_by_std_in_grpo=False`` is Dr.GRPO."""
    return _outcome(token_level_rewards, response_mask, index, "grpo", epsilon=epsilon,
                    norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)


def compute_grpo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                              norm_adv_by_std_in_grpo=True, config=None):
    """verl's vectorized GRPO."""
    return _outcome(token_level_rewards, response_mask, index, "grpo", _f32(token_level_rewards), epsilon=epsilon,
                    norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)


def compute_gdpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                   norm_adv_by_std_in_grpo=True, config=None, non_tensor_batch=None, batch=None,
                                   **kwargs):
    """verl's GDPO (reward components: ``config.gdpo_reward_keys`` of ``non_tensor_batch``)."""
    if config is None or non_tensor_batch is None or batch is None:
        return _outcome(token_level_rewards, response_mask, index, "gdpo", epsilon=epsilon,
                        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    _same_shape(token_level_rewards, response_mask)
    keys, weights = config.get("gdpo_reward_keys", None), config.get("gdpo_reward_weights", None)
    if not keys or any(k not in non_tensor_batch for k in keys):
        raise ValueError(f"config.gdpo_reward_keys ({keys}) must name keys of non_tensor_batch")
    dev = response_mask.device
    if not isinstance(index, torch.Tensor):  # the uids ranked once: each key's call then groups the int ranks
        index = groups.group_ids(index)[0].numpy()
    a = sum((1.0 if weights is None else float(weights[k])) * groups.outcome_advantages(
        torch.as_tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=dev), index, None,
        epsilon=epsilon, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo) for k, key in enumerate(keys))
    return (a := groups.to_tokens(groups.masked_whiten(a, response_mask).to(torch.float32), response_mask)), a


def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                         norm_adv_by_std_in_grpo=True, config=None, **kwargs):
    """verl's pass@k GRPO (``config.norm_adv_by_std_in_grpo`` decides, not the argument, as in verl)."""
    if config is None:
        raise ValueError("config is required: pass@k reads config.norm_adv_by_std_in_grpo")
    return _outcome(token_level_rewards, response_mask, index, "grpo_passk", epsilon=epsilon,
                    norm_adv_by_std_in_grpo=config.get("norm_adv_by_std_in_grpo", True))


def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                                           config=None, **kwargs):
    """verl's REINFORCE++-baseline."""
    return _outcome(token_level_rewards, response_mask, index, "reinforce_plus_plus_baseline")


def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    """verl's RLOO (a group of one keeps its score)."""
    return _outcome(token_level_rewards, response_mask, index, "rloo")


def compute_rloo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None,
                                              **kwargs):
    """verl's vectorized RLOO (a group of one gets 0)."""
    return _outcome(token_level_rewards, response_mask, index, "rloo_vectorized", _f32(token_level_rewards))


def compute_opo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    """verl's OPO (the baseline weighted by response length)."""
    return _outcome(token_level_rewards, response_mask, index, "opo")


def compute_gpg_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, f_norm=1.0, alpha=1.0,
                                  config=None, **kwargs):
    """verl's GPG (``alpha`` is recomputed from the scores, as in verl)."""
    return _outcome(token_level_rewards, response_mask, index, "gpg", f_norm=f_norm)


def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, config=None, **kwargs):
    """verl's REINFORCE++ (``config.gamma``)."""
    if config is None:
        raise ValueError("config is required: REINFORCE++ reads config.gamma")
    _same_shape(token_level_rewards, response_mask)
    returns = llm.discounted_returns(token_level_rewards, response_mask, config.gamma)
    return groups.masked_whiten(returns, response_mask) * response_mask, returns


def compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask, config=None, **kwargs):
    """verl's ReMax."""
    _same_shape(token_level_rewards, response_mask)
    returns = llm.discounted_returns(token_level_rewards, response_mask, 1.0, fill_masked="carry")
    returns = returns.to(torch.promote_types(returns.dtype, response_mask.dtype))
    return returns - reward_baselines.unsqueeze(-1) * response_mask, returns


def _otb_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights,
                with_weights=True):
    """The reward-to-go ``G`` (verl's, in its dtype) and ``W`` ``[B, L]`` (``with_weights``, else None),
    the inputs checked."""
    _same_shape(token_level_rewards, response_mask)
    if old_log_probs is None or sum_pi_squared is None:
        raise ValueError("old_log_probs and sum_pi_squared are required by the optimal token baseline: verl 0.9.1's "
                         "trainer passes them to its own names only (register(replace=True), docs/llm.md)")
    for name, x in (("old_log_probs", old_log_probs), ("sum_pi_squared", sum_pi_squared),
                    ("rollout_is_weights", rollout_is_weights)):
        if x is not None and (not isinstance(x, torch.Tensor) or x.shape != token_level_rewards.shape):
            raise ValueError(f"{name} must have token_level_rewards' shape {tuple(token_level_rewards.shape)}, "
                             f"got {tuple(getattr(x, 'shape', ())) or type(x).__name__}")
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    if not with_weights:
        return returns, None
    return returns, groups.path_weights(old_log_probs, sum_pi_squared, rollout_is_weights, response_mask)


def compute_optimal_token_baseline_advantage(token_level_rewards, response_mask, index, old_log_probs=None,
                                             sum_pi_squared=None, rollout_is_weights=None, handle_zero_tail=True,
                                             epsilon=1e-8, **kwargs):
    """verl's optimal token baseline (OTB): ``A_t = G_t − B_t``, ``B_t = Σ_group G_t·W_t / Σ_group W_t``
    at each token position (:func:`rollbuf.groups.token_baseline`); returns ``(advantages, returns)``."""
    with torch.no_grad():
        G, _ = _otb_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights,
                           with_weights=False)
        weights = (old_log_probs, sum_pi_squared, rollout_is_weights)
        adv = groups.optimal_token_baseline(G, response_mask, index, weights, epsilon=epsilon,
                                            zero_tail=handle_zero_tail, backend=kwargs.get("backend", "auto"))
        return adv, G


def compute_multi_turn_optimal_token_baseline_advantage(token_level_rewards, response_mask, index, old_log_probs=None,
                                                        sum_pi_squared=None, rollout_is_weights=None,
                                                        handle_zero_tail=True, epsilon=1e-8, **kwargs):
    """verl's multi-turn optimal token baseline (TIR-OTB): OTB over each row's response tokens packed to
    the row's front (the k-th response token of every row of a group at one position), scattered back;
    rows without a response token are in no group. Returns ``(advantages, returns)``."""
    with torch.no_grad():
        G, W = _otb_inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights)
        on = response_mask.bool()
        lengths = on.sum(dim=-1)
        B, L = on.shape
        at = torch.where(on, on.cumsum(dim=-1) - 1, L)  # each response token's packed position; L: a spare column
        packed_g = G.new_zeros(B, L + 1).scatter_(1, at, torch.where(on, G, 0))[:, :L]
        packed_w = W.new_zeros(B, L + 1).scatter_(1, at, torch.where(on, W, 0))[:, :L]
        b = groups.token_baseline(packed_g, packed_w, index, lengths, epsilon=epsilon, zero_tail=handle_zero_tail,
                                  member=lengths > 0)
        adv = (packed_g - b).gather(1, at.clamp(max=L - 1)) if L else packed_g
        return torch.where(on, adv, 0) * response_mask, G


def _registered(fn):
    """``fn`` with verl's signature, taking (and ignoring) the other inputs verl's trainer may give a
    registered estimator. ``config`` is not read, as verl's own GRPO functions do not read it: verl's
    trainer passes ``algorithm.norm_adv_by_std_in_grpo`` as the argument to its ``"grpo"`` name only,
    and gives any registered name (``"grpo_vectorized"``, ``"rollbuf_grpo"``) ``config`` alone."""
    def estimator(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True,
                  config=None, **kwargs):
        return fn(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config)
    estimator.__name__, estimator.__doc__ = fn.__name__, fn.__doc__
    return estimator


#: What :func:`register` adds, by verl's name. Left out: GAE, ReMax and GDPO, whose inputs (values and
#: a critic, baseline rollouts, reward components) verl's trainer gives to its own names only.
ESTIMATORS = {"grpo": _registered(compute_grpo_outcome_advantage),
              "grpo_vectorized": _registered(compute_grpo_vectorized_outcome_advantage),
              "grpo_passk": compute_grpo_passk_outcome_advantage,
              "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage,
              "rloo": compute_rloo_outcome_advantage, "rloo_vectorized": compute_rloo_vectorized_outcome_advantage,
              "opo": compute_opo_outcome_advantage, "gpg": compute_gpg_outcome_advantage,
              "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage,
              "optimal_token_baseline": compute_optimal_token_baseline_advantage,
              "tir_optimal_token_baseline": compute_multi_turn_optimal_token_baseline_advantage}
#: The estimators verl 0.9.1's trainer gives inputs of their own (``old_log_probs``, ``sum_pi_squared``,
#: ``rollout_is_weights``) under verl's names only: ``register(replace=True)`` puts rollbuf's there.
OWN_INPUTS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def register(prefix: str = "rollbuf_", *, replace: bool = False) -> list[str]:
    """Add :data:`ESTIMATORS` to verl's ``ADV_ESTIMATOR_REGISTRY`` as ``prefix + name`` (so that
    ``algorithm.adv_estimator=rollbuf_grpo`` selects one); returns the names. ``replace=True`` also puts
    rollbuf's estimators of :data:`OWN_INPUTS` under verl's own names, the only names verl's trainer
    hands their inputs to (``algorithm.adv_estimator=optimal_token_baseline`` then runs rollbuf's)."""
    from verl.trainer.ppo import core_algos

    names = []
    for name, fn in ESTIMATORS.items():
        core_algos.register_adv_est(prefix + name)(fn)
        names.append(prefix + name)
    if replace:
        for name in OWN_INPUTS:  # verl's register_adv_est refuses a name it has: the registry entry itself
            core_algos.ADV_ESTIMATOR_REGISTRY[name] = ESTIMATORS[name]
            names.append(name)
    return names


__all__ = [name for name in list(globals()) if name.startswith("compute_")] + ["register"]
