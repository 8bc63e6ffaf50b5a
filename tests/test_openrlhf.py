"""rollbuf.integrations.openrlhf against OpenRLHF 0.11.2's own code, RESTATED below: OpenRLHF imports
Ray, DeepSpeed and vLLM at the top of the modules that hold it (and ships a wheel for CPython 3.11
only), so CI cannot import it. Copied verbatim from the openrlhf 0.11.2 wheel:

* ``compute_reward`` from ``openrlhf/models/utils.py``;
* ``apply_overlong_penalty``, ``apply_stop_properly_penalty``, ``apply_length_penalties`` from
  ``openrlhf/trainer/ppo_utils/length_penalty.py``;
* ``RemoteExperienceMaker.compute_advantages_and_returns``, ``.get_advantages_and_returns``,
  ``.get_cumulative_returns`` from ``openrlhf/trainer/ppo_utils/experience_maker.py``.

``test_restatements_are_verbatim`` compares each with the shipped source, statement for statement (its
AST), where ``ROLLBUF_ORACLE_SOURCES`` names a folder holding the unpacked wheel's ``openrlhf``
package (``pip download --no-deps openrlhf==0.11.2`` and unzip; the package is under
``openrlhf-0.11.2.data/purelib``); it is skipped without it.

The restated functions live in a stand-in ``openrlhf.trainer.ppo_utils.experience_maker`` module put in
``sys.modules``, so ``rollbuf.integrations.openrlhf.patch()`` runs its real import and patches a real
class. Compared: the restated experience maker, and the same class patched, on random micro-batches
(right padding, tool spans inside rows, all-masked rows, rows that fill the width, the truncation
penalty, odd widths), for every estimator name; every token, every info key written."""

from __future__ import annotations

import copy
import itertools
import logging
import sys
import types
from typing import List, Optional, Tuple, Union

import numpy as np
import pytest
import torch

from restated import assert_verbatim, needs_sources
from rollbuf.integrations import openrlhf as R

logger = logging.getLogger("openrlhf-restated")
Experience = types.SimpleNamespace


# --------------------------------------------- OpenRLHF 0.11.2, restated verbatim (see the docstring)

def compute_reward(
    r: Union[torch.Tensor, float],
    kl_coef: float,
    kl: Union[torch.Tensor, list[torch.Tensor]],
    action_mask: Optional[torch.Tensor] = None,
    reward_clip_range: Tuple[float, float] = None,
) -> Union[torch.Tensor, list[torch.Tensor]]:
    if kl_coef <= 0.0:
        kl_coef = 0.0

    if reward_clip_range:
        r = r.clamp(min=reward_clip_range[0], max=reward_clip_range[1])

    kl_reward = -kl_coef * kl
    # The following code is equivalent to:
    #
    # last_reward = torch.zeros_like(kl)
    # for i in range(last_reward.size(0)):
    #     for t in reversed(range(last_reward.size(1))):
    #         if action_mask[i][t] > 0.5:
    #             last_reward[i][t] = r[i]
    #             break
    #
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))

    reward = last_reward + kl_reward

    return reward


def apply_overlong_penalty(
    experiences: List,
    max_new_tokens: int,
    overlong_buffer_len: float,
    overlong_penalty_factor: float = 1.0,
) -> int:
    """
    DAPO-style overlong penalty based on response length.

    Penalizes responses that exceed (max_new_tokens - overlong_buffer_len).
    Formula: penalty = -min(exceed_len, buffer_len) / buffer_len * penalty_factor

    Args:
        experiences: List of Experience objects with rewards and info
        max_new_tokens: Maximum generation length
        overlong_buffer_len: Buffer length before max_new_tokens
        overlong_penalty_factor: Maximum penalty factor

    Returns:
        Number of samples that received penalty
    """
    assert (
        max_new_tokens >= overlong_buffer_len
    ), f"max_new_tokens ({max_new_tokens}) must be >= overlong_buffer_len ({overlong_buffer_len})"

    expected_len = max_new_tokens - overlong_buffer_len
    total_penalized = 0

    for experience in experiences:
        response_lengths = experience.response_length
        batch_size = len(response_lengths)

        for j in range(batch_size):
            valid_response_length = response_lengths[j].item()
            # Cap the exceed_len to overlong_buffer_len to prevent excessive penalty
            exceed_len = min(valid_response_length - expected_len, overlong_buffer_len)

            if exceed_len > 0:
                overlong_penalty = -exceed_len / overlong_buffer_len * overlong_penalty_factor
                experience.rewards[j] += overlong_penalty
                total_penalized += 1

    return total_penalized


