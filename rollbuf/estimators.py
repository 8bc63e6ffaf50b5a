"""The estimator registry: every estimator written down once.

One :class:`Estimator` entry per estimator holds its name, its family (which scan it is), the fields
it reads (with their kinds: float, flag, bootstrap column, features), its parameters with their
validation, its outputs and result type, its float64 reference function and its row of the
boundary-model table of docs/semantics.md. Everything else reads this registry: the validation
(:mod:`rollbuf.validation`), the backends' dispatch, the kernels' compile matrix, the testing kit
(:mod:`rollbuf.testing`), the benchmark grid and the generated docs table. The public wrappers in
:mod:`rollbuf.functional` and the :class:`~rollbuf.Rollout` methods are hand-written only for their
readable signatures; they call :func:`rollbuf.functional.estimate` with the entry's name.

The built-in entries live in their families' folders (``rollbuf/kernels/<family>/estimators.py``),
what an entry is made of (:class:`Estimator`, :class:`Field`, :class:`Param`, the checks, the result
types) in :mod:`rollbuf.spec`; this module gathers the entries and re-exports those names.

Adding an estimator (docs/howto/new_estimator.md): write its coefficient function (the own-step
``(α_t, β_t)`` from clean fields), its reference loop, :func:`register` an entry of family
``Family.GENERIC``, and test it against the reference. It then runs on every backend: the
coefficients elementwise in torch, the scan on the backend's affine scan (the fused kernel on the
``triton`` backend). A dedicated fused kernel is an optimisation that can come later.
"""

from __future__ import annotations

from rollbuf.boundary.coefficients import LOCAL_TERM, EstimatorSpec
from rollbuf.kernels.retrace import estimators as retrace
from rollbuf.kernels.td_lambda import estimators as td_lambda
from rollbuf.kernels.traces import estimators as traces
from rollbuf.kernels.vtrace import estimators as vtrace
from rollbuf.problem import Family
from rollbuf.spec import (
    CALL_OPTIONS,
    Estimator,
    Field,
    GAEResult,
    Param,
    SumsResult,
    TracesResult,
    VTraceResult,
    argument_list,
    boolean,
    positive,
    unit_interval,
)

__all__ = ["Field", "Param", "Estimator", "REGISTRY", "register", "unregister", "get", "GAEResult", "VTraceResult",
           "TracesResult", "SumsResult", "LOCAL_TERM", "unit_interval", "positive", "boolean"]

_BUILTIN = (*td_lambda.ESTIMATORS, *retrace.ESTIMATORS, *vtrace.ESTIMATORS, *traces.ESTIMATORS)

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
    names = argument_list(estimator)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # one keyword argument of the estimator's function would mean two things
        raise ValueError(f"estimator {estimator.name!r}: the names {twice} are used twice among its fields, "
                         f"parameters, fixed keywords and the call options {CALL_OPTIONS}")
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
