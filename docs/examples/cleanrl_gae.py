"""CleanRL's PPO advantage loop and its rollbuf replacement (docs/howto/cleanrl.md runs this).

``cleanrl_loop`` is the loop of CleanRL's ``ppo.py`` as written; ``rollbuf_gae`` is the replacement
shown in the how-to (between the markers). Both take CleanRL's buffers: time-major ``[num_steps,
num_envs]`` ``rewards``, ``values`` and observation-aligned ``dones``, plus ``next_value`` and
``next_done`` of the observation after the window.
"""

from __future__ import annotations

import torch


def cleanrl_loop(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values
    return advantages, returns


# --8<-- [start:rollbuf]
import rollbuf.functional as F  # noqa: E402
from rollbuf.boundary.conventions import done_from_episode_starts, from_time_major  # noqa: E402


def rollbuf_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    # [T, N] buffers -> [N, T] views (no copy); observation-aligned dones -> transition-aligned
    r, v, starts = from_time_major(rewards, values, dones)
    done = done_from_episode_starts(starts.bool(), next_done.reshape(-1).bool())
    adv, ret = F.gae(gamma, gae_lambda, rewards=r, values=v, terminated=done,
                     bootstrap_values=next_value.reshape(-1))  # V(s_T) for the window end
    return adv.mT, ret.mT  # [T, N] again (contiguous on a GPU: no copy for .reshape(-1); see Layout)
# --8<-- [end:rollbuf]
