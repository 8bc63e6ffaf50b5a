"""GiGPO (rollbuf.integrations.verl_agent) against verl-agent's functions restated.

verl-agent is not on PyPI: ``_gigpo_loop`` and ``_step_returns_loop`` restate, as plain loops,
``compute_gigpo_outcome_advantage`` (with its ``episode_norm_reward``, ``build_step_group`` without
similarity, ``step_norm_reward``) and ``compute_step_discounted_returns`` of verl-agent's
``gigpo/core_gigpo.py`` (langfengQ/verl-agent, as read in December 2026): the same group rules
(an episode group of one: mean 0, std 1; a step group of one: its own value as mean, std 1), the
same float32 arithmetic per row.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from rollbuf.integrations import verl_agent as VA


def _norm(scores, keys, epsilon, remove_std, alone_mean_is_own):
    by = defaultdict(list)
    for i, k in enumerate(keys):
        by[k].append(scores[i])
    out = scores.clone()
    for i, k in enumerate(keys):
        vals = torch.stack(by[k])
        if len(vals) == 1:
            mean, std = (vals[0] if alone_mean_is_own else torch.tensor(0.0)), torch.tensor(1.0)
        else:
            mean, std = vals.mean(), vals.std()
        out[i] = scores[i] - mean if remove_std else (scores[i] - mean) / (std + epsilon)
    return out


def _anchor_key(x):
    if isinstance(x, np.ndarray):
        return ("a", tuple(x.flatten().tolist()))
    return x if not isinstance(x, list) else tuple(x)


def _gigpo_loop(token_level_rewards, step_rewards, response_mask, anchor_obs, index, epsilon, w, mode):
    remove_std = mode == "mean_norm"
    episode = _norm(token_level_rewards.sum(-1), list(index), epsilon, remove_std, False)
    step_keys = [(index[i], _anchor_key(anchor_obs[i])) for i in range(len(index))]
    step = _norm(step_rewards.clone(), step_keys, epsilon, remove_std, True)
    L = response_mask.shape[-1]
    return (episode.unsqueeze(-1).tile([1, L]) * response_mask + w * (step.unsqueeze(-1).tile([1, L]) * response_mask))


def _step_returns_loop(rewards, traj_uids, gamma):
    out = np.zeros_like(rewards, dtype=np.float32)
    for uid in np.unique(traj_uids):
        rows = np.where(traj_uids == uid)[0]
        running = 0.0
        for t in reversed(rows):
            running = float(rewards[t]) + gamma * running
            out[t] = running
    return torch.tensor(out)


def _batch(seed, B=64, L=7, anchors="str"):
    """Episode groups of 1-5 trajectories, trajectories of 1-4 steps whose rows are interleaved in batch
    order, anchors drawn from a few values (identical anchors inside a group form step groups of
    several rows, others singletons), EOS and tool-span masks, some zero-variance groups."""
    g = np.random.default_rng(seed)
    index, traj = [], []
    while len(index) < B:
        uid = f"u{len(set(index))}"
        for j in range(int(g.integers(1, 6))):
            for _ in range(int(g.integers(1, 5))):
                index.append(uid)
                traj.append(f"{uid}-t{j}")
    perm = g.permutation(len(index))[:B]
    index, traj = np.array(index, dtype=object)[perm], np.array(traj, dtype=object)[perm]
    pool = [f"obs {k}" for k in range(3)] if anchors == "str" else [np.arange(3) * k for k in range(3)]
    anchor = np.empty(B, dtype=object)
    for i in range(B):
        anchor[i] = pool[int(g.integers(0, len(pool)))]
    rewards = torch.tensor(g.normal(size=(B, L)), dtype=torch.float32)
    rewards[index == index[0]] = 1.0  # one zero-variance episode group
    mask = (torch.arange(L) < torch.tensor(g.integers(0, L + 1, B))[:, None]).float()
    step_rewards = torch.tensor(g.normal(size=B), dtype=torch.float32)
    return rewards, step_rewards, mask, anchor, index, traj


@pytest.mark.parametrize("anchors", ["str", "array"])
@pytest.mark.parametrize("mode", VA.MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gigpo_equals_verl_agent(seed, mode, anchors):
    rewards, step_rewards, mask, anchor, index, traj = _batch(seed, anchors=anchors)
    for w in (1.0, 0.5):
        ours, again = VA.compute_gigpo_outcome_advantage(rewards, step_rewards, mask, anchor, index, traj,
                                                         step_advantage_w=w, mode=mode)
        theirs = _gigpo_loop(rewards, step_rewards, mask, anchor, index, 1e-6, w, mode)
        assert ours is again and ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        assert (ours[mask == 0] == 0).all()


def test_gigpo_singletons_and_errors():
    """An episode group of one row: its score itself (mean 0) or score / (1 + ε); a step group of one:
    step term 0. Errors name the argument; similarity grouping is not implemented."""
    r = torch.tensor([[2.0], [1.0], [3.0]])
    m = torch.ones(3, 1)
    s = torch.tensor([5.0, 1.0, 2.0])
    idx = np.array(["a", "b", "b"], dtype=object)
    obs = np.array(["x", "y", "y"], dtype=object)
    adv, _ = VA.compute_gigpo_outcome_advantage(r, s, m, obs, idx, idx)
    assert adv[:, 0].tolist() == [2.0, -1.0 + -0.5, 1.0 + 0.5]
    adv, _ = VA.compute_gigpo_outcome_advantage(r, s, m, obs, idx, idx, mode="mean_std_norm")
    assert adv[0, 0].item() == pytest.approx(2.0 / (1 + 1e-6))
    with pytest.raises(ValueError, match="mode"):
        VA.compute_gigpo_outcome_advantage(r, s, m, obs, idx, idx, mode="std")
    with pytest.raises(NotImplementedError, match="enable_similarity"):
        VA.compute_gigpo_outcome_advantage(r, s, m, obs, idx, idx, enable_similarity=True)
    with pytest.raises(ValueError, match="anchor_obs"):
        VA.compute_gigpo_outcome_advantage(r, s, m, obs[:2], idx, idx)
    with pytest.raises(ValueError, match="step_rewards"):
        VA.compute_gigpo_outcome_advantage(r, s[:2], m, obs, idx, idx)
    with pytest.raises(ValueError, match="epsilon"):
        VA.compute_gigpo_outcome_advantage(r, s, m, obs, idx, idx, epsilon=-1.0)
    with pytest.raises(TypeError, match="anchor_obs"):
        VA.compute_gigpo_outcome_advantage(r, s, m, np.array([object()] * 3, dtype=object), idx, idx)


@pytest.mark.parametrize("seed", [0, 1])
def test_step_discounted_returns_equal_verl_agent(seed):
    """Trajectories' rows interleaved in batch order; each row's return over its trajectory's later rows."""
    _, _, _, _, _, traj = _batch(seed)
    rewards = np.random.default_rng(seed).normal(size=len(traj)).astype(np.float32)
    for gamma in (0.95, 1.0, 0.0):
        ours = VA.compute_step_discounted_returns(rewards, traj, gamma)
        assert ours.dtype == torch.float32 and ours.shape == (len(traj),)
        torch.testing.assert_close(ours, _step_returns_loop(rewards, traj, gamma), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(VA.compute_step_discounted_returns(torch.tensor(rewards), list(traj), 0.9),
                               _step_returns_loop(rewards, traj, 0.9), rtol=1e-5, atol=1e-5)
