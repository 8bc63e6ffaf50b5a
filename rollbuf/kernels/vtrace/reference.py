"""V-trace: the float64 reference loop, the oracle.

:mod:`rollbuf.reference` gathers the families' loops; its docstring gives the conventions they share.
"""

from __future__ import annotations

from rollbuf.boundary.coefficients import rebind
from rollbuf.kernels.vtrace.coefficients import truncated_weights
from rollbuf.oracle import as_output, clip, compact, zeros

weights = rebind(truncated_weights, clip=clip)  # of the log-ratio, on floats or 0-d tensors


def vtrace(rewards, values, terminated, truncated, bootstrap_values, mask, policies, gamma, lam, bars, window_end):
    """V-trace (IMPALA). ``policies``: ``(log_probs, target_log_probs)``, the behaviour and target
    policies' log-probabilities; ``bars``: the truncation levels ``(ρ̄, c̄, ρ̄_pg)`` (``ρ̄_pg`` None: ``ρ̄``).

    ``ρ_t = min(ρ̄, ratio_t)``, ``c_t = λ min(c̄, ratio_t)``;
    ``u_t = vs_t - V_t = ρ_t(r_t + γ(1-k_t)V'_t - V_t) + γ(1-d_t)c_t u_{t+1}``;
    ``pg_t = min(ρ̄_pg, ratio_t)(r_t + γ(1-k_t)q_t - V_t)``, ``q_t = vs_{t+1}`` if not ``d_t`` else ``V'_t``.
    """
    rho_bar, c_bar, pg_rho_bar = bars
    gamma, lam, rho_bar, c_bar = float(gamma), float(lam), float(rho_bar), float(c_bar)
    pg_rho_bar = rho_bar if pg_rho_bar is None else float(pg_rho_bar)
    N, T = rewards.shape
    vs_out, pg_out = zeros(N, T), zeros(N, T)
    for n in range(N):
        row = compact(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end,
                   extra=tuple(policies))
        mu, pi = row.extra
        m = len(row.idx)
        vs, rho_pg = [0.0] * m, [0.0] * m
        u = 0.0  # u_{t+1}
        for j in reversed(range(m)):
            rho, c, rho_pg[j] = weights(pi[j] - mu[j], lam, rho_bar, c_bar, pg_rho_bar)
            delta = row.r[j] + gamma * (1 - row.k[j]) * row.vn[j] - row.v[j]
            u = rho * delta + gamma * (1 - row.d[j]) * c * u
            vs[j] = row.v[j] + u
        for j in range(m):
            # q_t = V'_t after a done step, vs_{t+1} inside an episode, weighed by d_t as in the
            # other recursions (so a NaN in vs_{t+1} reaches pg_t as 0·NaN, on every backend alike)
            vs_next = vs[j + 1] if j + 1 < m else 0.0
            q = row.d[j] * row.vn[j] + (1 - row.d[j]) * vs_next
            pg = rho_pg[j] * (row.r[j] + gamma * (1 - row.k[j]) * q - row.v[j])
            vs_out[n][row.idx[j]] = vs[j]
            pg_out[n][row.idx[j]] = pg
    return as_output(vs_out, rewards), as_output(pg_out, rewards)