def apply_stop_properly_penalty(
    experiences: List,
    stop_properly_penalty_coef: float,
) -> int:
    """
    ProRL-style stop properly penalty based on vLLM finish_reason.

    Penalizes samples that were truncated (finish_reason == "length").

    When stop_properly_penalty_coef >= 0: scale truncated rewards by this coefficient.
    When stop_properly_penalty_coef < 0: set truncated rewards to this value directly
        (e.g., -0.5 gives truncated samples a fixed negative reward).

    Args:
        experiences: List of Experience objects with rewards and info
        stop_properly_penalty_coef: Coefficient to penalize truncated samples.
            If >= 0: multiplicative scaling [0, 1].
            If < 0: fixed reward override for truncated samples.

    Returns:
        Number of truncated samples
    """
    if stop_properly_penalty_coef >= 0:
        assert (
            0 <= stop_properly_penalty_coef <= 1
        ), f"stop_properly_penalty_coef must be in [0, 1] or negative, got {stop_properly_penalty_coef}"

    total_truncated = 0

    for experience in experiences:
        truncated_flags = experience.truncated
        if truncated_flags is None:
            continue

        batch_size = len(truncated_flags)
        for j in range(batch_size):
            if truncated_flags[j].item():
                if stop_properly_penalty_coef < 0:
                    # Fixed negative reward for truncated samples
                    experience.rewards[j] = stop_properly_penalty_coef
                else:
                    # Scale truncated sample rewards by the penalty coefficient
                    experience.rewards[j] = experience.rewards[j] * stop_properly_penalty_coef
                total_truncated += 1

    return total_truncated


def apply_length_penalties(experiences: List, args) -> None:
    """
    Apply length penalties to experiences based on configuration.

    Supports two types of penalties:
    1. DAPO Overlong Penalty (--overlong_buffer_len, --overlong_penalty_factor)
    2. ProRL Stop Properly Penalty (--stop_properly_penalty_coef)

    Both can be enabled simultaneously.

    Args:
        experiences: List of Experience objects
        args: Training arguments containing penalty configuration
    """
    total_samples = sum(len(exp.rewards) for exp in experiences)

    # DAPO-style overlong penalty based on response length
    if getattr(args.reward, "overlong_buffer_len", None) is not None:
        max_new_tokens = getattr(args.rollout, "max_new_tokens", None) or args.data.max_len
        num_penalized = apply_overlong_penalty(
            experiences=experiences,
            max_new_tokens=max_new_tokens,
            overlong_buffer_len=args.reward.overlong_buffer_len,
            overlong_penalty_factor=getattr(args.reward, "overlong_penalty_factor", 1.0),
        )
        logger.info(
            f"[DAPO Overlong Penalty] {num_penalized}/{total_samples} samples penalized, "
            f"buffer_len={args.reward.overlong_buffer_len}, factor={args.reward.overlong_penalty_factor}"
        )

    # ProRL-style stop properly penalty based on finish_reason
    if getattr(args.reward, "stop_properly_penalty_coef", None) is not None:
        num_truncated = apply_stop_properly_penalty(
            experiences=experiences,
            stop_properly_penalty_coef=args.reward.stop_properly_penalty_coef,
        )
        logger.info(
            f"[ProRL Stop Properly Penalty] {num_truncated}/{total_samples} samples truncated, "
            f"coef={args.reward.stop_properly_penalty_coef}"
        )

    # Sync info["reward"] with the modified rewards so logged metrics reflect penalties
    for experience in experiences:
        if "reward" in experience.info:
            experience.info["reward"] = experience.rewards.clone()


