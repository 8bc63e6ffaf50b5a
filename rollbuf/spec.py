"""What an estimator's registry entry is made of: :class:`Estimator`, its :class:`Field` and :class:`Param`
entries, the parameter checks, the result types; the fields and parameters the built-in entries share. The
registry itself is :mod:`rollbuf.estimators`; the built-in entries are in their families' folders
(``rollbuf/kernels/<family>/estimators.py``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import attrs
import torch

from rollbuf.boundary.coefficients import EstimatorSpec
from rollbuf.problem import Family, Problem

# result types


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


# parameter checks: each returns the validated value or raises naming the parameter


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
CALL_OPTIONS = ("backend", "carry", "return_carry", "out_dtype", "window_end")


def argument_list(e) -> list[str]:
    """The keyword argument names a call of the estimator ``e`` accepts, one per field, parameter,
    fixed keyword and call option (a name given twice is an entry :func:`rollbuf.estimators.register`
    refuses)."""
    return [*(f.name for f in e.fields), *(p.name for p in e.params), *e.fixed, *CALL_OPTIONS,
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
        default=attrs.Factory(lambda e: frozenset(argument_list(e)), takes_self=True))

    @property
    def function_name(self) -> str:
        return self.function or self.name

    def field(self, name: str) -> Field | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None


# what the built-in entries share

FLAGS = (Field("terminated", "flag", False), Field("truncated", "flag", False), Field("mask", "flag", False))
#: the fields of the backward estimators, in the reference loops' order
BACKWARD = (Field("rewards"), Field("values"), *FLAGS[:2], Field("bootstrap_values", "bootstrap", False), FLAGS[2])
POLICY = (Field("log_probs"), Field("target_log_probs"))
GAMMA = Param("gamma", unit_interval)
LAM = Param("lam", unit_interval)


def backward_ref(fn):
    """A reference loop of the backward estimators, called with the flattened fields."""

    def call(f, p):
        out = fn(f, p)
        return out if isinstance(out, tuple) else (out,)

    return call


def base(f: Mapping) -> tuple[Any, Any, Any, Any, Any, Any]:
    """The six fields of :data:`BACKWARD`, in the reference loops' order."""
    return (f["rewards"], f.get("values"), f.get("terminated"), f.get("truncated"),
            f.get("bootstrap_values"), f.get("mask"))
