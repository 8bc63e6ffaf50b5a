"""The estimators on plain tensors: validation, then dispatch to a backend.

Every function takes the rollout fields as keyword arguments named as in docs/semantics.md, each ``[*B, T]``
(time last; ``x`` of the forward estimators may be ``[*B, T, *F]``), and ``backend=``:

* ``"reference"`` — the sequential float64 loop (:mod:`rollbuf.reference`), the oracle;
* ``"torch"`` — the vectorised scan (:mod:`rollbuf.backends.torch_backend`), the CPU path;
* ``"triton"`` — the fused kernels (:mod:`rollbuf.kernels`), CUDA tensors, or CPU tensors when
  ``TRITON_INTERPRET=1`` was set before import;
* ``"numba"`` — the compiled CPU loops (:mod:`rollbuf.backends.compiled_cpu`), values only;
* ``"auto"`` — ``"triton"`` for CUDA tensors, ``"numba"`` for CPU tensors (when numba is installed),
  ``"torch"`` otherwise.

Boundary keywords shared by the backward estimators:

* ``window_end="bootstrap"`` (default): the last step of each row (the last unmasked one with a
  ``mask``) bootstraps from ``bootstrap_values`` there unless it is terminated; a missing
  ``bootstrap_values`` is an error. ``window_end="terminal"``: the window end is terminal.
* ``carry=``: the window is followed by a known window; pass that window's carry (from
  ``return_carry=True``) and the window end is not a boundary at all.
* ``return_carry=True``: return ``(result, carry)``, the carry being the scan state at this window's
  first step, to pass as ``carry=`` to the window before it (see ``docs/semantics.md``).
"""

from __future__ import annotations

import torch

from rollbuf import backends, plans, validation
from rollbuf.estimators import GAEResult, SumsResult, TracesResult, VTraceResult
from rollbuf.problem import Family, Problem

__all__ = [
    "GAEResult",
    "VTraceResult",
    "TracesResult",
    "SumsResult",
    "gae",
    "advantages",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "eligibility_traces",
    "episodic_sums",
    "affine_scan",
    "estimate",
]

BACKENDS = backends.BACKENDS


def estimate(name, *, backend="auto", carry=None, return_carry=False, out_dtype=None,
             window_end="bootstrap", run=None, **kwargs):
    """Run the registered estimator ``name`` (:data:`rollbuf.estimators.REGISTRY`).

    ``kwargs`` hold its fields (tensors, by name) and its parameters (numbers, by name). The
    estimators below are this function with readable signatures; an estimator added with
    :func:`rollbuf.estimators.register` is called through it directly. Forward estimators take
    ``initial=`` where backward ones take ``carry=`` (given both, ``initial`` is the one read).
    ``run`` is the backend seam (:func:`rollbuf.backends.run` by default; :mod:`rollbuf.distributed`
    passes its carry exchange).

    Every call is checked: the first call of a layout (its tensors' dtypes, shapes, strides and
    devices, its options) by :func:`rollbuf.validation.prepare`, which makes the layout's plan; later
    calls of the layout by the plan's key and the per-call checks of every scalar parameter
    (:class:`rollbuf.plans.Call`). No call synchronises the host with the device
    (:class:`rollbuf.check_finite` does, by design).
    """
    kwargs.update(backend=backend, carry=carry, return_carry=return_carry, out_dtype=out_dtype,
                  window_end=window_end)
    c = plans.call_of(name)
    return c(kwargs) if run is None else c.checked(kwargs, run)


def call(function: str, arguments: dict, run=None):
    """Call the public estimator function ``function`` (``"gae"``, ``"discounted_returns"``, ...)
    with its arguments by name (as ``inspect.signature(...).bind`` gives them), through the backend
    seam ``run`` (:mod:`rollbuf.distributed` passes its carry exchange; ``None``: the plan of the
    call's layout). ``arguments`` is not modified."""
    name, kw = _arguments(function, arguments)
    c = plans.call_of(name)
    return c(kw) if run is None else c.checked(kw, run)