class RemoteExperienceMaker:
    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: List[Experience]) -> List[Experience]:
        """Compute shaped rewards, advantages, and returns for a batch of experiences."""
        args = self.strategy.args

        # Use at least FP32 for reward penalties and group statistics.
        for experience in experiences:
            experience.rewards = experience.rewards.to(torch.promote_types(experience.rewards.dtype, torch.float32))

        # ── Length penalties (DAPO overlong / ProRL stop properly) ──
        apply_length_penalties(experiences, args)

        # ── Reward shaping (baseline subtraction) ──
        exp_len = [len(experience.index) for experience in experiences]
        indices = torch.tensor(list(itertools.chain.from_iterable(experience.index for experience in experiences)))
        raw_rewards = torch.cat([experience.rewards for experience in experiences], dim=0)
        rewards = torch.empty_like(raw_rewards)
        rewards[indices] = raw_rewards  # sorted by original prompt order

        rewards = rewards.reshape(-1, args.rollout.n_samples_per_prompt)

        if args.rollout.n_samples_per_prompt > 1:
            group_reward_stds = (
                rewards.std(-1, keepdim=True)
                .repeat(1, args.rollout.n_samples_per_prompt)
                .reshape(-1)[indices]
                .split(exp_len)
            )
            for experience, group_reward_std in zip(experiences, group_reward_stds):
                experience.info["group_reward_std"] = group_reward_std

        if args.algo.advantage.estimator == "rloo":
            baseline = (rewards.sum(-1, keepdim=True) - rewards) / (args.rollout.n_samples_per_prompt - 1)
            rewards = rewards - baseline
        elif args.algo.advantage.estimator in ["reinforce_baseline", "dr_grpo"]:
            rewards = rewards - rewards.mean(-1, keepdim=True)
        elif args.algo.advantage.estimator == "group_norm":
            rewards = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)
        elif args.algo.advantage.estimator == "flash_reinforce":
            # FlashREINFORCE: baseline = mean over the whole rollout batch (the single-rollout
            # regime has no prompt group), no whitening below.
            rewards = rewards - rewards.mean()

        rewards = rewards.reshape(-1)[indices].split(exp_len)

        # ── Per-token advantages and returns ──
        for experience, reward in zip(experiences, rewards):
            reward = compute_reward(
                reward,
                self.kl_ctl.value,
                experience.kl,
                action_mask=experience.action_mask,
                reward_clip_range=args.reward.clip_range,
            )

            if self.advantage_estimator == "gae":
                experience.advantages, experience.returns = self.get_advantages_and_returns(
                    experience.values,
                    reward,
                    experience.action_mask,
                    args.algo.advantage.gamma,
                    args.algo.advantage.lambd,
                )
            elif self.advantage_estimator in [
                "reinforce",
                "rloo",
                "reinforce_baseline",
                "group_norm",
                "dr_grpo",
                "flash_reinforce",
            ]:
                if args.algo.advantage.gamma != 1.0 and self.advantage_estimator != "reinforce":
                    logger.warning(f"gamma is set to 1.0 for {self.advantage_estimator}")
                    args.algo.advantage.gamma = 1.0

                experience.returns = self.get_cumulative_returns(
                    reward,
                    experience.action_mask,
                    args.algo.advantage.gamma,
                )
                experience.advantages = experience.returns.clone()
            else:
                raise Exception(f"Unkown advantage_estimator {self.advantage_estimator}")

            experience.info["return"] = reward.sum(dim=-1)
            experience.kl = None

        # ── Normalize advantages across all experiences ──
        if args.algo.advantage.estimator in ["gae", "reinforce", "reinforce_baseline"]:
            all_advantages = torch.cat([exp.advantages.flatten() for exp in experiences], dim=0).float()
            all_action_masks = torch.cat([exp.action_mask.flatten() for exp in experiences], dim=0)
            num_actions = all_action_masks.sum()

            mean = (all_advantages * all_action_masks).sum() / num_actions
            if not args.algo.advantage.no_std_norm:
                var = ((all_advantages - mean).pow(2) * all_action_masks).sum() / num_actions
                rstd = var.clamp(min=1e-8).rsqrt()
            else:
                rstd = 1

            for exp in experiences:
                exp.advantages = (exp.advantages - mean) * rstd

        return experiences

    @torch.no_grad()
    def get_advantages_and_returns(
        self,
        values: torch.Tensor,
        rewards: torch.Tensor,
        action_mask: torch.Tensor,
        gamma: float,
        lambd: float,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Function that computes advantages and returns from rewards and values.
        Calculated as in the original PPO paper: https://arxiv.org/abs/1707.06347
        Note that rewards may include a KL divergence loss term.

        Advantages looks like this:
        Adv1 =  R1 + γ * λ * R2     + γ^2 * λ^2 * R3       + ...
              - V1 + γ * (1 - λ) V2 + γ^2 * λ * (1 - λ) V3 + ...

        Returns looks like this:
        Ret1 =  R1 + γ * λ * R2     + γ^2 * λ^2 * R3       + ...
                   + γ * (1 - λ) V2 + γ^2 * λ * (1 - λ) V3 + ...

        Input:
        - values: Tensor of shape (batch_size, response_size)
        - rewards: Tensor of shape (batch_size, response_size)

        Output:
        - advantages: Tensor of shape (batch_size, response_size)
        - returns: Tensor of shape (batch_size, response_size)
        """
        lastgaelam = 0
        advantages_reversed = []
        response_length = rewards.size(1)

        # Mask invalid responses
        if action_mask is not None:
            values = action_mask * values
            rewards = action_mask * rewards

        for t in reversed(range(response_length)):
            nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
            delta = rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = delta + gamma * lambd * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
        return advantages.detach(), returns

    @torch.no_grad()
    def get_cumulative_returns(
        self,
        rewards: torch.Tensor,
        action_mask: torch.Tensor,
        gamma: float,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """
        Function that computes advantages and returns from rewards using REINFORCE.
        REINFORCE uses cumulative returns without the GAE (Generalized Advantage Estimation).

        Input:
        - rewards: Tensor of shape (batch_size, response_size)
        - action_mask: Tensor of shape (batch_size, response_size), binary mask
        - gamma: discount factor

        Output:
        - returns: Tensor of shape (batch_size, response_size)
        """
        response_length = rewards.size(1)
        returns = torch.zeros_like(rewards)
        cumulative_return = torch.zeros(rewards.size(0), device=rewards.device)

        # Mask invalid responses if action_mask is provided
        if action_mask is not None:
            rewards = action_mask * rewards

        # Calculate returns by accumulating discounted rewards
        for t in reversed(range(response_length)):
            cumulative_return = rewards[:, t] + gamma * cumulative_return
            returns[:, t] = cumulative_return

        return returns



# ------------------------------------------------------------------------------------ the harness

RESTATED = {"openrlhf/models/utils.py": [compute_reward],
            "openrlhf/trainer/ppo_utils/length_penalty.py": [apply_overlong_penalty, apply_stop_properly_penalty,
                                                             apply_length_penalties],
            "openrlhf/trainer/ppo_utils/experience_maker.py": [
                RemoteExperienceMaker.compute_advantages_and_returns,
                RemoteExperienceMaker.get_advantages_and_returns, RemoteExperienceMaker.get_cumulative_returns]}


@needs_sources
def test_restatements_are_verbatim():
    assert_verbatim(RESTATED)


@pytest.fixture
def maker_module(monkeypatch):
    """The stand-in ``openrlhf.trainer.ppo_utils.experience_maker``: its class a fresh subclass of the
    restated one (patching it leaves the restated methods alone)."""
    mod = types.ModuleType("openrlhf.trainer.ppo_utils.experience_maker")
    mod.RemoteExperienceMaker = type("RemoteExperienceMaker", (RemoteExperienceMaker,), {})
    mod.compute_reward, mod.apply_length_penalties, mod.logger = compute_reward, apply_length_penalties, logger
    for name in ("openrlhf", "openrlhf.trainer", "openrlhf.trainer.ppo_utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    sys.modules["openrlhf.trainer.ppo_utils"].experience_maker = mod
    yield mod
    R.unpatch(mod.RemoteExperienceMaker)


def _ns(**kw):
    return types.SimpleNamespace(**kw)


def _args(estimator, n, gamma=0.9, lambd=0.8, no_std_norm=False, penalties=True):
    return _ns(algo=_ns(advantage=_ns(estimator=estimator, gamma=gamma, lambd=lambd, no_std_norm=no_std_norm)),
               rollout=_ns(n_samples_per_prompt=n, max_new_tokens=24),
               reward=_ns(clip_range=(-4.0, 4.0), overlong_buffer_len=6 if penalties else None,
                          overlong_penalty_factor=0.5, stop_properly_penalty_coef=0.5 if penalties else None),
               data=_ns(max_len=24))


def _maker(cls, args):
    m = cls.__new__(cls)
    m.strategy, m.advantage_estimator, m.kl_ctl = _ns(args=args), args.algo.advantage.estimator, _ns(value=0.05)
    return m


def experiences(seed, n, prompts=5, widths=(7, 24, 1, 13)):
    """Micro-batches of the prompts' ``n`` samples each, shuffled over the batches (each sample's
    ``index`` its rollout position); each batch its own width (right padding), with tool spans inside
    rows, an all-masked row, rows that fill the width (``truncated``); some groups with equal
    rewards (integers), one of binary rewards."""
    g = np.random.default_rng(seed)
    N = prompts * n
    scores = g.normal(size=N).astype(np.float32)
    for p in range(prompts):
        if p % 3 == 1:
            scores[p * n:(p + 1) * n] = float(g.integers(-2, 3))
        elif p % 3 == 2:
            scores[p * n:(p + 1) * n] = (g.random(n) < 0.5).astype(np.float32)
    order = g.permutation(N)
    cuts = np.sort(g.choice(np.arange(1, N), size=min(len(widths), N) - 1, replace=False))
    out = []
    for k, idx in enumerate(np.split(order, cuts)):
        A, b = widths[k % len(widths)], len(idx)
        lengths = torch.tensor(g.integers(0, A + 1, b))
        lengths[g.random(b) < 0.3] = A  # fills the width
        mask = torch.arange(A) < lengths[:, None]
        for i in range(b):
            if g.random() < 0.4 and A > 3:  # a tool span inside the response
                a = int(g.integers(1, A - 1))
                mask[i, a:a + int(g.integers(1, 3))] = False
        if b > 1:
            mask[0] = False  # an all-masked row
        out.append(Experience(
            index=[int(i) for i in idx], rewards=torch.tensor(scores[idx]), action_mask=mask,
            values=torch.tensor(g.normal(size=(b, A)), dtype=torch.float32),
            kl=torch.tensor(g.normal(size=(b, A)) * 0.2, dtype=torch.float32),
            response_length=mask.sum(-1), truncated=lengths == A, info={}))
    return out


def close(ours, theirs, what):
    """float32: within 1e-5 of the row's scale (its largest magnitude, at least 1)."""
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, ours.shape, theirs.shape, ours.dtype)
    scale = theirs.abs().amax(-1, keepdim=True).clamp(min=1) if theirs.dim() else theirs.abs().clamp(min=1)
    bad = (ours - theirs).abs() > 1e-5 * scale
    assert not bad.any(), f"{what}: {ours[bad][:5]} vs {theirs[bad][:5]}"


