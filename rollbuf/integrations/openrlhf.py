"""OpenRLHF 0.11.2's advantage computation (``RemoteExperienceMaker`` in
``openrlhf/trainer/ppo_utils/experience_maker.py``) under its names and signatures: GAE and the
REINFORCE returns are one :mod:`rollbuf.integrations.llm` call each (``mask_mode="zero"``, OpenRLHF's
recursion) instead of a loop over token positions, the group baselines one pass of
:func:`rollbuf.groups.group_stats`. :func:`patch` puts them on OpenRLHF's class (``unpatch`` takes
them off). Conventions and differences: docs/howto/openrlhf.md.
"""

from __future__ import annotations

import itertools

import torch

from rollbuf import groups
from rollbuf.integrations import llm

__all__ = ["get_advantages_and_returns", "get_cumulative_returns", "compute_advantages_and_returns",
           "shape_rewards", "whiten_advantages", "patch", "unpatch", "ESTIMATORS"]

#: The values of OpenRLHF's ``--algo.advantage.estimator``.
ESTIMATORS = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce")
_GROUPED = ("rloo", "reinforce_baseline", "group_norm", "dr_grpo")  # a baseline from the prompt's group
_WHITENED = ("gae", "reinforce", "reinforce_baseline")  # whitened over the batch's action tokens
_METHODS = ("get_advantages_and_returns", "get_cumulative_returns", "compute_advantages_and_returns")
_saved: dict = {}  # patched class -> its own methods


def _mask(action_mask, rewards):
    return torch.ones_like(rewards, dtype=torch.bool) if action_mask is None else action_mask


@torch.no_grad()
def get_advantages_and_returns(self, values, rewards, action_mask, gamma, lambd):
    """OpenRLHF's GAE ``(advantages, returns)`` ``[B, A]``: masked rewards and values count as 0 and
    the recursion runs through them, the row's last position is terminal (``mask_mode="zero"``,
    OpenRLHF's outputs at masked tokens too); one scan. ``self`` is not read."""
    m = _mask(action_mask, rewards)
    return llm.compute_gae_advantage_return(rewards, values, m, gamma, lambd, mask_mode="zero", fill_masked="keep")


@torch.no_grad()
def get_cumulative_returns(self, rewards, action_mask, gamma):
    """OpenRLHF's REINFORCE returns ``G_t = m_t·r_t + γ·G_{t+1}`` ``[B, A]`` (0 after the last
    position) in the rewards' dtype; one scan. ``self`` is not read."""
    g = llm.discounted_returns(rewards, _mask(action_mask, rewards), gamma, mask_mode="zero", fill_masked="keep")
    return g.to(rewards.dtype)


