"""verl-agent's GiGPO (group-in-group policy optimisation, arXiv 2505.10978; verl-agent's
``gigpo/core_gigpo.py``) under verl-agent's names and arguments, over :mod:`rollbuf.groups` and the
scans: no loop over groups, no ``np.where`` per uid; the one pass over the rows is the hashing of the
step groups' keys on the host (anchors are Python objects).

Rows are steps of trajectories (one model response per step). GiGPO's advantage of a row is

* the episode term: the row's score (the sum of its ``token_level_rewards``) against its episode
  group ``index`` (every row of the group counts, as verl-agent's default
  ``compute_mean_std_cross_steps=True`` has it): ``score − mean`` (``mode="mean_norm"``) or
  ``(score − mean) / (std + ε)`` (``"mean_std_norm"``); a group of one row has mean 0 and std 1;
* plus ``step_advantage_w ×`` the step term: the row's ``step_rewards`` (its discounted return over
  its trajectory's later steps, :func:`compute_step_discounted_returns`) against the rows of the same
  episode group whose anchor observation is identical (``anchor_obs``), normalised the same way; a
  step group of one has its own value as mean (its step term is 0);

broadcast over the row's response tokens (0 at masked tokens). Docs: docs/llm.md, section 11.
"""

from __future__ import annotations

import numpy as np
import torch

from rollbuf import functional as F
from rollbuf import groups

__all__ = ["compute_gigpo_outcome_advantage", "compute_step_discounted_returns", "step_group_ids", "MODES"]

#: GiGPO's normalisations: ``"mean_norm"`` (subtract the group mean), ``"mean_std_norm"`` (and divide
#: by the group's unbiased std + ε).
MODES = ("mean_norm", "mean_std_norm")


def _key(x):
    """An anchor observation as a hashable key equal for equal observations: strings, numbers and
    ``None`` as they are (a NumPy scalar as its Python number), arrays as the tuple of their elements,
    lists and tuples element by element, dicts as their sorted items."""
    if x is None or isinstance(x, (str, bytes, bool, int, float)):
        return x
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return ("ndarray", x.shape, tuple(_key(e) for e in x.ravel().tolist()))
    if isinstance(x, (list, tuple)):
        return tuple(_key(e) for e in x)
    if isinstance(x, dict):
        return ("dict", tuple(sorted((k, _key(v)) for k, v in x.items())))
    raise TypeError(f"anchor_obs holds a {type(x).__name__}; GiGPO groups anchors by equality: strings, numbers, "
                    "arrays, lists, tuples or dicts of them")


def step_group_ids(anchor_obs, index, device=None) -> tuple[torch.Tensor, int]:
    """``(ids, num_groups)``: ``[B]`` int64 ids, equal for the rows of one episode group (``index``) whose
    anchor observations are equal (:func:`_key`); one hashing pass over the rows on the host."""
    if len(anchor_obs) != len(index):
        raise ValueError(f"anchor_obs must hold one observation per row ({len(index)}), got {len(anchor_obs)}")
    return _step_ids(anchor_obs, groups.group_ids(index)[0].tolist(), device)


def _step_ids(anchor_obs, episode: list, device) -> tuple[torch.Tensor, int]:
    """:func:`step_group_ids` from the rows' episode group ids (a list, as long as ``anchor_obs``)."""
    seen: dict = {}
    ids = [seen.setdefault((g, _key(a)), len(seen)) for g, a in zip(episode, anchor_obs, strict=True)]
    return torch.tensor(ids, dtype=torch.int64, device=device), len(seen)


def _relative(x, stats, epsilon, std_norm: bool, alone_mean):
    """``x − mean`` or ``(x − mean) / (std + ε)`` with a group of one's mean ``alone_mean`` (0, or its
    own value) and std 1."""
    alone = stats.size == 1
    a = x - torch.where(alone, alone_mean, stats.mean)
    return a / (torch.where(alone, 1.0, stats.std) + epsilon) if std_norm else a