# ----------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("estimator", R.ESTIMATORS)
@pytest.mark.parametrize("seed", [0, 1])
def test_experience_maker_equals_openrlhf(maker_module, estimator, seed):
    n = 1 if estimator == "flash_reinforce" and seed else 4
    batches = experiences(seed, n)
    want = _maker(RemoteExperienceMaker, args := _args(estimator, n)).compute_advantages_and_returns(
        copy.deepcopy(batches))
    cls = R.patch()
    assert cls is maker_module.RemoteExperienceMaker
    got = _maker(cls, args2 := _args(estimator, n)).compute_advantages_and_returns(copy.deepcopy(batches))
    assert args2.algo.advantage.gamma == args.algo.advantage.gamma  # reset to 1.0 as OpenRLHF does
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.kl is None and b.kl is None and set(a.info) == set(b.info), (a.info.keys(), b.info.keys())
        for key in ("advantages", "returns", "rewards"):
            close(getattr(a, key), getattr(b, key), f"{estimator} batch {k} {key}")
        for key in a.info:
            close(a.info[key], b.info[key], f"{estimator} batch {k} info[{key}]")


@pytest.mark.parametrize("no_std_norm", [False, True])
def test_whitening_and_no_std_norm(maker_module, no_std_norm):
    batches = experiences(3, 2, widths=(5, 11))
    want = _maker(RemoteExperienceMaker, _args("reinforce", 2, no_std_norm=no_std_norm, penalties=False)
                  ).compute_advantages_and_returns(copy.deepcopy(batches))
    got = _maker(R.patch(), _args("reinforce", 2, no_std_norm=no_std_norm, penalties=False)
                 ).compute_advantages_and_returns(copy.deepcopy(batches))
    for a, b in zip(got, want):
        close(a.advantages, b.advantages, "advantages")