def _arguments(function: str, arguments: dict):
    """The registry estimator and its arguments of a public function's call; ``arguments`` is not
    modified (a changed copy is returned where it changes)."""
    if function == "discounted_returns":
        kw = dict(arguments)
        bootstrap = validation.check_bool("bootstrap", kw.pop("bootstrap", True))
        name = "discounted_returns" if bootstrap else "monte_carlo_returns"
        if not bootstrap:
            kw.pop("bootstrap_values", None)  # Monte-Carlo returns read no bootstrap value
        return name, kw
    if function == "episodic_sums":
        kw = dict(arguments)
        if kw.get("x") is None:
            if kw.get("rewards") is None:
                raise ValueError("episodic_sums needs x or rewards")
            kw["x"] = kw.pop("rewards")
        elif kw.get("rewards") is not None:  # rewards is only x's default: never dropped silently
            raise TypeError("episodic_sums() got an unexpected keyword argument 'rewards' alongside x: "
                            "rewards is the default of x; pass one of them")
        kw.pop("rewards", None)
        return function, kw
    return function, arguments


# the built-in estimators' calls, made at import: the functions below call them directly
GAE = plans.call_of("gae")
ADVANTAGES = plans.call_of("advantages")
LAMBDA_RETURNS = plans.call_of("lambda_returns")
DISCOUNTED_RETURNS = plans.call_of("discounted_returns")
VTRACE = plans.call_of("vtrace")
RETRACE = plans.call_of("retrace")
ELIGIBILITY_TRACES = plans.call_of("eligibility_traces")


def gae(gamma, lam, *, rewards, values, terminated=None, truncated=None, bootstrap_values=None,
        mask=None, window_end="bootstrap", carry=None, return_carry=False, out_dtype=None,
        backend="auto"):
    r"""Generalized advantage estimation (Schulman et al., 2016).

    ``δ_t = r_t + γ(1−k_t)V'_t − V_t``, ``A_t = δ_t + γλ(1−d_t)A_{t+1}``; returns ``A + V``.
    ``V'_t`` is ``values[t+1]`` inside an episode and ``bootstrap_values[t]`` after a truncation or
    at the window end; terminated steps (``k_t``) never bootstrap; ``d_t`` (done) stops the trace.

    Returns :class:`GAEResult` ``(advantages, returns)``; outputs are 0 at masked steps.
    """
    return GAE(dict(gamma=gamma, lam=lam, rewards=rewards, values=values, terminated=terminated,
                    truncated=truncated, bootstrap_values=bootstrap_values, mask=mask, window_end=window_end,
                    carry=carry, return_carry=return_carry, out_dtype=out_dtype, backend=backend))


def advantages(gamma, lam, **kwargs):
    """The default advantage estimator: GAE advantages (see :func:`gae`, same keyword arguments);
    only the advantages are computed and written."""
    kwargs["gamma"] = gamma
    kwargs["lam"] = lam
    return ADVANTAGES(kwargs)


def lambda_returns(gamma, lam, *, rewards, values, terminated=None, truncated=None,
                   bootstrap_values=None, mask=None, window_end="bootstrap", carry=None,
                   return_carry=False, out_dtype=None, backend="auto"):
    r"""TD(λ) returns (Sutton, 1988), the λ-return of Sutton & Barto §12.1 with episode bounds.

    ``G_t = r_t + γ(1−k_t)[(1 − λ(1−d_t))V'_t + λ(1−d_t)G_{t+1}]``. Equals GAE advantages + values.
    """
    return LAMBDA_RETURNS(dict(gamma=gamma, lam=lam, rewards=rewards, values=values,
                    terminated=terminated, truncated=truncated, bootstrap_values=bootstrap_values, mask=mask,
                    window_end=window_end, carry=carry, return_carry=return_carry, out_dtype=out_dtype,
                    backend=backend))


