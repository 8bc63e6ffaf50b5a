"""rollbuf.integrations.skyrl against SkyRL's own code, RESTATED below: SkyRL's ``ppo_utils`` imports Ray,
jaxtyping, loguru and SkyRL's trainer config at the top, so CI does not import it. Copied verbatim from
NovaSky-AI/SkyRL at commit a9564572e (skyrl_train v0.4.0 and 516 commits):

* ``masked_mean`` from ``skyrl/backends/skyrl_train/utils/torch_utils.py``;
* ``masked_var``, ``masked_whiten``, ``register_advantage_estimator``, the five built-in estimators
  (``compute_reinforce_plus_plus_outcome_advantage``, ``compute_rloo_outcome_advantage``,
  ``compute_gae_advantage_return``, ``compute_grpo_outcome_advantage``, ``compute_maxrl_advantage``)
  and ``compute_advantages_and_returns`` (the trainer's call of a registered estimator) from
  ``skyrl/backends/skyrl_train/utils/ppo_utils.py``.

``test_restatements_are_verbatim`` compares each with the shipped source (its AST) where
``ROLLBUF_ORACLE_SOURCES`` names a folder holding SkyRL's source tree (a checkout); skipped without it.
Stand-ins: the registry (``AdvantageEstimatorRegistry``: a dict, no Ray actor), the names of
``AdvantageEstimator`` and loguru's logger. ``rollbuf.integrations.skyrl.register()`` runs its real
import of the stand-in ``ppo_utils`` module and registers through the restated decorator; each
rollbuf estimator is then called the way SkyRL's trainer calls one, against SkyRL's, on random batches
(right padding, masked spans inside rows, an all-masked row, groups of one to five samples with string
uids, groups of equal rewards, odd widths)."""

from __future__ import annotations

import sys
import types
from collections import defaultdict
from functools import wraps
from typing import Any, Callable, Optional, Tuple, Union

import numpy as np
import pytest
import torch

from restated import assert_verbatim, needs_sources
from rollbuf.integrations import skyrl as R

Float: Any = None  # jaxtyping's, in annotations only
AlgorithmConfig: Any = None  # SkyRL's config class, in annotations only


class AdvantageEstimator:  # SkyRL's StrEnum: its values
    GAE = "gae"
    GRPO = "grpo"
    RLOO = "rloo"
    REINFORCE_PP = "reinforce++"
    MAXRL = "maxrl"


class AdvantageEstimatorRegistry:
    """A stand-in for SkyRL's registry without Ray: its ``register`` refuses a name it has, as SkyRL's."""

    _functions: dict = {}  # noqa: RUF012 (SkyRL's class attribute)

    @classmethod
    def register(cls, name, func):
        if name in cls._functions:
            raise ValueError(f"advantage estimator '{name}' already registered")
        cls._functions[name] = func

    @classmethod
    def get(cls, name):
        return cls._functions[name]


# ----------------------------------------- SkyRL at a9564572e, restated verbatim (see the docstring)

def masked_mean(tensor: torch.Tensor, mask: torch.Tensor | None, dim: int | None = None) -> torch.Tensor:
    """Compute the mean of tensor elements, optionally masked and reduced along a dimension."""
    if mask is None:
        return tensor.mean(axis=dim)
    return (tensor * mask).sum(axis=dim) / mask.sum(axis=dim).clamp(min=1.0)


def masked_var(values, mask, unbiased=True):
    """Compute variance of tensor with masked values."""
    mean = masked_mean(values, mask)
    centered_values = values - mean
    variance = masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        if mask_sum == 0:
            raise ValueError("At least one element in the mask has to be 1.")
        # note that if mask_sum == 1, then there is a division by zero issue
        # to avoid it you just need to use a larger minibatch_size
        if mask_sum == 1:
            raise ValueError("The sum of the mask is one, which can cause a division by zero.")
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def masked_whiten(values, mask, shift_mean=True):
    """Whiten values with masked values."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def register_advantage_estimator(name: Union[str, AdvantageEstimator]):
    """Decorator to register an advantage estimator function."""

    def decorator(func: Callable):
        @wraps(func)
        def wrapper(*args, **kwargs):
            return func(*args, **kwargs)

        AdvantageEstimatorRegistry.register(name, wrapper)
        return wrapper

    return decorator


@register_advantage_estimator(AdvantageEstimator.REINFORCE_PP)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Compute advantage for REINFORCE++.
    This implementation is based on the paper: https://arxiv.org/abs/2501.03262

    Args:
        - token_level_rewards: Float[torch.Tensor, "batch_size response_len"]
        - response_mask: Float[torch.Tensor, "batch_size response_len"]

    Returns:
        - advantages: Float[torch.Tensor, "batch_size response_len"]
        - returns: Float[torch.Tensor, "batch_size response_len"]
    """
    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running_return = 0

        for t in reversed(range(token_level_rewards.shape[1])):
            running_return = token_level_rewards[:, t] + gamma * running_return
            returns[:, t] = running_return
            # Reset after EOS
            running_return = running_return * response_mask[:, t]

        advantages = masked_whiten(returns, response_mask)
        advantages = advantages * response_mask

    return advantages, returns