@pytest.mark.parametrize("T", [1, 2, 37])
def test_token_methods_equal_openrlhf(T):
    """The two scans alone, on [B, T] rows with every kind of mask and ``action_mask=None``."""
    g = torch.Generator().manual_seed(T)
    B = 9
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[0], mask[1] = False, True
    for m in (mask, None):
        for gamma, lambd in ((1.0, 1.0), (0.9, 0.8), (0.0, 0.5)):
            want = RemoteExperienceMaker.get_advantages_and_returns(None, v, r, m, gamma, lambd)
            got = R.get_advantages_and_returns(None, v, r, m, gamma, lambd)
            for a, b, what in zip(got, want, ("advantages", "returns")):
                close(a, b, f"{what} T={T} gamma={gamma}")
            close(R.get_cumulative_returns(None, r, m, gamma),
                  RemoteExperienceMaker.get_cumulative_returns(None, r, m, gamma), f"returns T={T} gamma={gamma}")


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_baseline", "dr_grpo", "group_norm"])
def test_equal_rewards_give_exactly_zero(estimator):
    by_position = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.7, -3.3, 2.0, 0.0])  # group 0 equal, group 1 not
    indices = torch.tensor([4, 0, 2, 5, 6, 1, 7, 3])
    shaped, std = R.shape_rewards(by_position[indices], indices, 4, estimator)
    g0 = indices < 4
    assert (shaped[g0] == 0).all() and (std[g0] == 0).all() and (shaped[~g0] != 0).all() and (std[~g0] > 0).all()