def discounted_returns(gamma, *, rewards, values=None, terminated=None, truncated=None,
                       bootstrap_values=None, mask=None, bootstrap=True, window_end="bootstrap",
                       carry=None, return_carry=False, out_dtype=None, backend="auto"):
    r"""Discounted returns.

    ``bootstrap=True``: ``G_t = r_t + γ(1−k_t)[d_t V'_t + (1−d_t)G_{t+1}]`` (= TD(1)): truncations
    and the window end bootstrap from ``bootstrap_values``; ``values`` is not read.
    ``bootstrap=False`` (Monte Carlo): ``G_t = r_t + γ(1−d_t)G_{t+1}``, ``G`` past the window is 0,
    truncations cut without bootstrap; neither ``values`` nor ``bootstrap_values`` is needed.
    """
    if bootstrap is True:
        return DISCOUNTED_RETURNS(dict(gamma=gamma, rewards=rewards, values=values, terminated=terminated,
                                       truncated=truncated, bootstrap_values=bootstrap_values, mask=mask,
                                       window_end=window_end, carry=carry, return_carry=return_carry,
                                       out_dtype=out_dtype, backend=backend))
    return call("discounted_returns", dict(gamma=gamma, rewards=rewards, values=values, terminated=terminated,
                truncated=truncated, bootstrap_values=bootstrap_values, mask=mask, bootstrap=bootstrap,
                window_end=window_end, carry=carry, return_carry=return_carry, out_dtype=out_dtype,
                backend=backend))


def vtrace(target_log_probs, gamma, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None, lam=1.0, *, rewards,
           values, log_probs, terminated=None, truncated=None, bootstrap_values=None, mask=None,
           window_end="bootstrap", carry=None, return_carry=False, out_dtype=None, backend="auto"):
    r"""V-trace targets and policy-gradient advantages (Espeholt et al., 2018, IMPALA).

    ``ρ_t = min(ρ̄, π/μ)``, ``c_t = λ·min(c̄, π/μ)``;
    ``vs_t − V_t = ρ_t(r_t + γ(1−k_t)V'_t − V_t) + γ(1−d_t)c_t(vs_{t+1} − V_{t+1})``;
    ``pg_t = min(ρ̄_pg, π/μ)(r_t + γ(1−k_t)q_t − V_t)`` with ``q_t = vs_{t+1}`` inside an episode and
    ``V'_t`` at a boundary. ``log_probs`` is the behaviour policy μ that acted. As in rlax, λ scales
    the traces ``c_t`` only. The carry is ``[*B, 2]``: ``(vs_0 − V_0, V_0)`` of the next window.

    Returns :class:`VTraceResult` ``(vs, pg_advantages)``.
    """
    return VTRACE(dict(target_log_probs=target_log_probs, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar,
                    pg_rho_bar=pg_rho_bar, lam=lam, rewards=rewards, values=values, log_probs=log_probs,
                    terminated=terminated, truncated=truncated, bootstrap_values=bootstrap_values, mask=mask,
                    window_end=window_end, carry=carry, return_carry=return_carry, out_dtype=out_dtype,
                    backend=backend))


def retrace(q_values, target_log_probs, gamma, lam=1.0, c_bar=1.0, *, rewards, values, log_probs,
            terminated=None, truncated=None, bootstrap_values=None, mask=None,
            window_end="bootstrap", carry=None, return_carry=False, out_dtype=None, backend="auto"):
    r"""Retrace(λ) Q targets (Munos et al., 2016).

    ``Q^ret_t = r_t + γ(1−k_t)[V'_t + (1−d_t)c_{t+1}(Q^ret_{t+1} − q_{t+1})]`` with
    ``c_t = λ·min(c̄, π/μ)``, ``q_t = Q(s_t, a_t)`` (``q_values``) and ``values`` = ``E_{a~π}Q(s_t, a)``.
    Note the trace of the *next* step, ``c_{t+1}``, as in the paper and rlax.
    """
    return RETRACE(dict(q_values=q_values, target_log_probs=target_log_probs, gamma=gamma, lam=lam,
                    c_bar=c_bar, rewards=rewards, values=values, log_probs=log_probs, terminated=terminated,
                    truncated=truncated, bootstrap_values=bootstrap_values, mask=mask, window_end=window_end,
                    carry=carry, return_carry=return_carry, out_dtype=out_dtype, backend=backend))