def shape_rewards(rewards, indices, n_samples_per_prompt, estimator):
    """OpenRLHF's baseline step: ``rewards`` ``[N]`` (float, in the experiences' order), ``indices``
    ``[N]`` (each sample's position in the rollout: a permutation of ``0..N-1``; the prompt's group is
    ``index // n_samples_per_prompt``) → ``(shaped rewards [N], group std [N] or None when
    n_samples_per_prompt is 1)``. rloo: ``r − mean of the group's others``; reinforce_baseline and
    dr_grpo: ``r − group mean``; group_norm: ``(r − mean) / (std + 1e-9)``; flash_reinforce:
    ``r − batch mean``; gae and reinforce: unchanged. Equal rewards give exactly 0 (and std 0)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"args.algo.advantage.estimator must be one of {ESTIMATORS}, got {estimator!r}")
    n, N = n_samples_per_prompt, rewards.numel()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or N % n:
        raise ValueError(f"n_samples_per_prompt must be a positive int dividing the {N} samples, got {n!r}")
    if n == 1 and estimator in _GROUPED:
        raise ValueError(f"{estimator} requires n_samples_per_prompt > 1 (a group of one has no baseline)")
    indices = torch.as_tensor(indices).to(rewards.device)
    if indices.shape != (N,) or not torch.equal(indices.sort().values, torch.arange(N, device=rewards.device)):
        raise ValueError(f"indices (the experiences' index lists) must be a permutation of 0..{N - 1}")
    ids, num = groups.group_ids(indices // n)
    s = groups.group_stats(rewards, ids, num)
    if estimator == "flash_reinforce":
        shaped = rewards - groups.group_stats(rewards, torch.zeros_like(ids), 1).mean
    elif estimator in _GROUPED:
        base = s.loo_mean if estimator == "rloo" else s.mean
        shaped = (rewards - base) / (s.std + 1e-9) if estimator == "group_norm" else rewards - base
    else:
        shaped = rewards
    return shaped.to(rewards.dtype), (s.std.to(rewards.dtype) if n > 1 else None)


def whiten_advantages(experiences, no_std_norm=False):
    """OpenRLHF's batch whitening, in place: ``(A − mean)·rsqrt(max(var, 1e-8))`` with the mean and the
    plain (not Bessel-corrected) variance over the action tokens of all ``experiences`` (``no_std_norm``:
    the mean only). A NaN at a masked token does not reach the statistics."""
    adv = torch.cat([e.advantages.flatten() for e in experiences]).float()
    m = torch.cat([e.action_mask.flatten() for e in experiences]).bool()
    n = m.sum()
    mean = torch.where(m, adv, 0).sum() / n
    rstd = 1 if no_std_norm else (torch.where(m, adv - mean, 0).square().sum() / n).clamp(min=1e-8).rsqrt()
    for e in experiences:
        e.advantages = (e.advantages - mean) * rstd


def _openrlhf():
    from openrlhf.trainer.ppo_utils import experience_maker

    return experience_maker


@torch.no_grad()
def compute_advantages_and_returns(self, experiences):
    """``RemoteExperienceMaker.compute_advantages_and_returns`` with rollbuf's baselines
    (:func:`shape_rewards`), scans (through ``self``'s two methods) and whitening
    (:func:`whiten_advantages`); OpenRLHF's own length penalties, KL reward shaping and logging."""
    em, args = _openrlhf(), self.strategy.args
    adv_args = args.algo.advantage
    for e in experiences:  # at least float32 for the penalties and the group statistics
        e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
    em.apply_length_penalties(experiences, args)
    sizes = [len(e.index) for e in experiences]
    indices = torch.tensor(list(itertools.chain.from_iterable(e.index for e in experiences)))
    rewards, std = shape_rewards(torch.cat([e.rewards for e in experiences]), indices,
                                 args.rollout.n_samples_per_prompt, adv_args.estimator)
    if std is not None:
        for e, s in zip(experiences, std.split(sizes), strict=True):
            e.info["group_reward_std"] = s
    for e, shaped in zip(experiences, rewards.split(sizes), strict=True):
        reward = em.compute_reward(shaped, self.kl_ctl.value, e.kl, action_mask=e.action_mask,
                                   reward_clip_range=args.reward.clip_range)
        if self.advantage_estimator == "gae":
            e.advantages, e.returns = self.get_advantages_and_returns(e.values, reward, e.action_mask,
                                                                      adv_args.gamma, adv_args.lambd)
        elif self.advantage_estimator in ESTIMATORS:
            if adv_args.gamma != 1.0 and self.advantage_estimator != "reinforce":
                em.logger.warning(f"gamma is set to 1.0 for {self.advantage_estimator}")
                adv_args.gamma = 1.0
            e.returns = self.get_cumulative_returns(reward, e.action_mask, adv_args.gamma)
            e.advantages = e.returns.clone()
        else:
            raise ValueError(f"advantage_estimator must be one of {ESTIMATORS}, got {self.advantage_estimator!r}")
        e.info["return"] = reward.sum(dim=-1)
        e.kl = None
    if adv_args.estimator in _WHITENED:
        whiten_advantages(experiences, adv_args.no_std_norm)
    return experiences


def patch(cls=None):
    """Put this module's three methods on OpenRLHF's ``RemoteExperienceMaker`` (or ``cls``); returns the
    class. Run it in the process that makes the experiences (OpenRLHF's ``PPOTrainer`` Ray actor:
    Ray's ``worker_process_setup_hook`` runs it there, docs/howto/openrlhf.md). Patching twice keeps
    the first originals; :func:`unpatch` restores them."""
    if cls is None:
        cls = _openrlhf().RemoteExperienceMaker
    _saved.setdefault(cls, {name: vars(cls).get(name) for name in _METHODS})  # None: inherited
    for name in _METHODS:
        setattr(cls, name, globals()[name])
    return cls


def unpatch(cls=None):
    """Give ``cls`` (default OpenRLHF's ``RemoteExperienceMaker``) its own methods back; a class that
    was not patched is left as it is."""
    if cls is None:
        cls = _openrlhf().RemoteExperienceMaker
    for name, fn in _saved.pop(cls, {}).items():
        if fn is None:
            delattr(cls, name)
        else:
            setattr(cls, name, fn)
