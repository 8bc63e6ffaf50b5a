"""The ``reference`` backend: the float64 oracle that every other backend is tested against.

Each estimator is a plain sequential loop over time, one row at a time, on Python floats (float64),
written to read like the recursions of docs/semantics.md. It is deliberately slow and uses no scan, no
vectorisation and no shared algebraic rewrite with the other backends.

Assumptions (the caller has validated the inputs):

* every per-step tensor is ``[N, T]`` (batch already flattened); ``x`` of the forward estimators may be
  ``[N, T, *F]``; flags are bool tensors or ``None`` (= all False); ``mask`` is a bool ``[N, T]`` tensor
  or ``None`` (= all True);
* ``bootstrap_values`` is ``[N, T]``, ``[N]`` (the window-end value of each row only) or ``None``;
* ``gamma``, ``lam``, ``rho_bar``, ``c_bar``, ``pg_rho_bar`` are Python numbers.

Gradients: when a floating input requires grad (and grad mode is on), the same loops run on 0-d
float64 tensors instead of Python floats, so autograd records them step by step (slow, exact: this
is what ``gradcheck`` of the ``reference`` backend checks). A clipped ratio ``min(c̄, ratio)`` is
differentiated as ``torch.clamp`` is, like on the other backends: where the clip is active (``ratio >
c̄``) its value is ``c̄`` and its gradient 0 — a zero that reaches the log-probabilities, so they get a
gradient tensor even when every step is clipped, and never ``0·inf`` from an overflowed ``exp`` —; at
the threshold and below, the ratio's own gradient passes.

Boundaries follow docs/semantics.md literally:

* **mask**: the unmasked steps of a row are compacted, the recursion runs on the compacted row, the
  results are scattered back; masked steps give 0 and nothing at a masked step is ever read;
* **terminated wins** over truncated: a terminated step never reads a successor value;
* **window end** (last unmasked step): with ``window_end="bootstrap"`` it bootstraps from
  ``bootstrap_values`` unless terminated; with ``window_end="terminal"`` it is treated as terminated
  and ``bootstrap_values`` is not read there, unless the caller flagged that step truncated: an
  explicit flag wins over the window-end default, so it bootstraps from ``bootstrap_values[n, t]``;
* ``bootstrap_values`` is read only at a truncated step or at a bootstrapped window end, so a NaN in any
  other slot cannot leak;
* backward recursions treat the window end as done (``d := 1``); the forward ones (eligibility traces,
  episodic sums) do not: there ``d`` is terminated or truncated only, and ``final = (1 - d_last) e_last``
  with "last" the last unmasked step (``final = initial`` for a row with no unmasked step).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "gae",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "eligibility_traces",
    "episodic_sums",
]


# ----------------------------------------------------------------------------------------- helpers


class _Row(NamedTuple):
    """One row with the masked steps deleted; list index ``j`` is the ``j``-th unmasked step."""

    idx: list  # original column t of compacted step j
    r: list  # r_j
    v: list  # V_j (None when values are not needed)
    k: list  # k_j: 1 if terminated (or a terminal window end), else 0
    d: list  # d_j: 1 if done, and 1 at the window end (backward convention)
    vn: list  # successor value V'_j, 0.0 where k_j = 1 (never read there)
    extra: list  # further per-step fields, compacted, in the order given


def _kept(mask, n: int, T: int) -> list:
    """The columns of row ``n`` with ``mask = True``, in order: the compacted row."""
    return list(range(T)) if mask is None else [t for t, m in enumerate(mask[n].tolist()) if m]


def _exp(x):
    if isinstance(x, torch.Tensor):
        return torch.exp(x)
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _clip(bar: float, log_ratio):
    """``min(bar, exp(log_ratio))``, NaN for a NaN ratio (Python's ``min`` would return ``bar``), so a
    NaN log-probability gives NaN as on every other backend; an overflowed ``exp`` (inf) gives
    ``bar``. On 0-d tensors (``torch.clamp``'s gradient): where the clip is active the value is
    ``bar`` plus a zero that still depends on ``log_ratio`` (its gradient is 0, not missing, and no
    ``exp`` that may have overflowed is in its graph); elsewhere the ratio itself."""
    ratio = _exp(log_ratio)
    if ratio != ratio:  # NaN
        return ratio
    if not ratio > bar:
        return ratio
    if isinstance(log_ratio, torch.Tensor):
        return bar + 0.0 * torch.clamp(log_ratio, max=math.log(bar))
    return bar


def _diff(*xs) -> bool:
    """Whether the loops must run on tensors (some input requires grad, grad mode on)."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def _elems(x: torch.Tensor, diff: bool) -> list:
    """The entries of a 1-D tensor in float64: Python floats, or 0-d tensors that keep the graph."""
    x = x.to(torch.float64)
    return list(x.unbind(0)) if diff else x.tolist()


def _num(x: torch.Tensor, diff: bool):
    return x.to(torch.float64) if diff else float(x.to(torch.float64))


def _row(n, fields: tuple, window_end, extra=()):
    """Compact row ``n`` and work out ``k``, ``d`` and the successor value ``V'`` (docs/semantics.md).
    ``fields``: ``(rewards, values, terminated, truncated, bootstrap_values, mask)``."""
    rewards, values, terminated, truncated, bootstrap_values, mask = fields
    assert window_end in ("bootstrap", "terminal"), window_end
    idx = _kept(mask, n, rewards.shape[1])
    m = len(idx)
    diff = _diff(rewards, values, bootstrap_values, *extra)

    def take(x, default=None):  # the compacted row n of a per-step field (floats or 0-d tensors)
        if x is None:
            return [default] * m
        full = _elems(x[n], diff and x.is_floating_point())
        return [full[t] for t in idx]

    r, v = take(rewards), take(values)
    term, trunc = take(terminated, 0.0), take(truncated, 0.0)
    k, d, vn = [], [], []
    for j, t in enumerate(idx):
        end = j == m - 1
        # terminated wins over truncated; window_end="terminal" only decides an *unflagged* window
        # end: a last step the caller flagged truncated still bootstraps from its own value
        k_j = bool(term[j]) or (end and window_end == "terminal" and not trunc[j])
        k.append(1 if k_j else 0)
        d.append(1 if (k_j or trunc[j] or end) else 0)
        if k_j or (bootstrap_values is None and values is None):  # nothing to bootstrap from
            vn.append(0.0)
        elif trunc[j] or end:  # the only place bootstrap_values is read
            assert bootstrap_values is not None, "bootstrap_values needed at a truncation / window end"
            if bootstrap_values.dim() == 1:
                assert end, "[N] bootstrap_values can only serve a truncation at the window end"
                vn.append(_num(bootstrap_values[n], diff))
            else:
                vn.append(_num(bootstrap_values[n, t], diff))
        else:
            vn.append(0.0 if values is None else v[j + 1])  # unused by estimators without values
    return _Row(idx, r, v, k, d, vn, [take(e) for e in extra])


def _zeros(N: int, T: int) -> list:
    return [[0.0] * T for _ in range(N)]


def _tensor(rows, device) -> torch.Tensor:
    """Nested lists of floats and/or 0-d tensors as one float64 tensor (stacked, so autograd sees it)."""
    if isinstance(rows, torch.Tensor):
        return rows.to(torch.float64)
    if isinstance(rows, list) and not any(isinstance(e, (list, torch.Tensor)) for e in rows):
        return torch.tensor(rows, dtype=torch.float64, device=device)
    if not rows:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.stack([_tensor(e, device) if isinstance(e, (list, torch.Tensor))
                        else torch.tensor(e, dtype=torch.float64, device=device) for e in rows])


def _out(rows: list, like: torch.Tensor) -> torch.Tensor:
    if not any(isinstance(e, torch.Tensor) for row in rows for e in row):  # the fast common case
        return torch.tensor(rows, dtype=torch.float64, device=like.device).reshape(like.shape[:2])
    return _tensor(rows, like.device).reshape(like.shape[:2])


# --------------------------------------------------------------------------- backward estimators


def gae(rewards, values, terminated, truncated, bootstrap_values, mask, gamma, lam, window_end):
    """GAE: ``δ_t = r_t + γ(1-k_t)V'_t - V_t``; ``A_t = δ_t + γλ(1-d_t)A_{t+1}``; returns ``A + V``
    (computed by the TD(λ) recursion, which equals it)."""
    gamma, lam = float(gamma), float(lam)
    N, T = rewards.shape
    adv, ret = _zeros(N, T), _zeros(N, T)
    for n in range(N):
        row = _row(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end)
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
    return _out(adv, rewards), _out(ret, rewards)


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
    out = _zeros(N, T)
    for n in range(N):
        row = _row(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end)
        G = 0.0  # G_{t+1}
        m = len(row.idx)
        for j in reversed(range(m)):
            G = _lambda_step(row, j, m, gamma, lam, G)
            out[n][row.idx[j]] = G
    return _out(out, rewards)


def discounted_returns(rewards, values, terminated, truncated, bootstrap_values, mask, gamma, bootstrap,
                       window_end):
    """Bootstrapped: ``G_t = r_t + γ(1-k_t)[d_t V'_t + (1-d_t)G_{t+1}]``.

    Monte Carlo (``bootstrap=False``): ``G_t = r_t + γ(1-d_t)G_{t+1}``, ``G`` past the window = 0;
    ``values`` and ``bootstrap_values`` are not used.
    """
    gamma = float(gamma)
    N, T = rewards.shape
    out = _zeros(N, T)
    for n in range(N):
        if bootstrap:
            row = _row(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end)
        else:
            row = _row(n, (rewards, None, terminated, truncated, None, mask), window_end)
        G = 0.0  # G_{t+1}; past the window it is 0
        for j in reversed(range(len(row.idx))):
            if bootstrap:
                G = row.r[j] + gamma * (1 - row.k[j]) * (row.d[j] * row.vn[j] + (1 - row.d[j]) * G)
            else:
                G = row.r[j] + gamma * (1 - row.d[j]) * G
            out[n][row.idx[j]] = G
    return _out(out, rewards)


def vtrace(rewards, values, terminated, truncated, bootstrap_values, mask, log_probs, target_log_probs,
           gamma, rho_bar, c_bar, pg_rho_bar, lam, window_end):
    """V-trace (IMPALA).

    ``ρ_t = min(ρ̄, ratio_t)``, ``c_t = λ min(c̄, ratio_t)``;
    ``u_t = vs_t - V_t = ρ_t(r_t + γ(1-k_t)V'_t - V_t) + γ(1-d_t)c_t u_{t+1}``;
    ``pg_t = min(ρ̄_pg, ratio_t)(r_t + γ(1-k_t)q_t - V_t)``, ``q_t = vs_{t+1}`` if not ``d_t`` else ``V'_t``.
    """
    gamma, lam, rho_bar, c_bar = float(gamma), float(lam), float(rho_bar), float(c_bar)
    pg_rho_bar = rho_bar if pg_rho_bar is None else float(pg_rho_bar)
    N, T = rewards.shape
    vs_out, pg_out = _zeros(N, T), _zeros(N, T)
    for n in range(N):
        row = _row(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end,
                   extra=(log_probs, target_log_probs))
        mu, pi = row.extra
        m = len(row.idx)
        vs = [0.0] * m
        u = 0.0  # u_{t+1}
        for j in reversed(range(m)):
            rho = _clip(rho_bar, pi[j] - mu[j])
            c = lam * _clip(c_bar, pi[j] - mu[j])
            delta = row.r[j] + gamma * (1 - row.k[j]) * row.vn[j] - row.v[j]
            u = rho * delta + gamma * (1 - row.d[j]) * c * u
            vs[j] = row.v[j] + u
        for j in range(m):
            # q_t = V'_t after a done step, vs_{t+1} inside an episode, weighed by d_t as in the
            # other recursions (so a NaN in vs_{t+1} reaches pg_t as 0·NaN, on every backend alike)
            vs_next = vs[j + 1] if j + 1 < m else 0.0
            q = row.d[j] * row.vn[j] + (1 - row.d[j]) * vs_next
            pg = _clip(pg_rho_bar, pi[j] - mu[j]) * (row.r[j] + gamma * (1 - row.k[j]) * q - row.v[j])
            vs_out[n][row.idx[j]] = vs[j]
            pg_out[n][row.idx[j]] = pg
    return _out(vs_out, rewards), _out(pg_out, rewards)


def retrace(rewards, values, terminated, truncated, bootstrap_values, mask, log_probs, target_log_probs,
            q_values, gamma, lam, c_bar, window_end):
    """Retrace(λ): ``c_t = λ min(c̄, ratio_t)``;
    ``Q^ret_t = r_t + γ(1-k_t)[V'_t + (1-d_t)c_{t+1}(Q^ret_{t+1} - q_{t+1})]``.

    ``values`` is ``E_{a~π} Q(s_t, ·)`` and ``q_values`` is ``Q(s_t, a_t)``; ``c_{t+1}`` is the trace of
    the next unmasked step.
    """
    gamma, lam, c_bar = float(gamma), float(lam), float(c_bar)
    N, T = rewards.shape
    out = _zeros(N, T)
    for n in range(N):
        row = _row(n, (rewards, values, terminated, truncated, bootstrap_values, mask), window_end,
                   extra=(log_probs, target_log_probs, q_values))
        mu, pi, q = row.extra
        m = len(row.idx)
        Q = [0.0] * m
        for j in reversed(range(m)):
            # (1 - d_j) removes the next step's term after a done step, as it multiplies G_{t+1} in
            # the other recursions (so a NaN there reaches Q_j as 0·NaN, on every backend alike)
            nxt = 0.0  # V_{t+1} + c_{t+1}(Q_{t+1} − q_{t+1}); the window end (d = 1) has no next step
            if j + 1 < m:
                c_next = lam * _clip(c_bar, pi[j + 1] - mu[j + 1])
                nxt = row.v[j + 1] + c_next * (Q[j + 1] - q[j + 1])
            # inside an episode V'_t = V_{t+1}: Q_t = r_t + γ(1-k_t)[d_t V'_t + (1-d_t)·nxt]
            Q[j] = row.r[j] + gamma * (1 - row.k[j]) * (row.d[j] * row.vn[j] + (1 - row.d[j]) * nxt)
            out[n][row.idx[j]] = Q[j]
    return _out(out, rewards)


# ---------------------------------------------------------------------------- forward estimators


def _forward(x, terminated, truncated, mask, initial, decay):
    """``y_t = x_t + decay (1-d_{t-1}) y_{t-1}``, ``y_{-1} = initial``, ``d_{-1} = 0``; d = term or trunc."""
    N, T = x.shape[0], x.shape[1]
    feat = tuple(x.shape[2:])
    F = math.prod(feat)
    diff = _diff(x, initial)
    xs = x.to(torch.float64).reshape(N, T, F)  # features flattened
    init = None if initial is None else initial.to(torch.float64).reshape(N, F)
    ys = [[[0.0] * F for _ in range(T)] for _ in range(N)]
    finals = []
    for n in range(N):
        x_row = [_elems(xs[n, t], diff) for t in range(T)]
        term = [False] * T if terminated is None else terminated[n].tolist()
        trunc = [False] * T if truncated is None else truncated[n].tolist()
        e = [0.0] * F if init is None else _elems(init[n], diff)  # e_{-1}
        d_prev = 0  # d_{-1}
        for t in _kept(mask, n, T):
            e = [x_row[t][f] + decay * (1 - d_prev) * e[f] for f in range(F)]
            ys[n][t] = e
            d_prev = 1 if (term[t] or trunc[t]) else 0
        finals.append([(1 - d_prev) * e[f] for f in range(F)])  # no step: d_prev = 0, e = initial
    dev = x.device
    if not diff:
        return (torch.tensor(ys, dtype=torch.float64, device=dev).reshape(N, T, *feat),
                torch.tensor(finals, dtype=torch.float64, device=dev).reshape(N, *feat))
    return _tensor(ys, dev).reshape(N, T, *feat), _tensor(finals, dev).reshape(N, *feat)


def eligibility_traces(x, terminated, truncated, mask, gamma, lam, initial):
    """``e_t = x_t + γλ(1-d_{t-1})e_{t-1}``; returns ``(traces, final = (1-d_last) e_last)``."""
    return _forward(x, terminated, truncated, mask, initial, float(gamma) * float(lam))


def episodic_sums(x, terminated, truncated, mask, initial):
    """``S_t = x_t + (1-d_{t-1})S_{t-1}``; returns ``(sums, final = (1-d_last) S_last)``."""
    return _forward(x, terminated, truncated, mask, initial, 1.0)


# --------------------------------------------------------------------------- the generic primitive


def affine_scan(alpha, beta, reverse, initial):
    """``y_t = α_t + β_t·y_{t−1}`` (``y_{t+1}`` if ``reverse``), ``y`` outside the row = ``initial``."""
    N, T = alpha.shape
    diff = _diff(alpha, beta, initial)
    out = _zeros(N, T)
    for n in range(N):
        a, b = _elems(alpha[n], diff), _elems(beta[n], diff)
        y = _num(initial[n], diff)
        for t in (reversed(range(T)) if reverse else range(T)):
            y = a[t] + b[t] * y
            out[n][t] = y
    return _out(out, alpha)
