"""The estimator registry: every estimator written down once.

One :class:`Estimator` entry per estimator holds its name, its family (which scan it is), the fields
it reads (with their kinds: float, flag, bootstrap column, features), its parameters with their
validation, its outputs and result type, its float64 reference function and its row of the
boundary-model table of docs/semantics.md. Everything else reads this registry: the validation
(:mod:`rollbuf.validation`), the backends' dispatch, the kernels' compile matrix, the testing kit
(:mod:`rollbuf.testing`), the benchmark grid and the generated docs table. The public wrappers in
:mod:`rollbuf.functional` and the :class:`~rollbuf.Rollout` methods are hand-written only for their
readable signatures; they call :func:`rollbuf.functional.estimate` with the entry's name.

Adding an estimator (docs/howto/new_estimator.md): write its coefficient function (the own-step
``(α_t, β_t)`` from clean fields), its reference loop, :func:`register` an entry of family
``Family.GENERIC``, and test it against the reference. It then runs on every backend: the
coefficients elementwise in torch, the scan on the backend's affine scan (the fused kernel on the
``triton`` backend). A dedicated fused kernel is an optimisation that can come later.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import attrs
import torch

from rollbuf import reference as ref
from rollbuf.boundary.coefficients import LOCAL_TERM, EstimatorSpec
from rollbuf.problem import Family, Problem

__all__ = [
    "Field",
    "Param",
    "Estimator",
    "REGISTRY",
    "register",
    "unregister",
    "get",
    "GAEResult",
    "VTraceResult",
    "TracesResult",
    "SumsResult",
    "LOCAL_TERM",
    "unit_interval",
    "positive",
    "boolean",
]


# ---------------------------------------------------------------------------------------------
# result types
# ---------------------------------------------------------------------------------------------


class GAEResult(NamedTuple):
    advantages: torch.Tensor
    returns: torch.Tensor


class VTraceResult(NamedTuple):
    vs: torch.Tensor
    pg_advantages: torch.Tensor


class TracesResult(NamedTuple):
    traces: torch.Tensor
    final: torch.Tensor


class SumsResult(NamedTuple):
    sums: torch.Tensor
    final: torch.Tensor


# ---------------------------------------------------------------------------------------------
# parameter checks: each returns the validated value or raises naming the parameter
# ---------------------------------------------------------------------------------------------


def _real(name, v):
    """A real number as a float: a Python ``int``/``float`` or a NumPy real scalar (``np.float32``,
    ``np.int64``, ...); never a ``bool`` (nor NumPy's) and never a tensor (reading one is a device sync)."""
    t = type(v)
    if t is float or t is int:  # the common case, without the ABC check below
        return float(v)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    return float(v)


def unit_interval(name: str, v) -> float:
    """A real number in ``[0, 1]`` (γ, λ)."""
    x = v if type(v) is float else _real(name, v)
    if not 0.0 <= x <= 1.0:  # (NaN included)
        raise ValueError(f"{name} must lie in [0, 1], got {v}")
    return x


def positive(name: str, v) -> float:
    """A real number ``> 0`` (clipping thresholds ρ̄, c̄)."""
    x = v if type(v) is float else _real(name, v)
    if not x > 0.0:
        raise ValueError(f"{name} must be > 0, got {v}")
    return x


def boolean(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    return v


_REQUIRED = object()


@attrs.frozen
class Param:
    """A scalar parameter: its name, its check, its default (none: required)."""

    name: str
    check: Callable[[str, Any], Any]
    default: Any = _REQUIRED

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


@attrs.frozen
class Field:
    """A per-step input.

    ``kind``: ``"float"`` ``[*B, T]`` floating point; ``"flag"`` ``[*B, T]`` bool, uint8 or 0/1
    float; ``"bootstrap"`` ``[*B, T]`` or ``[*B]`` (the window-end column only), read only where the
    window rules say (:mod:`rollbuf.windows`); ``"features"`` ``[*B, T, *F]`` floating point.
    ``read=False``: accepted and validated, not read (``values`` of discounted returns).
    """

    name: str
    kind: str = "float"
    required: bool = True
    read: bool = True


# the keyword arguments every estimator function takes besides its fields and parameters (a
# forward estimator also takes ``initial``)
_CALL_OPTIONS = ("backend", "carry", "return_carry", "out_dtype", "window_end")


def _argument_list(e) -> list[str]:
    """The keyword argument names a call of the estimator ``e`` accepts, one per field, parameter,
    fixed keyword and call option (a name given twice is an entry :func:`register` refuses)."""
    return [*(f.name for f in e.fields), *(p.name for p in e.params), *e.fixed, *_CALL_OPTIONS,
            *(("initial",) if e.direction == "forward" else ())]


@attrs.frozen
class Estimator:
    """One estimator. ``problem_params(params)`` maps the validated parameters to :class:`Problem`
    keyword arguments; ``reference(fields, problem)`` is the float64 loop (``fields`` flattened to
    ``[N, T]``); ``docs`` its row of the boundary-model table.

    ``Family.GENERIC`` entries also give ``coefficients(fields, params) -> (α, β)`` (clean fields:
    flags as 0/1 in the compute dtype, masked steps zero; the runner makes masked steps the scan
    identity), optionally ``outputs_from_state(fields, params, state_next, state) -> tuple`` (default:
    the inclusive state ``state``) and ``window_end_carry(fields, params) -> [N]`` (default: 0)."""

    name: str
    family: Family
    direction: str  # "backward" | "forward"
    fields: tuple[Field, ...]
    params: tuple[Param, ...]
    outputs: tuple[str, ...]
    result: type | None  # a NamedTuple of the outputs; None: one tensor
    reference: Callable[[Mapping, Problem], tuple]
    docs: EstimatorSpec | None = None
    function: str | None = None  # the rollbuf.functional function (default: name)
    # keyword arguments implied by this entry (an entry is not changed once made: attrs.evolve makes
    # a changed copy, and recomputes the names derived below)
    fixed: Mapping[str, Any] = attrs.field(factory=dict)
    problem_params: Callable[[Mapping], Mapping] = attrs.field(default=dict)
    chains: bool = True  # takes carry= / return_carry= (backward) or initial= (forward)
    coefficients: Callable | None = None
    outputs_from_state: Callable | None = None
    window_end_carry: Callable | None = None
    # derived from the above when the entry is made (attrs.evolve makes them anew)
    field_names: tuple[str, ...] = attrs.field(
        init=False, eq=False, repr=False,
        default=attrs.Factory(lambda e: tuple(f.name for f in e.fields), takes_self=True))
    argument_names: frozenset[str] = attrs.field(
        init=False, eq=False, repr=False,
        default=attrs.Factory(lambda e: frozenset(_argument_list(e)), takes_self=True))

    @property
    def function_name(self) -> str:
        return self.function or self.name

    def field(self, name: str) -> Field | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None


# ---------------------------------------------------------------------------------------------
# the built-in estimators
# ---------------------------------------------------------------------------------------------

_FLAGS = (Field("terminated", "flag", False), Field("truncated", "flag", False), Field("mask", "flag", False))
_BACKWARD = (Field("rewards"), Field("values"), *_FLAGS[:2], Field("bootstrap_values", "bootstrap", False),
             _FLAGS[2])
_POLICY = (Field("log_probs"), Field("target_log_probs"))
_GAMMA = Param("gamma", unit_interval)
_LAM = Param("lam", unit_interval)


def _backward_ref(fn):
    """A reference loop of the backward estimators, called with the flattened fields."""

    def call(f, p):
        out = fn(f, p)
        return out if isinstance(out, tuple) else (out,)

    return call


def _base(f: Mapping) -> tuple[Any, Any, Any, Any, Any, Any]:  # the six fields, in the reference's order
    return (f["rewards"], f.get("values"), f.get("terminated"), f.get("truncated"),
            f.get("bootstrap_values"), f.get("mask"))


def _gae_ref(f, p):
    return ref.gae(*_base(f), p.gamma, p.lam, p.window_end)


def _vtrace_params(params):
    out = dict(params)
    if out.get("pg_rho_bar") is None:
        out["pg_rho_bar"] = out["rho_bar"]
    return out


def _pg_rho_bar(name, v):
    return None if v is None else positive(name, v)


_DOCS_ROW = {  # the boundary-model table of docs/semantics.md, one row per estimator
    "gae": EstimatorSpec(
        "gae", "backward", "Z_t = (1−λ)V_t + λG_t", "(1−λ)V_t + λ·local_t", "γλ·nd_t",
        "G_t = local_t + γ·nd_t·Z_{t+1}; A_t = G_t − V_t",
        "scan carry Z_T = V(s_T) (0 if window_end='terminal')",
        "Z_0 = V_0 + λA_0 of the next window", ("advantages", "returns"),
    ),
    "lambda_returns": EstimatorSpec(
        "lambda_returns", "backward", "Z_t = (1−λ)V_t + λG_t", "(1−λ)V_t + λ·local_t",
        "γλ·nd_t", "G_t = local_t + γ·nd_t·Z_{t+1}",
        "scan carry Z_T = V(s_T) (0 if window_end='terminal')",
        "Z_0 = (1−λ)V_0 + λG_0 of the next window", ("returns",),
    ),
    "discounted_returns": EstimatorSpec(
        "discounted_returns", "backward", "Z_t = G_t (TD(1))", "local_t", "γ·nd_t",
        "G_t = local_t + γ·nd_t·Z_{t+1}",
        "scan carry Z_T = V(s_T) (0 if window_end='terminal')", "Z_0 = G_0 of the next window",
        ("returns",),
    ),
    "monte_carlo_returns": EstimatorSpec(
        "monte_carlo_returns", "backward", "Z_t = G_t", "r_t", "γ·nd_t",
        "G_t = r_t + γ·nd_t·Z_{t+1} (truncation cuts, no bootstrap)",
        "scan carry Z_T = 0 (G past the window is 0)", "Z_0 = G_0 of the next window",
        ("returns",),
    ),
    "retrace": EstimatorSpec(
        "retrace", "backward", "W_t = V_t + c_t(Q^ret_t − q_t)", "V_t + c_t(local_t − q_t)",
        "γ·nd_t·c_t", "Q^ret_t = local_t + γ·nd_t·W_{t+1}",
        "scan carry W_T = V(s_T) (0 if window_end='terminal')",
        "W_0 = V_0 + c_0(Q^ret_0 − q_0) of the next window", ("q_targets",),
    ),
    "vtrace": EstimatorSpec(
        "vtrace", "backward", "(u_t, V_t), u_t = vs_t − V_t",
        "u: ρ_t(local_t − V_t); V: V_t",
        "u ← γ·nd_t·(c_t·u + ρ_t·V); V ← 0·V",
        "vs_t = V_t + ρ_t(local_t − V_t) + γ·nd_t(ρ_t·V_{t+1} + c_t·u_{t+1}); "
        "pg_t = ρpg_t(local_t + γ·nd_t(V_{t+1} + u_{t+1}) − V_t)",
        "scan carry (u_T, V_T) = (0, V(s_T)) ((0, 0) if window_end='terminal')",
        "(u_0, V_0) of the next window", ("vs", "pg_advantages"),
    ),
    "eligibility_traces": EstimatorSpec(
        "eligibility_traces", "forward", "F_t = nd_t·e_t", "nd_t·x_t", "γλ·nd_t",
        "e_t = x_t + γλ·F_{t−1}", "none (forward)", "F_{T−1} = final → next window's initial",
        ("traces", "final"),
    ),
    "episodic_sums": EstimatorSpec(
        "episodic_sums", "forward", "F_t = nd_t·S_t", "nd_t·x_t", "nd_t",
        "S_t = x_t + F_{t−1}", "none (forward)", "F_{T−1} = final → next window's initial",
        ("sums", "final"),
    ),
}

_BUILTIN = (
    Estimator(
        "gae", Family.TD_LAMBDA, "backward", _BACKWARD, (_GAMMA, _LAM), ("advantages", "returns"),
        GAEResult, _backward_ref(_gae_ref), _DOCS_ROW["gae"],
    ),
    Estimator(
        "advantages", Family.TD_LAMBDA, "backward", _BACKWARD, (_GAMMA, _LAM), ("advantages",), None,
        _backward_ref(lambda f, p: _gae_ref(f, p)[0]),
    ),
    Estimator(
        "lambda_returns", Family.TD_LAMBDA, "backward", _BACKWARD, (_GAMMA, _LAM), ("returns",), None,
        _backward_ref(lambda f, p: ref.lambda_returns(*_base(f), p.gamma, p.lam, p.window_end)),
        _DOCS_ROW["lambda_returns"],
    ),
    Estimator(
        "discounted_returns", Family.TD_LAMBDA, "backward",
        (Field("rewards"), Field("values", required=False, read=False), *_BACKWARD[2:]),
        (_GAMMA,), ("returns",), None,
        _backward_ref(lambda f, p: ref.discounted_returns(*_base(f), p.gamma, True, p.window_end)),
        _DOCS_ROW["discounted_returns"], fixed={"bootstrap": True},
        problem_params=lambda params: dict(params, lam=1.0),
    ),
    Estimator(
        "monte_carlo_returns", Family.TD_LAMBDA, "backward",
        (Field("rewards"), Field("values", required=False, read=False), *_FLAGS[:2],
         Field("bootstrap_values", "bootstrap", False, read=False), _FLAGS[2]),
        (_GAMMA,), ("returns",), None,
        _backward_ref(lambda f, p: ref.discounted_returns(f["rewards"], None, f.get("terminated"),
                                                          f.get("truncated"), None, f.get("mask"),
                                                          p.gamma, False, "terminal")),
        _DOCS_ROW["monte_carlo_returns"], function="discounted_returns", fixed={"bootstrap": False},
        problem_params=lambda params: dict(params, lam=1.0, no_bootstrap=True, window_end="terminal"),
    ),
    Estimator(
        "retrace", Family.RETRACE, "backward", _BACKWARD + _POLICY + (Field("q_values"),),
        (_GAMMA, Param("lam", unit_interval, 1.0), Param("c_bar", positive, 1.0)), ("q_targets",), None,
        _backward_ref(lambda f, p: ref.retrace(*_base(f), f["log_probs"], f["target_log_probs"],
                                               f["q_values"], p.gamma, p.lam, p.c_bar, p.window_end)),
        _DOCS_ROW["retrace"],
    ),
    Estimator(
        "vtrace", Family.VTRACE, "backward", _BACKWARD + _POLICY,
        (_GAMMA, Param("rho_bar", positive, 1.0), Param("c_bar", positive, 1.0),
         Param("pg_rho_bar", _pg_rho_bar, None), Param("lam", unit_interval, 1.0)),
        ("vs", "pg_advantages"), VTraceResult,
        _backward_ref(lambda f, p: ref.vtrace(*_base(f), f["log_probs"], f["target_log_probs"], p.gamma,
                                              p.rho_bar, p.c_bar, p.pg_rho_bar, p.lam, p.window_end)),
        _DOCS_ROW["vtrace"], problem_params=_vtrace_params,
    ),
    Estimator(
        "eligibility_traces", Family.FORWARD, "forward", (Field("x", "features"), *_FLAGS), (_GAMMA, _LAM),
        ("traces", "final"), TracesResult,
        lambda f, p: ref.eligibility_traces(f["x"], f.get("terminated"), f.get("truncated"), f.get("mask"),
                                            p.gamma, p.lam, p.carry),
        _DOCS_ROW["eligibility_traces"],
        problem_params=lambda params: dict(params, decay=params["gamma"] * params["lam"]),
    ),
    Estimator(
        "episodic_sums", Family.FORWARD, "forward", (Field("x", "features"), *_FLAGS), (),
        ("sums", "final"), SumsResult,
        lambda f, p: ref.episodic_sums(f["x"], f.get("terminated"), f.get("truncated"), f.get("mask"),
                                       p.carry),
        _DOCS_ROW["episodic_sums"], problem_params=lambda params: dict(params, decay=1.0),
    ),
)

#: name -> :class:`Estimator`, in the order of the docs table.
REGISTRY: dict[str, Estimator] = {e.name: e for e in _BUILTIN}


def get(name: str) -> Estimator:
    """The registry entry ``name`` (a clear error naming the known ones otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; known: {sorted(REGISTRY)}") from None


def register(estimator: Estimator) -> Estimator:
    """Add an estimator to the registry (a ``Family.GENERIC`` entry needs ``coefficients``)."""
    if estimator.name in REGISTRY:
        raise ValueError(f"an estimator named {estimator.name!r} is already registered")
    if estimator.family == Family.GENERIC and estimator.coefficients is None:
        raise ValueError(f"estimator {estimator.name!r}: a Family.GENERIC entry needs a coefficients function")
    if estimator.direction not in ("backward", "forward"):
        raise ValueError(f"estimator {estimator.name!r}: direction must be 'backward' or 'forward'")
    names = _argument_list(estimator)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # one keyword argument of the estimator's function would mean two things
        raise ValueError(f"estimator {estimator.name!r}: the names {twice} are used twice among its fields, "
                         f"parameters, fixed keywords and the call options {_CALL_OPTIONS}")
    REGISTRY[estimator.name] = estimator
    return estimator


def unregister(name: str) -> None:
    """Remove a registered estimator (built-in ones stay)."""
    if name in {e.name for e in _BUILTIN}:
        raise ValueError(f"{name!r} is a built-in estimator")
    REGISTRY.pop(name, None)


def docs_rows() -> list[EstimatorSpec]:
    """The rows of the boundary-model table, in registry order (entries without one skipped)."""
    return [e.docs for e in REGISTRY.values() if e.docs is not None]
