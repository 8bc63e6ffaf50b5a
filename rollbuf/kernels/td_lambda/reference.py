"""GAE, TD(λ) returns, bootstrapped and Monte-Carlo discounted returns: the float64 reference loop, the oracle.

:mod:`rollbuf.reference` gathers the families' loops; its docstring gives the conventions they share.
"""

from __future__ import annotations

from rollbuf.oracle import as_output, compact, zeros


def gae(rewards, values, terminated, truncated, bootstrap_values, mask, gamma, lam, window_end):
    """GAE: ``δ_t = r_t + γ(1-k_t)V'_t - V_t``; ``A_t = δ_t + γλ(1-d_t)A_{t+1}``; returns ``A + V``
    (computed by the TD(λ) recursion, which equals it)."""
    gamma, lam = float(gamma), float(lam)
    N, T = rewards.shape
    adv, ret = zeros(N, T), zeros(N, T)
    for n in range(N):
        row = compact(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end)
        A = 0.0  # A_{t+1}; multiplied by (1 - d) = 0 at the window end
        G = 0.0  # G_{t+1}: the returns by their own recursion (TD(λ)), equal to A + V; they do not
        # read V_t itself, so a NaN value at t leaves the return at t finite, as on every backend
        m = len(row.idx)
        for j in reversed(range(m)):
            delta = row.r[j] + gamma * (1 - row.k[j]) * row.vn[j] - row.v[j]
            A = delta + gamma * lam * (1 - row.d[j]) * A
            G = _lambda_step(row, j, m, gamma, lam, G)
            adv[n][row.idx[j]] = A
            ret[n][row.idx[j]] = G
    return as_output(adv, rewards), as_output(ret, rewards)


def _lambda_step(row, j, m, gamma, lam, G_next):
    """``G_t = r_t + γ(1-k_t)[d_t V'_t + (1-d_t)((1-λ)V_{t+1} + λG_{t+1})]``: the TD(λ) return
    (inside an episode ``V'_t = V_{t+1}``), written with the done flag weighing the whole next-step
    term, so that a NaN there reaches ``G_t`` as ``0·NaN`` (as on every backend); at the window end
    (``d = 1``) there is no next step."""
    nxt = 0.0
    if j + 1 < m:
        nxt = (1 - lam) * row.v[j + 1] + lam * G_next
    return row.r[j] + gamma * (1 - row.k[j]) * (row.d[j] * row.vn[j] + (1 - row.d[j]) * nxt)


def lambda_returns(rewards, values, terminated, truncated, bootstrap_values, mask, gamma, lam, window_end):
    """TD(λ): ``G_t = r_t + γ(1-k_t)[(1 - λ(1-d_t))V'_t + λ(1-d_t)G_{t+1}]``."""
    gamma, lam = float(gamma), float(lam)
    N, T = rewards.shape
    out = zeros(N, T)
    for n in range(N):
        row = compact(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end)
        G = 0.0  # G_{t+1}
        m = len(row.idx)
        for j in reversed(range(m)):
            G = _lambda_step(row, j, m, gamma, lam, G)
            out[n][row.idx[j]] = G
    return as_output(out, rewards)


def discounted_returns(rewards, values, terminated, truncated, bootstrap_values, mask, gamma, bootstrap,
                       window_end):
    """Bootstrapped: ``G_t = r_t + γ(1-k_t)[d_t V'_t + (1-d_t)G_{t+1}]``.

    Monte Carlo (``bootstrap=False``): ``G_t = r_t + γ(1-d_t)G_{t+1}``, ``G`` past the window = 0;
    ``values`` and ``bootstrap_values`` are not used.
    """
    gamma = float(gamma)
    N, T = rewards.shape
    out = zeros(N, T)
    for n in range(N):
        if bootstrap:
            row = compact(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end)
        else:
            row = compact(n, (rewards, None, terminated, truncated, None, mask), window_end)
        G = 0.0  # G_{t+1}; past the window it is 0
        for j in reversed(range(len(row.idx))):
            if bootstrap:
                G = row.r[j] + gamma * (1 - row.k[j]) * (row.d[j] * row.vn[j] + (1 - row.d[j]) * G)
            else:
                G = row.r[j] + gamma * (1 - row.d[j]) * G
            out[n][row.idx[j]] = G
    return as_output(out, rewards)