@register_advantage_estimator(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Compute advantage for RLOO based on https://arxiv.org/abs/2402.14740

    This advantage estimator is also used in LOOP (https://arxiv.org/pdf/2502.01600),
    and was originally introduced in "Buy 4 REINFORCE Samples, Get a Baseline for Free!"
    (https://openreview.net/pdf?id=r1lgTGL5DE).

    Args:
        - token_level_rewards: Float[torch.Tensor, "batch_size response_len"]
        - response_mask: Float[torch.Tensor, "batch_size response_len"]
        - index: np.ndarray (batch_size)

    Returns:
        - advantages: Float[torch.Tensor, "batch_size response_len"]
        - returns: Float[torch.Tensor, "batch_size response_len"]
    """
    from loguru import logger as logger_

    scores = token_level_rewards.sum(dim=-1)

    id2score = defaultdict(list)
    id2mean = {}

    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0, device=scores.device)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.stack(id2score[idx]))
        for i in range(bsz):
            response_num = len(id2score[index[i]])
            if response_num > 1:
                factor = response_num / (response_num - 1)
                scores[i] = (scores[i] - id2mean[index[i]]) * factor
            else:
                # if there's only one response, set the advantage to 0
                logger_.warning(f"Only one response for prompt index {index[i]}, setting advantage to 0")
                scores[i] = 0.0
        scores = scores.unsqueeze(-1) * response_mask

    return scores, scores


@register_advantage_estimator(AdvantageEstimator.GAE)
def compute_gae_advantage_return(
    token_level_rewards: Float[torch.Tensor, "batch_size response_len"],
    values: Float[torch.Tensor, "batch_size response_len"],
    response_mask: Float[torch.Tensor, "batch_size response_len"],
    gamma: float,
    lambd: float,
    **kwargs,
) -> Tuple[Float[torch.Tensor, "batch_size response_len"], Float[torch.Tensor, "batch_size response_len"]]:
    """
    Compute advantage and return for GAE.

    Adapted from https://github.com/huggingface/trl/blob/main/trl/trainer/ppo_trainer.py
    """
    with torch.no_grad():
        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]

        for t in reversed(range(gen_len)):
            nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = delta + gamma * lambd * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)

        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@register_advantage_estimator(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    grpo_norm_by_std: bool = True,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Compute advantage for GRPO, operating only on Outcome reward (with only one scalar reward for each response).

    Expects:
        - token_level_rewards: Float[torch.Tensor, "batch_size response_len"]
        - response_mask: Float[torch.Tensor, "batch_size response_len"]
        - index: np.ndarray (batch_size)
        - epsilon: float
        - grpo_norm_by_std: bool

    Returns:
        - advantages: Float[torch.Tensor, "batch_size response_len"]
        - returns: Float[torch.Tensor, "batch_size response_len"]
    """
    # this assumes response-level rewards
    scores = token_level_rewards.sum(dim=-1)

    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}

    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
                id2std[idx] = torch.std(torch.tensor([id2score[idx]]))
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if grpo_norm_by_std:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask

    return scores, scores


@register_advantage_estimator(AdvantageEstimator.MAXRL)
def compute_maxrl_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute advantage for MAXRL using mean-normalized group-relative rewards."""
    scores = token_level_rewards.sum(dim=-1)

    id2score = defaultdict(list)
    id2mean = {}

    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if len(id2score[index[i]]) > 1:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2mean[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask

    return scores, scores


def compute_advantages_and_returns(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    adv_estimator: AdvantageEstimator,
    config: AlgorithmConfig,
    values: Optional[torch.Tensor] = None,
    grpo_norm_by_std: bool = True,
    gamma=1.0,
    lambd=1.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    estimator_func = AdvantageEstimatorRegistry.get(adv_estimator)

    return estimator_func(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=index,
        values=values,
        grpo_norm_by_std=grpo_norm_by_std,
        gamma=gamma,
        lambd=lambd,
        config=config,
        **kwargs,
    )


# ------------------------------------------------------------------------------------ the harness

RESTATED = {"skyrl/backends/skyrl_train/utils/torch_utils.py": [masked_mean],
            "skyrl/backends/skyrl_train/utils/ppo_utils.py": [
                masked_var, masked_whiten, register_advantage_estimator, compute_reinforce_plus_plus_outcome_advantage,
                compute_rloo_outcome_advantage, compute_gae_advantage_return, compute_grpo_outcome_advantage,
                compute_maxrl_advantage, compute_advantages_and_returns]}
BUILT_IN = dict(AdvantageEstimatorRegistry._functions)  # SkyRL's five, registered by the restated decorators


@needs_sources
def test_restatements_are_verbatim():
    assert_verbatim(RESTATED)


@pytest.fixture
def registered(monkeypatch):
    """rollbuf's estimators registered through ``register()``'s real import (the stand-in module);
    loguru's logger for SkyRL's RLOO. The registry is reset afterwards."""
    for name in ("skyrl", "skyrl.backends", "skyrl.backends.skyrl_train", "skyrl.backends.skyrl_train.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    mod = types.ModuleType("skyrl.backends.skyrl_train.utils.ppo_utils")
    mod.register_advantage_estimator = register_advantage_estimator
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(sys.modules, "loguru", types.SimpleNamespace(logger=types.SimpleNamespace(warning=print)))
    names = R.register()
    yield names
    AdvantageEstimatorRegistry._functions = dict(BUILT_IN)


def batch(seed, B=23, L=11):
    g = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < B:
        sizes.append(int(g.choice([1, 2, 3, 5])))
    sizes[-1] -= sum(sizes) - B
    labels = np.repeat(np.arange(len(sizes)), sizes)
    rewards = torch.tensor(g.normal(size=(B, L)) * 0.1, dtype=torch.float32)
    lengths = torch.tensor(g.integers(1, L + 1, B))
    mask = (torch.arange(L) < lengths[:, None]).long()
    rewards[torch.arange(B), lengths - 1] += torch.tensor(g.normal(size=B) * 2, dtype=torch.float32)
    for k in range(len(sizes)):
        if k % 3 == 1:  # equal rewards (integers: SkyRL's mean of them is exact too)
            rewards[labels == k] = 0.0
            rewards[labels == k, 0] = float(g.integers(-2, 3))
    for i in g.integers(0, B, B // 3 if L > 1 else 0):  # a masked span inside the response
        a = int(g.integers(1, L))
        mask[i, a:a + int(g.integers(1, 3))] = 0
    mask[2] = 0  # an all-masked row
    perm = g.permutation(B)
    uids = [f"uid-{v}" for v in labels[perm]]
    values = torch.tensor(g.normal(size=(B, L)), dtype=torch.float32)
    return rewards[perm], mask[perm], uids, values


def _call(name, rewards, mask, uids, values, gamma=0.9, lambd=0.8, norm=True):
    return compute_advantages_and_returns(token_level_rewards=rewards.clone(), response_mask=mask.clone(),
                                          index=np.array(uids), adv_estimator=name, config=None,
                                          values=values.clone(), grpo_norm_by_std=norm, gamma=gamma, lambd=lambd)


def close(ours, theirs, what):
    """float32: within 1e-5 of the row's scale (its largest magnitude, at least 1)."""
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, ours.shape, theirs.shape, ours.dtype)
    bad = (ours - theirs).abs() > 1e-5 * theirs.abs().amax(-1, keepdim=True).clamp(min=1)
    assert not bad.any(), f"{what}: {ours[bad][:5]} vs {theirs[bad][:5]}"


# ----------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("name", list(R.ESTIMATORS))
@pytest.mark.parametrize("seed,L", [(0, 11), (1, 1), (2, 30)])
def test_registered_estimators_equal_skyrl(registered, name, seed, L):
    assert "rollbuf_" + name in registered
    for gamma, lambd, norm in ((0.9, 0.8, True), (1.0, 1.0, False)):
        b = batch(seed, L=L)
        if name in ("gae", "reinforce++") and L == 1:
            b[1][:4] = 1  # SkyRL's whitening needs two tokens
        want = _call(name, *b, gamma=gamma, lambd=lambd, norm=norm)
        got = _call("rollbuf_" + name, *b, gamma=gamma, lambd=lambd, norm=norm)
        for a, w, what in zip(got, want, ("advantages", "returns")):
            close(a, w, f"{name} {what} gamma={gamma} norm={norm}")


def test_equal_rewards_give_exactly_zero(registered):
    """A group of equal rewards that are not exact in binary (0.1): rollbuf's advantages are exactly 0."""
    rewards = torch.tensor([[0.1], [0.1], [0.1], [0.3], [0.7]])
    mask, uids = torch.ones(5, 1, dtype=torch.long), ["a", "a", "a", "b", "b"]
    for name in ("grpo", "rloo", "maxrl"):
        adv, _ = R.ESTIMATORS[name](token_level_rewards=rewards, response_mask=mask, index=uids)
        assert (adv[:3] == 0).all() and (adv[3:] != 0).all(), name


def test_bad_inputs_name_the_argument(registered):
    r, m = torch.randn(3, 4), torch.ones(3, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="response_mask"):
        R.compute_gae_advantage_return(r, r, m[:, :2], 1.0, 1.0)
    with pytest.raises(ValueError, match="response_mask"):
        R.compute_reinforce_plus_plus_outcome_advantage(r, torch.zeros_like(m), 1.0)
    with pytest.raises(ValueError, match="index"):
        R.compute_grpo_outcome_advantage(r, m, ["a", "b"])
    with pytest.raises(ValueError, match="epsilon"):
        R.compute_maxrl_advantage(r, m, ["a", "a", "b"], epsilon=-1.0)
    with pytest.raises(ValueError, match="already registered"):
        R.register()
