"""Retrace(λ): the float64 reference loop, the oracle.

:mod:`rollbuf.reference` gathers the families' loops; its docstring gives the conventions they share.
"""

from __future__ import annotations

from rollbuf.kernels.vtrace.reference import weights
from rollbuf.oracle import as_output, compact, zeros


def retrace(rewards, values, terminated, truncated, bootstrap_values, mask, policies, q_values, gamma, lam, c_bar,
            window_end):
    """Retrace(λ): ``c_t = λ min(c̄, ratio_t)``; ``policies``: ``(log_probs, target_log_probs)``, the
    behaviour and target policies' log-probabilities;
    ``Q^ret_t = r_t + γ(1-k_t)[V'_t + (1-d_t)c_{t+1}(Q^ret_{t+1} - q_{t+1})]``.

    ``values`` is ``E_{a~π} Q(s_t, ·)`` and ``q_values`` is ``Q(s_t, a_t)``; ``c_{t+1}`` is the trace of
    the next unmasked step.
    """
    gamma, lam, c_bar = float(gamma), float(lam), float(c_bar)
    N, T = rewards.shape
    out = zeros(N, T)
    for n in range(N):
        row = compact(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end,
                   extra=(*policies, q_values))
        mu, pi, q = row.extra
        m = len(row.idx)
        Q = [0.0] * m
        for j in reversed(range(m)):
            # (1 - d_j) removes the next step's term after a done step, as it multiplies G_{t+1} in
            # the other recursions (so a NaN there reaches Q_j as 0·NaN, on every backend alike)
            nxt = 0.0  # V_{t+1} + c_{t+1}(Q_{t+1} − q_{t+1}); the window end (d = 1) has no next step
            if j + 1 < m:
                _, c_next, _ = weights(pi[j + 1] - mu[j + 1], lam, None, c_bar, None)
                nxt = row.v[j + 1] + c_next * (Q[j + 1] - q[j + 1])
            # inside an episode V'_t = V_{t+1}: Q_t = r_t + γ(1-k_t)[d_t V'_t + (1-d_t)·nxt]
            Q[j] = row.r[j] + gamma * (1 - row.k[j]) * (row.d[j] * row.vn[j] + (1 - row.d[j]) * nxt)
            out[n][row.idx[j]] = Q[j]
    return as_output(out, rewards)
