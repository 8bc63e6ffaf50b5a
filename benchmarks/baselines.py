"""What users run today, for the benchmarks: the same GAE, written the usual ways.

Both compute GAE with terminations and a bootstrapped window end (no interior truncations), the
common CleanRL/SB3 setting, so that they can be checked against rollbuf's reference.
"""

from __future__ import annotations

import torch


def gae_loop(rewards, values, terminated, last_values, gamma, lam):
    """The CleanRL/SB3 loop over time (eager PyTorch, one small kernel per op per step)."""
    T = rewards.shape[-1]
    adv = torch.empty_like(rewards)
    last = torch.zeros_like(rewards[..., 0])
    notdone = 1.0 - terminated.to(rewards.dtype)
    for t in reversed(range(T)):
        next_v = last_values if t == T - 1 else values[..., t + 1]
        delta = rewards[..., t] + gamma * next_v * notdone[..., t] - values[..., t]
        carry = 0.0 if t == T - 1 else 1.0
        last = delta + gamma * lam * notdone[..., t] * carry * last
        adv[..., t] = last
    return adv, adv + values


def gae_doubling(rewards, values, terminated, last_values, gamma: float, lam: float):
    """A linear-space doubling (Hillis–Steele) scan: log2 T passes over [N, T] in HBM.
    This is the baseline that ``torch.compile`` turns into a handful of fused kernels."""
    nd = 1.0 - terminated.to(rewards.dtype)
    next_v = torch.cat([values[..., 1:], last_values.unsqueeze(-1)], dim=-1)
    a = rewards + gamma * nd * next_v - values
    link = torch.ones_like(nd)
    link[..., -1] = 0.0
    b = gamma * lam * nd * link
    T = rewards.shape[-1]
    off = 1
    while off < T:
        a_sh = torch.nn.functional.pad(a[..., off:], (0, off))
        b_sh = torch.nn.functional.pad(b[..., off:], (0, off), value=1.0)
        a = a + b * a_sh
        b = b * b_sh
        off *= 2
    return a, a + values