def compute_gigpo_outcome_advantage(token_level_rewards, step_rewards, response_mask, anchor_obs, index, traj_index,
                                    epsilon=1e-6, step_advantage_w=1.0, mode="mean_norm", enable_similarity=False,
                                    similarity_thresh=0.95):
    """verl-agent's ``compute_gigpo_outcome_advantage``: ``(advantages, advantages)`` ``[B, L]`` (module
    docstring). ``token_level_rewards``, ``response_mask`` ``[B, L]``; ``step_rewards`` ``[B]``;
    ``anchor_obs``, ``index`` (episode group uids) and ``traj_index`` (trajectory uids, not read, as in
    verl-agent's default) one per row. ``enable_similarity=True`` (verl-agent's fuzzy text matching
    of anchors) is not implemented: a NotImplementedError."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if enable_similarity:
        raise NotImplementedError("enable_similarity: rollbuf groups anchor observations by equality only "
                                  "(verl-agent's similarity clustering is a loop over pairs of strings)")
    if not isinstance(token_level_rewards, torch.Tensor) or token_level_rewards.dim() != 2:
        raise ValueError("token_level_rewards must be a [B, L] tensor")
    if not isinstance(response_mask, torch.Tensor) or response_mask.shape != token_level_rewards.shape:
        raise ValueError(f"response_mask must have token_level_rewards' shape {tuple(token_level_rewards.shape)}")
    B = token_level_rewards.shape[0]
    if not isinstance(step_rewards, torch.Tensor) or step_rewards.shape != (B,):
        raise ValueError(f"step_rewards must be a [B] tensor, B = {B}")
    if len(traj_index) != B:
        raise ValueError(f"traj_index must hold one uid per row ({B}), got {len(traj_index)}")
    eps, std_norm = groups.outcome_epsilon(epsilon), mode == "mean_std_norm"
    with torch.no_grad():
        device = token_level_rewards.device
        scores = token_level_rewards.sum(dim=-1)
        ids, n = groups.group_ids(index)  # ranked once (on the host for NumPy uids), for both groupings
        if len(ids) != B:
            raise ValueError(f"index must hold one uid per row ({B}), got {len(ids)}")
        if len(anchor_obs) != B:
            raise ValueError(f"anchor_obs must hold one observation per row ({B}), got {len(anchor_obs)}")
        sids, sn = _step_ids(anchor_obs, ids.tolist(), device)
        ids = ids.to(device)
        episode = _relative(scores, groups.group_stats(scores, ids, n), eps, std_norm, 0.0)
        x = step_rewards.to(device)
        step = _relative(x, groups.group_stats(x, sids, sn), eps, std_norm, x)
        adv = (episode + step_advantage_w * step).to(scores.dtype)
        out = adv.unsqueeze(-1) * response_mask
    return out, out


def compute_step_discounted_returns(rewards, traj_uids, gamma, device=None) -> torch.Tensor:
    """verl-agent's ``compute_step_discounted_returns`` on the arrays it reads from its batch: each row's
    ``G_t = r_t + γ·G_{t+1}`` over the later rows of its trajectory (``traj_uids``; a trajectory's rows
    in batch order, not necessarily next to each other), float32 ``[B]`` on ``device``. One stable
    sort of the rows by trajectory on the host and one masked scan over them (Monte-Carlo returns,
    the trajectories' last rows terminal)."""
    r = torch.as_tensor(np.asarray(rewards, dtype=np.float64) if not isinstance(rewards, torch.Tensor)
                        else rewards.detach().to("cpu", torch.float64))
    if r.dim() != 1 or len(traj_uids) != r.numel():
        raise ValueError(f"rewards must be 1-d with one traj_uid per row, got {tuple(r.shape)} and {len(traj_uids)}")
    ranks, _ = groups.group_ids(traj_uids)
    order = np.argsort(ranks.numpy(), kind="stable")
    by_traj = ranks[order]
    last = torch.ones_like(by_traj, dtype=torch.bool)
    last[:-1] = by_traj[1:] != by_traj[:-1]
    g = F.discounted_returns(gamma, rewards=r[order][None], terminated=last[None], bootstrap=False)[0]
    out = torch.empty_like(g)
    out[torch.as_tensor(order)] = g
    return out.to(device=device, dtype=torch.float32)