def test_bad_inputs_name_the_argument():
    r, idx = torch.randn(6), torch.arange(6)
    with pytest.raises(ValueError, match="estimator"):
        R.shape_rewards(r, idx, 2, "grpo")
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        R.shape_rewards(r, idx, 4, "rloo")
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        R.shape_rewards(r, idx, 1, "group_norm")
    with pytest.raises(ValueError, match="indices"):
        R.shape_rewards(r, torch.tensor([0, 1, 2, 3, 4, 4]), 2, "rloo")
    with pytest.raises(ValueError, match="values"):
        R.get_advantages_and_returns(None, torch.randn(2, 3), torch.randn(2, 4), None, 1.0, 1.0)


def test_patch_and_unpatch(maker_module):
    cls = maker_module.RemoteExperienceMaker
    assert R.patch() is cls and R.patch() is cls  # twice: the originals are kept once
    assert all(getattr(cls, name) is getattr(R, name) for name in
               ("get_advantages_and_returns", "get_cumulative_returns", "compute_advantages_and_returns"))
    R.unpatch()
    assert cls.get_advantages_and_returns is RemoteExperienceMaker.get_advantages_and_returns  # inherited again
    assert "get_cumulative_returns" not in vars(cls)
    own = type("Own", (), {"get_advantages_and_returns": lambda self: 1, "get_cumulative_returns": lambda self: 2,
                           "compute_advantages_and_returns": lambda self: 3})
    saved = own.get_advantages_and_returns
    R.patch(own)
    R.unpatch(own)
    assert own.get_advantages_and_returns is saved
