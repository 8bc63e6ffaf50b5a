"""Independent float64 oracles, and the advantage loops users write today.

Part 1 — **the oracles** of the benchmark gate (``python -m benchmarks``): every estimator as its
recursion, a Python loop over time with torch operations over all rows at once, in float64. They
import nothing from rollbuf (no boundary coefficients, no backend, no scan): a bug shared by every
rollbuf backend cannot hide here, and the module reads against the recursions below on its own.

Fields are ``[*B, T]`` (time last; ``x`` of the forward estimators may be ``[*B, T, *F]``); flags
are bool, uint8 or 0/1 floats. Per step ``t`` of a row, with ``k_t = terminated_t``,
``done_t = terminated_t or truncated_t`` and the **window end** = the row's last step (its last
step with ``mask = True`` when a mask is given):

* **successor value** ``V'_t``: ``bootstrap_values[t]`` where ``t`` is truncated or is the window
  end, else ``values[t+1]``; unused where ``k_t`` (the terminal factor ``1 − k_t`` removes it).
  ``bootstrap_values`` is ``[*B, T]`` or ``[*B]`` (the window-end value of each row only); it is read
  nowhere else, so a NaN in any other slot never reaches an output. With
  ``window_end="terminal"`` an unflagged window end is terminal (``k = 1`` there; a window end the
  caller flagged truncated still bootstraps). If both flags are set, terminated wins;
* **mask**: every estimator behaves as if the steps with ``mask = False`` were deleted and the rest
  closed up; outputs at masked steps are 0 and nothing at a masked step is read;
* backward recursions use ``d_t = done_t``, and ``d := 1`` at the window end; the forward ones
  (traces, sums) use ``d_t = done_t`` only.

The recursions (backward in time unless marked forward), ``ratio_t = exp(target_log_probs_t −
log_probs_t)``:

* GAE (Schulman et al. 2016): ``δ_t = r_t + γ(1−k_t)V'_t − V_t``; ``A_t = δ_t + γλ(1−d_t)A_{t+1}``;
  outputs ``A`` and ``A + V``;
* TD(λ) returns (Sutton 1988): ``G_t = r_t + γ(1−k_t)[(1 − λ(1−d_t))V'_t + λ(1−d_t)G_{t+1}]``;
* discounted returns, bootstrapped: ``G_t = r_t + γ(1−k_t)[d_t V'_t + (1−d_t)G_{t+1}]``;
  Monte Carlo: ``G_t = r_t + γ(1−d_t)G_{t+1}`` (values and ``bootstrap_values`` not used);
* V-trace (Espeholt et al. 2018): ``ρ_t = min(ρ̄, ratio_t)``, ``c_t = λ min(c̄, ratio_t)``;
  ``u_t = ρ_t(r_t + γ(1−k_t)V'_t − V_t) + γ(1−d_t)c_t u_{t+1}``, ``vs_t = V_t + u_t``;
  ``pg_t = min(ρ̄_pg, ratio_t)(r_t + γ(1−k_t)q_t − V_t)`` with ``q_t = vs_{t+1}`` if not ``d_t``
  else ``V'_t``; ``ρ̄_pg`` defaults to ``ρ̄``;
* Retrace(λ) (Munos et al. 2016): ``c_t = λ min(c̄, ratio_t)``;
  ``Q_t = r_t + γ(1−k_t)[V'_t + (1−d_t)c_{t+1}(Q_{t+1} − q_{t+1})]``, ``q_t`` = ``q_values_t``
  (``values`` holds ``E_π Q(s_t, ·)``); note ``c_{t+1}``, the next step's trace;
* eligibility traces (forward): ``e_t = x_t + γλ(1−d_{t−1})e_{t−1}``, ``e_{−1}`` = ``initial``
  (default 0), ``d_{−1} = 0``; ``final = (1 − d_last) e_last`` (``initial`` for a row with no step);
* episodic sums (forward): the same with ``γλ = 1``; ``x`` defaults to the rewards.

**How it runs.** A row with a mask is first compacted (its unmasked steps moved to the front in
order, the rest marked not live); every per-step quantity of the recursion (``δ``, ``V'``, the
flags, ``c_{t+1}``, ...) is computed for all steps at once with ``torch.where`` selecting what the
recursion reads (so garbage at an unread slot is never multiplied by 0); then the recursion runs
step by step over time for all rows together, a not-live step leaving the state unchanged. A long
row is cut into chunks of ``L`` steps that run side by side: each chunk's recursion runs twice, with
an incoming state of 0 and of 1; since each recursion is affine in its state, the true state of a
step is ``y0 + (y1 − y0)·s`` with ``s`` the state entering the chunk, which a loop over the chunks
carries from one chunk to the next (superposition; nothing else changes, and the result equals the
unchunked loop to float64 rounding — the tests run both). Rows of at most 256 steps are not cut.

Part 2 — **the loops users write** (CleanRL/SB3's GAE loop, a doubling scan as ``torch.compile``
turns it into fused kernels, verl's multi-turn token loop): benchmark competitors and test oracles
for "rollbuf gives the numbers of the code it replaces". They compute in the dtype of their inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

__all__ = [
    "gae",
    "advantages",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "eligibility_traces",
    "episodic_sums",
    "outputs",
    "ESTIMATORS",
    "gae_loop",
    "gae_doubling",
    "verl_multi_turn_gae",
]

F64 = torch.float64
UNCUT_MAX_T = 256  # rows up to this many steps run as one loop over time; longer rows in chunks


# ------------------------------------------------------------------------------------------ rows


class _Rows:
    """The rows of a rollout, flattened to ``[N, T]`` and compacted (unmasked steps first).

    ``live[n, j]``: compacted step ``j`` of row ``n`` is one of its unmasked steps; ``end[n, j]``: it
    is the window end. ``take(x)`` returns a per-step field compacted to ``[N, T, F]`` in float64
    (``F`` = 1 for ``[*B, T]`` fields); ``put(y)`` scatters a compacted ``[N, T, F]`` output back to
    the original steps (0 at masked steps) and to the caller's shape.
    """

    def __init__(self, shape, mask, device):
        self.batch = tuple(shape[:-1])
        self.T = T = int(shape[-1])
        self.N = N = math.prod(self.batch)
        self.device = device
        steps = torch.arange(T, device=device)
        if mask is None:
            self.order = None
            count = torch.full((N,), T, dtype=torch.long, device=device)
        else:
            m = _flag("mask", mask, shape).reshape(N, T)
            # stable sort of "masked" (0 first): the unmasked steps in their order, then the rest
            self.order = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices
            count = m.sum(1)
        self.count = count
        self.live = steps < count[:, None]  # [N, T]
        self.end = steps == (count - 1)[:, None]  # [N, T]; no window end in a row with no step

    def take(self, x: torch.Tensor, feature_dims: int = 0) -> torch.Tensor:
        x = x.to(F64).reshape(self.N, self.T, -1) if feature_dims else x.to(F64).reshape(self.N, self.T, 1)
        if self.order is not None:
            x = x.gather(1, self.order[:, :, None].expand_as(x))
        return x

    def take_flag(self, name, x) -> torch.Tensor:
        """A flag field compacted to ``[N, T]`` bool (all False when ``x`` is None)."""
        if x is None:
            return torch.zeros(self.N, self.T, dtype=torch.bool, device=self.device)
        f = _flag(name, x, self.batch + (self.T,)).reshape(self.N, self.T)
        return f if self.order is None else f.gather(1, self.order)

    def put(self, y: torch.Tensor, feature_shape=()) -> torch.Tensor:
        y = torch.where(self.live[:, :, None], y, torch.zeros((), dtype=F64, device=y.device))
        if self.order is not None:
            y = torch.zeros_like(y).scatter(1, self.order[:, :, None].expand_as(y), y)
        return y.reshape(*self.batch, self.T, *feature_shape)


def _flag(name, x, shape) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    return x != 0


def _field(name, x, shape) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    return x


def _next(a: torch.Tensor) -> torch.Tensor:
    """``a[:, j + 1]`` at every ``j`` of a compacted ``[N, T, F]`` field (the last step repeats itself:
    the recursions read it nowhere)."""
    return torch.cat([a[:, 1:], a[:, -1:]], dim=1)


def _prev_flag(d: torch.Tensor) -> torch.Tensor:
    """``d[:, j − 1]`` of a ``[N, T]`` flag, ``False`` at ``j = 0``."""
    return torch.cat([torch.zeros_like(d[:, :1]), d[:, :-1]], dim=1)


# --------------------------------------------------------------------------------- the time loop


def _run(step, per_step: dict, live: torch.Tensor, init: torch.Tensor, reverse: bool, chunk=None):
    """The state after each step of ``state = step(a_t, state)`` over time, for every row.

    ``per_step``: ``[N, T, F]`` tensors (``[N, T]`` flags are given a trailing 1); ``a_t`` is the
    dict of their step-``t`` slices. ``live`` ``[N, T]``: a not-live step leaves the state as it is.
    ``init`` ``[N, F]``: the state entering the row (after its last step when ``reverse``).
    ``chunk``: steps per chunk for long rows (default: about √T, rows up to ``UNCUT_MAX_T`` uncut).
    Returns ``[N, T, F]``.
    """
    N, T = live.shape
    F = init.shape[-1]
    per_step = {k: (v if v.dim() == 3 else v[:, :, None]) for k, v in per_step.items()}
    if chunk is None:
        chunk = T if T <= UNCUT_MAX_T else 2 ** math.ceil(math.log2(math.sqrt(T)))
    chunk = max(1, min(int(chunk), max(T, 1)))
    if chunk >= T:
        return _loop(step, per_step, live[:, :, None], init, reverse)
    C = -(-T // chunk)
    pad = C * chunk - T

    def fold(v):  # [N, T, *] -> [N * C, chunk, *], the padding not live
        if pad:
            v = torch.cat([v, torch.zeros((N, pad) + tuple(v.shape[2:]), dtype=v.dtype, device=v.device)], dim=1)
        return v.reshape((N * C, chunk) + tuple(v.shape[2:]))

    folded = {k: fold(v) for k, v in per_step.items()}
    # every chunk with an incoming state of 0 and of 1 (leading dimension 2)
    start = torch.stack([torch.zeros(N * C, F, dtype=F64, device=init.device),
                         torch.ones(N * C, F, dtype=F64, device=init.device)])
    ys = _loop(step, folded, fold(live[:, :, None]), start, reverse)  # [2, N*C, chunk, F]
    y0 = ys[0].reshape(N, C, chunk, F)
    slope = (ys[1] - ys[0]).reshape(N, C, chunk, F)
    entering = torch.empty(N, C, F, dtype=F64, device=init.device)
    s = init
    order = range(C - 1, -1, -1) if reverse else range(C)
    first = 0 if reverse else chunk - 1  # the step whose state leaves the chunk
    for c in order:
        entering[:, c] = s
        s = y0[:, c, first] + slope[:, c, first] * s
    y = y0 + slope * entering[:, :, None, :]
    return y.reshape(N, C * chunk, F)[:, :T]


def _loop(step, per_step, live, init, reverse):
    T = live.shape[1]
    state = init
    out = torch.empty(tuple(init.shape[:-1]) + (T, init.shape[-1]), dtype=F64, device=init.device)
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        a = {k: v[:, t] for k, v in per_step.items()}
        state = torch.where(live[:, t], step(a, state), state)
        out[..., t, :] = state
    return out


# ------------------------------------------------------------------------ backward estimators


class _Backward:
    """What every backward estimator reads: compacted rows, ``k``, ``d``, ``V'`` (``v`` and ``vn``:
    only with ``bootstrap``)."""

    v: torch.Tensor
    vn: torch.Tensor

    def __init__(self, rewards, values, terminated, truncated, bootstrap_values, mask, window_end,
                 bootstrap=True):
        if window_end not in ("bootstrap", "terminal"):
            raise ValueError(f"window_end must be 'bootstrap' or 'terminal', got {window_end!r}")
        if not isinstance(rewards, torch.Tensor) or rewards.dim() < 1:
            raise TypeError("rewards must be a [*B, T] tensor")
        shape = tuple(rewards.shape)
        self.rows = rows = _Rows(shape, mask, rewards.device)
        self.r = rows.take(rewards)
        term = rows.take_flag("terminated", terminated)
        trunc = rows.take_flag("truncated", truncated) & ~term  # terminated wins
        end = rows.end
        if bootstrap and window_end == "terminal":
            term = term | (end & ~trunc)  # an explicit truncation flag wins over the default
        self.k = term
        self.d = term | trunc | end
        if not bootstrap:
            return
        if values is None:
            raise ValueError("values is required by this estimator")
        self.v = rows.take(_field("values", values, shape))
        reads_bv = rows.live & ~term & (trunc | end)  # where V' = bootstrap_values
        if bootstrap_values is None:
            if bool(reads_bv.any()):
                raise ValueError("bootstrap_values is required: a truncated step or a bootstrapped window "
                                 "end reads it (or pass window_end='terminal')")
            bv = torch.zeros_like(self.v)
        elif tuple(bootstrap_values.shape) == shape:
            bv = rows.take(bootstrap_values)
        elif tuple(bootstrap_values.shape) == shape[:-1]:
            if bool((reads_bv & ~end).any()):
                raise ValueError("bootstrap_values of shape [*B] (the window-end column) cannot serve a "
                                 "truncation before the window end: pass [*B, T]")
            bv = bootstrap_values.to(F64).reshape(rows.N, 1, 1).expand(rows.N, rows.T, 1)
        else:
            raise ValueError(f"bootstrap_values must have shape {shape} or {shape[:-1]}, "
                             f"got {tuple(bootstrap_values.shape)}")
        zero = torch.zeros((), dtype=F64, device=self.v.device)
        # V'_t: 0 where terminated (never read there), bootstrap_values at truncations and the
        # window end, else the next step's value
        self.vn = torch.where(term[:, :, None], zero,
                              torch.where((trunc | end)[:, :, None], bv, _next(self.v)))

    def solve(self, step, per_step, chunk):
        init = torch.zeros(self.rows.N, 1, dtype=F64, device=self.r.device)
        return _run(step, per_step, self.rows.live, init, reverse=True, chunk=chunk)


def _zero(like):
    return torch.zeros((), dtype=F64, device=like.device)


def gae(rewards, values, terminated=None, truncated=None, bootstrap_values=None, mask=None, *, gamma, lam,
        window_end="bootstrap", chunk=None):
    """GAE: ``δ_t = r_t + γ(1−k_t)V'_t − V_t``; ``A_t = δ_t + γλ(1−d_t)A_{t+1}``. Returns
    ``(advantages, returns = A + V)``, float64."""
    b = _Backward(rewards, values, terminated, truncated, bootstrap_values, mask, window_end)
    g, gl = float(gamma), float(gamma) * float(lam)
    delta = b.r + torch.where(b.k[:, :, None], _zero(b.r), g * b.vn) - b.v

    def step(a, A):
        return a["delta"] + torch.where(a["d"], _zero(A), gl * A)

    A = b.solve(step, dict(delta=delta, d=b.d), chunk)
    return b.rows.put(A), b.rows.put(A + b.v)


def advantages(rewards, values, terminated=None, truncated=None, bootstrap_values=None, mask=None, *, gamma, lam,
               window_end="bootstrap", chunk=None):
    """GAE advantages only."""
    return gae(rewards, values, terminated, truncated, bootstrap_values, mask, gamma=gamma, lam=lam,
               window_end=window_end, chunk=chunk)[0]


def lambda_returns(rewards, values, terminated=None, truncated=None, bootstrap_values=None, mask=None, *, gamma,
                   lam, window_end="bootstrap", chunk=None):
    """TD(λ): ``G_t = r_t + γ(1−k_t)[(1 − λ(1−d_t))V'_t + λ(1−d_t)G_{t+1}]``."""
    b = _Backward(rewards, values, terminated, truncated, bootstrap_values, mask, window_end)
    g, lam = float(gamma), float(lam)
    w = (~b.d).to(F64) * lam  # λ(1 − d_t)

    def step(a, G):
        return a["r"] + torch.where(a["k"], _zero(G), g * ((1 - a["w"]) * a["vn"] + a["w"] * G))

    G = b.solve(step, dict(r=b.r, k=b.k, w=w, vn=b.vn), chunk)
    return b.rows.put(G)


def discounted_returns(rewards, values=None, terminated=None, truncated=None, bootstrap_values=None, mask=None, *,
                       gamma, bootstrap=True, window_end="bootstrap", chunk=None):
    """Bootstrapped: ``G_t = r_t + γ(1−k_t)[d_t V'_t + (1−d_t)G_{t+1}]``; Monte Carlo
    (``bootstrap=False``): ``G_t = r_t + γ(1−d_t)G_{t+1}``."""
    b = _Backward(rewards, values, terminated, truncated, bootstrap_values, mask, window_end, bootstrap=bootstrap)
    g = float(gamma)
    if bootstrap:
        def step(a, G):
            return a["r"] + torch.where(a["k"], _zero(G), g * torch.where(a["d"], a["vn"], G))

        G = b.solve(step, dict(r=b.r, k=b.k, d=b.d, vn=b.vn), chunk)
    else:
        def step(a, G):
            return a["r"] + torch.where(a["d"], _zero(G), g * G)

        G = b.solve(step, dict(r=b.r, d=b.d), chunk)
    return b.rows.put(G)


def _ratio(rows, log_probs, target_log_probs, shape):
    if log_probs is None or target_log_probs is None:
        raise ValueError("log_probs and target_log_probs are required by this estimator")
    lp = rows.take(_field("log_probs", log_probs, shape))
    tlp = rows.take(_field("target_log_probs", target_log_probs, shape))
    return torch.exp(tlp - lp)


def vtrace(rewards, values, log_probs, target_log_probs, terminated=None, truncated=None, bootstrap_values=None,
           mask=None, *, gamma, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None, lam=1.0, window_end="bootstrap",
           chunk=None):
    """V-trace: ``u_t = ρ_t(r_t + γ(1−k_t)V'_t − V_t) + γ(1−d_t)c_t u_{t+1}``, ``vs = V + u``;
    ``pg_t = min(ρ̄_pg, ratio_t)(r_t + γ(1−k_t)q_t − V_t)``, ``q_t = vs_{t+1}`` if not ``d_t`` else
    ``V'_t``. Returns ``(vs, pg_advantages)``."""
    b = _Backward(rewards, values, terminated, truncated, bootstrap_values, mask, window_end)
    g = float(gamma)
    pg_rho_bar = rho_bar if pg_rho_bar is None else pg_rho_bar
    ratio = _ratio(b.rows, log_probs, target_log_probs, tuple(rewards.shape))
    rho = torch.clamp(ratio, max=float(rho_bar))
    c = float(lam) * torch.clamp(ratio, max=float(c_bar))
    td = b.r + torch.where(b.k[:, :, None], _zero(b.r), g * b.vn) - b.v

    def step(a, u):
        return a["rho"] * a["td"] + torch.where(a["d"], _zero(u), g * a["c"] * u)

    u = b.solve(step, dict(rho=rho, td=td, c=c, d=b.d), chunk)
    vs = b.v + u
    q = torch.where(b.d[:, :, None], b.vn, _next(vs))
    pg = torch.clamp(ratio, max=float(pg_rho_bar)) * (
        b.r + torch.where(b.k[:, :, None], _zero(b.r), g * q) - b.v)
    return b.rows.put(vs), b.rows.put(pg)


def retrace(rewards, values, q_values, log_probs, target_log_probs, terminated=None, truncated=None,
            bootstrap_values=None, mask=None, *, gamma, lam=1.0, c_bar=1.0, window_end="bootstrap", chunk=None):
    """Retrace(λ): ``Q_t = r_t + γ(1−k_t)[V'_t + (1−d_t)c_{t+1}(Q_{t+1} − q_{t+1})]``,
    ``c_t = λ min(c̄, ratio_t)``."""
    b = _Backward(rewards, values, terminated, truncated, bootstrap_values, mask, window_end)
    g = float(gamma)
    shape = tuple(rewards.shape)
    if q_values is None:
        raise ValueError("q_values is required by retrace")
    q = b.rows.take(_field("q_values", q_values, shape))
    c = float(lam) * torch.clamp(_ratio(b.rows, log_probs, target_log_probs, shape), max=float(c_bar))

    def step(a, Q):
        trace = torch.where(a["d"], _zero(Q), a["c_next"] * (Q - a["q_next"]))
        return a["r"] + torch.where(a["k"], _zero(Q), g * (a["vn"] + trace))

    Q = b.solve(step, dict(r=b.r, k=b.k, d=b.d, vn=b.vn, c_next=_next(c), q_next=_next(q)), chunk)
    return b.rows.put(Q)


# ------------------------------------------------------------------------- forward estimators


def _forward(x, terminated, truncated, mask, initial, decay, chunk):
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise TypeError("x must be a [*B, T] or [*B, T, *F] tensor")
    layout = next((f for f in (mask, terminated, truncated) if f is not None), None)
    shape = tuple(layout.shape) if layout is not None else tuple(x.shape)
    if tuple(x.shape[:len(shape)]) != shape:
        raise ValueError(f"x must have shape {shape} or {shape} + features, got {tuple(x.shape)}")
    feat = tuple(x.shape[len(shape):])
    rows = _Rows(shape, mask, x.device)
    xs = rows.take(x, feature_dims=len(feat))  # [N, T, F]
    d = rows.take_flag("terminated", terminated) | rows.take_flag("truncated", truncated)
    F = xs.shape[-1]
    if initial is None:
        init = torch.zeros(rows.N, F, dtype=F64, device=x.device)
    else:
        if tuple(initial.shape) != shape[:-1] + feat:
            raise ValueError(f"initial must have shape {shape[:-1] + feat}, got {tuple(initial.shape)}")
        init = initial.to(F64).reshape(rows.N, F)
    decay = float(decay)

    def step(a, e):
        return a["x"] + torch.where(a["d_prev"], _zero(e), decay * e)

    e = _run(step, dict(x=xs, d_prev=_prev_flag(d)), rows.live, init, reverse=False, chunk=chunk)
    # final = (1 − d_last) e_last at the last live step; initial for a row with no step
    last = (rows.count - 1).clamp_min(0)
    idx = torch.arange(rows.N, device=x.device)
    e_last, d_last = e[idx, last], d[idx, last][:, None]
    final = torch.where(rows.count[:, None] > 0, torch.where(d_last, _zero(e), e_last), init)
    return rows.put(e, feat), final.reshape(*rows.batch, *feat)


def eligibility_traces(x, terminated=None, truncated=None, mask=None, *, gamma, lam, initial=None, chunk=None):
    """``e_t = x_t + γλ(1−d_{t−1})e_{t−1}``; returns ``(traces, final)``."""
    return _forward(x, terminated, truncated, mask, initial, float(gamma) * float(lam), chunk)


def episodic_sums(x, terminated=None, truncated=None, mask=None, *, initial=None, chunk=None):
    """``S_t = x_t + (1−d_{t−1})S_{t−1}``; returns ``(sums, final)``."""
    return _forward(x, terminated, truncated, mask, initial, 1.0, chunk)


# ------------------------------------------------------------------------- by estimator name

_BACK = ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")
#: Estimator name -> (function, fields it takes, fixed keywords, output names). Names as in
#: ``rollbuf.testing.ESTIMATORS``.
ESTIMATORS: dict[str, tuple[Callable[..., object], tuple[str, ...], dict[str, object], tuple[str, ...]]] = {
    "gae": (gae, _BACK, {}, ("advantages", "returns")),
    "advantages": (advantages, _BACK, {}, ("advantages",)),
    "lambda_returns": (lambda_returns, _BACK, {}, ("returns",)),
    "discounted_returns": (discounted_returns, _BACK, {}, ("returns",)),
    "monte_carlo_returns": (discounted_returns, ("rewards", "terminated", "truncated", "mask"),
                            {"bootstrap": False}, ("returns",)),
    "vtrace": (vtrace, _BACK + ("log_probs", "target_log_probs"), {}, ("vs", "pg_advantages")),
    "retrace": (retrace, _BACK + ("q_values", "log_probs", "target_log_probs"), {}, ("q_targets",)),
    "eligibility_traces": (eligibility_traces, ("x", "terminated", "truncated", "mask"), {}, ("traces", "final")),
    "episodic_sums": (episodic_sums, ("x", "terminated", "truncated", "mask"), {}, ("sums", "final")),
}


def outputs(name: str, fields: Mapping, *, chunk=None, **params) -> tuple[torch.Tensor, ...]:
    """The float64 outputs of estimator ``name`` on ``fields`` (a dict such as
    ``rollbuf.testing.make_rollout`` makes; extra entries ignored), always a tuple, in the order of
    ``rollbuf.functional.<name>``. The forward estimators read ``fields["x"]``, else the rewards.
    ``params``: ``gamma=``, ``lam=``, ``rho_bar=``, ``c_bar=``, ``pg_rho_bar=``, ``window_end=``,
    ``initial=`` as the estimator takes them."""
    try:
        fn, take, fixed, _ = ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; known: {sorted(ESTIMATORS)}") from None
    kw = {}
    for f in take:
        if f == "x":
            kw["x"] = fields["x"] if fields.get("x") is not None else fields["rewards"]
        else:
            kw[f] = fields.get(f)
    out = fn(**kw, **fixed, **params, chunk=chunk)
    return out if isinstance(out, tuple) else (out,)


# ============================================================= the loops users write (part 2)


def gae_loop(r, v, nxt, k, tr, gamma: float, lam: float):
    """The CleanRL/SB3 GAE loop, one small kernel per op per step. ``nxt`` is ``V'`` as a trainer
    builds it (the next value, the bootstrap value at truncations and the window end); ``k``,
    ``tr``: bool terminated / truncated. Returns ``(advantages, returns)``."""
    T = r.shape[-1]
    nterm = 1.0 - k.to(r.dtype)
    ndone = 1.0 - (k | tr).to(r.dtype)
    adv = torch.empty_like(r)
    last = torch.zeros_like(r[..., 0])
    for t in range(T - 1, -1, -1):
        delta = r[..., t] + gamma * nterm[..., t] * nxt[..., t] - v[..., t]
        cont = ndone[..., t] if t < T - 1 else torch.zeros_like(last)
        last = delta + gamma * lam * cont * last
        adv[..., t] = last
    return adv, adv + v


def gae_doubling(r, v, nxt, k, tr, gamma: float, lam: float):
    """GAE by a linear-space doubling scan (log2 T passes through memory), as in ``torch.compile``d
    code. Same arguments as :func:`gae_loop`."""
    nterm = 1.0 - k.to(r.dtype)
    a = r + gamma * nterm * nxt - v
    b = gamma * lam * (1.0 - (k | tr).to(r.dtype))
    b = torch.cat([b[..., :-1], torch.zeros_like(b[..., -1:])], dim=-1)
    T = r.shape[-1]
    off = 1
    while off < T:
        a = a + b * torch.nn.functional.pad(a[..., off:], (0, off))
        b = b * torch.nn.functional.pad(b[..., off:], (0, off), value=1.0)
        off *= 2
    return a, a + v


def verl_multi_turn_gae(token_level_rewards, values, response_mask, gamma, lam):
    """verl's multi-turn GAE loop as written (``verl/trainer/ppo/core_algos.py``, without the final
    ``masked_whiten``): one token per step, the response end terminal, masked tokens carried
    forward by mask arithmetic (finite inputs only). Returns ``(advantages, returns)``."""
    nextvalues = 0
    lastgaelam = 0
    advantages_reversed = []
    gen_len = token_level_rewards.shape[-1]
    for t in reversed(range(gen_len)):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values
