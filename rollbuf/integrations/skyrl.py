"""SkyRL's advantage estimators (``skyrl/backends/skyrl_train/utils/ppo_utils.py``) with the signature its
trainer calls a registered estimator with (keywords ``token_level_rewards``, ``response_mask``,
``index``, ``values``, ``gamma``, ``lambd``, ``grpo_norm_by_std``, ``config``, ...), each one scan
or one pass of group statistics instead of SkyRL's loops over token positions and samples.
:func:`register` adds them to SkyRL's registry (``register_advantage_estimator``) as ``rollbuf_gae``,
``rollbuf_grpo``, ... docs/howto/slime_skyrl.md.
"""

from __future__ import annotations

import torch

from rollbuf import functional as F
from rollbuf import groups
from rollbuf.integrations import llm

__all__ = ["compute_gae_advantage_return", "compute_grpo_outcome_advantage", "compute_rloo_outcome_advantage",
           "compute_reinforce_plus_plus_outcome_advantage", "compute_maxrl_advantage", "ESTIMATORS", "register"]


def _check_mask(response_mask, x):
    if not isinstance(response_mask, torch.Tensor) or response_mask.shape != x.shape:
        raise ValueError(f"response_mask must have token_level_rewards' shape {tuple(x.shape)}, "
                         f"got {tuple(getattr(response_mask, 'shape', ())) or type(response_mask).__name__}")


def _whiten(x, response_mask):
    """SkyRL's ``masked_whiten`` (mean and Bessel-corrected variance over the masked-in tokens, every
    token whitened); as SkyRL, fewer than two masked-in tokens are a ``ValueError`` (a host read)."""
    _check_mask(response_mask, x)
    if int(torch.count_nonzero(response_mask)) < 2:
        raise ValueError("response_mask must hold at least two tokens: the whitening's variance is Bessel-corrected")
    return llm.masked_whiten(x, response_mask)


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lambd, **kwargs):
    """SkyRL's GAE: the recursion over every position (the mask is not read there), the last position
    terminal; ``returns = advantages + values``; the advantages whitened over ``response_mask``."""
    with torch.no_grad():
        every = torch.ones_like(token_level_rewards, dtype=torch.bool)
        adv, ret = llm.compute_gae_advantage_return(token_level_rewards, values, every, gamma, lambd)
        return _whiten(adv, response_mask), ret


def _outcome(token_level_rewards, response_mask, index, estimator, **kw):
    a = groups.outcome_advantages(groups.sequence_scores(token_level_rewards), index, None, estimator, **kw)
    return (a := groups.to_tokens(a.to(token_level_rewards.dtype), response_mask)), a


def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, grpo_norm_by_std=True,
                                   **kwargs):
    """SkyRL's GRPO: ``(score − group mean) / (group std + epsilon)`` (``grpo_norm_by_std=False``: not
    divided), a group of one has mean 0 and std 1; broadcast over ``response_mask``."""
    return _outcome(token_level_rewards, response_mask, index, "grpo", epsilon=epsilon,
                    norm_adv_by_std_in_grpo=grpo_norm_by_std)


def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, **kwargs):
    """SkyRL's RLOO: ``score − mean of the group's others`` (SkyRL's ``(score − mean)·n/(n−1)``), 0 for a
    group of one."""
    return _outcome(token_level_rewards, response_mask, index, "rloo_vectorized")


def compute_maxrl_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, **kwargs):
    """SkyRL's MaxRL: ``(score − group mean) / (group mean + epsilon)``; a group of one keeps its score."""
    x = groups.sequence_scores(token_level_rewards)
    s = groups.group_stats(x, *groups.group_ids(index, x.device))
    a = torch.where(s.size > 1, (x - s.mean) / (s.mean + groups.outcome_epsilon(epsilon)), x)
    return (a := groups.to_tokens(a.to(token_level_rewards.dtype), response_mask)), a


def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma, **kwargs):
    """SkyRL's REINFORCE++: ``G_t = r_t + γ·m_{t+1}·G_{t+1}`` over every position (the return restarts
    before each masked token, as SkyRL's ``running_return *= response_mask[:, t]``), the advantages
    ``G`` whitened over ``response_mask`` and 0 at masked tokens."""
    with torch.no_grad():
        _check_mask(response_mask, token_level_rewards)
        stop = ~torch.nn.functional.pad(response_mask[..., 1:] != 0, (0, 1))  # the next position is masked
        returns = F.discounted_returns(gamma, rewards=token_level_rewards, terminated=stop, window_end="terminal")
        return _whiten(returns, response_mask) * response_mask, returns


#: SkyRL's estimator names and rollbuf's function for each: what :func:`register` adds.
ESTIMATORS = {"gae": compute_gae_advantage_return, "grpo": compute_grpo_outcome_advantage,
              "rloo": compute_rloo_outcome_advantage, "reinforce++": compute_reinforce_plus_plus_outcome_advantage,
              "maxrl": compute_maxrl_advantage}


def register(prefix: str = "rollbuf_") -> list[str]:
    """Register :data:`ESTIMATORS` with SkyRL's ``register_advantage_estimator`` as ``prefix + name``
    (``trainer.algorithm.advantage_estimator=rollbuf_grpo`` then selects one); returns the names. Run
    it before SkyRL validates the config (``validate_cfg``) and starts Ray; SkyRL refuses a name it
    already has (a ``ValueError``)."""
    from skyrl.backends.skyrl_train.utils.ppo_utils import register_advantage_estimator

    for name, fn in ESTIMATORS.items():
        register_advantage_estimator(prefix + name)(fn)
    return [prefix + name for name in ESTIMATORS]