def eligibility_traces(x, gamma, lam, initial=None, *, terminated=None, truncated=None, mask=None,
                       out_dtype=None, backend="auto"):
    r"""Accumulating eligibility traces, forward in time (Sutton & Barto §12.1).

    ``e_t = x_t + γλ(1−d_{t−1})e_{t−1}``, ``e_{−1} = initial`` (default 0); ``x`` is ``[*B, T]`` or
    ``[*B, T, *F]`` (e.g. per-parameter gradients); flags are ``[*B, T]``. ``final`` is
    ``(1−d_{T−1})·e_{T−1}``: pass it as the next window's ``initial``.
    """
    return ELIGIBILITY_TRACES(dict(x=x, gamma=gamma, lam=lam, initial=initial, terminated=terminated,
                    truncated=truncated, mask=mask, out_dtype=out_dtype, backend=backend))


def episodic_sums(x=None, initial=None, *, rewards=None, terminated=None, truncated=None,
                  mask=None, out_dtype=None, backend="auto"):
    r"""Running sums within episodes, forward in time: ``S_t = x_t + (1−d_{t−1})S_{t−1}``.

    ``x`` defaults to ``rewards`` (the running undiscounted episode return); passing both is a
    ``TypeError`` (``rewards`` would be ignored). ``final`` is
    ``(1−d_{T−1})·S_{T−1}``: the unfinished episodes' sums, to pass as the next ``initial``.
    """
    return call("episodic_sums", dict(x=x, initial=initial, rewards=rewards, terminated=terminated,
                    truncated=truncated, mask=mask, out_dtype=out_dtype, backend=backend))


def affine_scan(alpha, beta, reverse=False, initial=None, *, backend="auto"):
    r"""The generic primitive: ``y_t = α_t + β_t·y_{t−1}`` (or ``y_{t+1}`` with ``reverse=True``).

    ``alpha`` and ``beta`` are ``[*B, T]``; ``initial`` (``[*B]``, default 0) is ``y`` just outside
    the row (``y_{−1}``, or ``y_T`` when reversed). Returns ``y`` ``[*B, T]`` in the promoted dtype
    of ``alpha`` and ``beta``; the scan accumulates in float64 when any of ``alpha``, ``beta``,
    ``initial`` is float64 (else float32).
    """
    validation.check_bool("reverse", reverse)
    alpha = validation.main_tensor("alpha", alpha)
    c = validation.Fields(tuple(alpha.shape), alpha.device)
    c.add_float("alpha", alpha)
    c.add_float("beta", beta)
    B, T = c.shape[:-1], c.shape[-1]
    if initial is not None:
        validation.check_tensor("initial", initial, validation.FLOATS, "a floating-point tensor")
        if tuple(initial.shape) != tuple(B):
            raise ValueError(f"initial must have shape {tuple(B)}, got {tuple(initial.shape)}")
        if initial.device != c.device:
            raise ValueError(f"initial is on {initial.device} but alpha is on {c.device}")
    be = backends.resolve(backend, c.device)
    compute, out = c.dtypes(None, initial)  # a float64 initial makes the scan float64
    N = 1
    for b in B:
        N *= b
    init = torch.zeros(N, dtype=compute, device=c.device) if initial is None else initial.reshape(N)
    p = Problem(family=Family.AFFINE, outputs=("y", "final"),
                fields={"alpha": alpha.reshape(N, T), "beta": beta.reshape(N, T)},
                carry=init, compute_dtype=compute, out_dtype=compute, reverse=reverse)
    y = backends.run(p, be)[0][0]
    return y.reshape(*B, T).to(out)
