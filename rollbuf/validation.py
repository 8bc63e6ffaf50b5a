"""Validation: a call's keyword arguments, checked against its registry entry, become a
:class:`~rollbuf.problem.Problem`; the backend's flat outputs get the caller's shape and dtype back.

Every check names the argument and what was expected; nothing is broadcast, coerced or dropped.
What each estimator takes comes from its :class:`~rollbuf.estimators.Estimator` entry (field kinds,
parameter checks); the window rules used here (which truncations a ``[*B]`` bootstrap column can
serve) come from :mod:`rollbuf.windows`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import torch

from rollbuf import windows
from rollbuf.estimators import Estimator
from rollbuf.problem import Family, Problem

__all__ = ["FLOATS", "FLAGS", "WINDOW_ENDS", "Fields", "check_tensor", "check_bool", "main_tensor", "prepare",
           "finish", "recheck", "chain_choice", "check_window_end_column", "check_finite", "checking_finite",
           "first_non_finite"]

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLAGS = (torch.bool, torch.uint8) + FLOATS
_FLOAT_TEXT = "a floating-point tensor (float16, bfloat16, float32, float64)"
_FLAG_TEXT = "a bool, uint8 or 0/1 floating-point tensor"
WINDOW_ENDS = ("bootstrap", "terminal")


# ---------------------------------------------------------------------------------------------
# the debug switch: every input an estimator reads must be finite
# ---------------------------------------------------------------------------------------------

_FINITE = {"on": os.environ.get("ROLLBUF_CHECK_FINITE", "") not in ("", "0")}


class check_finite:  # noqa: N801 (used like a function)
    """Switch the non-finite input check on (or off): ``rollbuf.check_finite()`` for the rest of the
    process, ``with rollbuf.check_finite(): ...`` for a block (the previous setting comes back on
    exit); ``ROLLBUF_CHECK_FINITE=1`` in the environment switches it on at import. The switch is
    process-wide: it applies to every thread while it is on (a debugging aid, not a per-call option).

    While on, every estimator call reads its inputs back (one device sync per call) and raises a
    ``ValueError`` naming the first non-finite value it *reads* — field, row (its ``[*B]`` index)
    and step — so that the NaN that turned a row of advantages into NaN can be found. Values the
    call does not read (masked steps, ``bootstrap_values`` where no truncation or window end reads
    it) are not checked: they cannot reach an output.
    """

    def __init__(self, enabled: bool = True):
        check_bool("enabled", enabled)
        self.previous = _FINITE["on"]
        _FINITE["on"] = enabled

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _FINITE["on"] = self.previous
        return False


def checking_finite() -> bool:
    """Whether the non-finite input check is on."""
    return _FINITE["on"]


def first_non_finite(p: Problem):
    """``(field, row, step, value)`` of the first non-finite value ``p`` reads (row and step in the
    flattened ``[N, T]``; step ``None`` for a per-row input), or ``None``. One device sync."""
    f = p.fields
    m = p.flag("mask")
    for name, x in f.items():
        if x is None or not x.is_floating_point() or name in ("bootstrap_values",) or _is_flag(p, name):
            continue
        bad = ~torch.isfinite(x)
        if x.dim() > 2:  # features: any feature of the step
            bad = bad.reshape(*bad.shape[:2], -1).any(-1)
        if m is not None:
            bad = bad & m
        hit = _first(bad)
        if hit is not None:
            return name, hit[0], hit[1], float(x[hit[0], hit[1]].reshape(-1)[0])
    bv = f.get("bootstrap_values")
    if bv is not None and not p.no_bootstrap:
        N, T = p.num_rows, p.num_steps
        read = windows.bootstrap_read(f.get("terminated"), f.get("truncated"), f.get("mask"))
        read = torch.zeros(N, T, dtype=torch.bool, device=bv.device) if read is None else read
        end_read = p.carry is None and p.window_end == "bootstrap"
        if bv.dim() == 2:
            if end_read and T:
                j = windows.window_end_index(f.get("mask"), (N, T), bv.device)
                j = torch.where(j < 0, T - 1, j)
                read = read.scatter(-1, j.unsqueeze(-1), True)
            k = p.flag("terminated")
            if k is not None:  # a terminated step reads no value; a flag at a masked step is ignored
                m_ = p.flag("mask")
                read = read & ~(k if m_ is None else k & m_)
            hit = _first(read & ~torch.isfinite(bv))
            if hit is not None:
                return "bootstrap_values", hit[0], hit[1], float(bv[hit[0], hit[1]])
        elif end_read or read.any():
            k_end = windows.window_end_value(torch.ones(N, device=bv.device), f.get("terminated"),
                                             f.get("mask"), (N, T)) == 0
            hit = _first((~torch.isfinite(bv) & ~k_end).unsqueeze(-1))
            if hit is not None:
                return "bootstrap_values", hit[0], None, float(bv[hit[0]])
    if p.carry is not None:
        bad = ~torch.isfinite(p.carry).reshape(p.carry.shape[0], -1).any(-1, keepdim=True)
        hit = _first(bad)
        if hit is not None:
            return ("initial" if p.family == Family.FORWARD else "carry"), hit[0], None, float("nan")
    return None


def _is_flag(p: Problem, name) -> bool:
    if p.estimator is not None:
        fld = p.estimator.field(name)
        return fld is not None and fld.kind == "flag"
    return name in ("terminated", "truncated", "mask")


def _first(bad: torch.Tensor):
    if not bool(bad.any()):
        return None
    flat = int(torch.nonzero(bad.reshape(-1))[0])
    return flat // bad.shape[-1], flat % bad.shape[-1]


def _raise_non_finite(p: Problem, hit):
    name, row, step, value = hit
    B = p.batch_shape or (p.num_rows,)
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(row), B)) if B else ()
    where = f"row {index[0] if len(index) == 1 else index}" + ("" if step is None else f", step {step}")
    raise ValueError(
        f"{name} is not finite at {where} (value {value}), and this call reads it "
        "(rollbuf.check_finite is on: it names the first non-finite input read)"
    )


def check_tensor(name, x, kinds, kind_text):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in kinds:
        raise TypeError(f"{name} must be {kind_text}, got dtype {x.dtype}")
    return x


def _same(name, x, shape, device, reference=None):
    if x.shape != shape:  # torch.Size against a tuple: element-wise
        whose = f": that of {reference}" if reference else ""
        raise ValueError(
            f"{name} must have shape {tuple(shape)} (the shape of the rollout, [*batch, T]{whose}), "
            f"got {tuple(x.shape)}; nothing is broadcast"
        )
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the rollout is on {device}")


def _layout(named):
    """The ``[*B, T]`` of a call and the fields that have it: of ``named`` (``(name, shape)`` of the
    per-step tensors, in the signature's order), the shape most of them have, ties going to the
    earliest (the first field of the signature is the layout reference). So a field that disagrees
    with the others is the one named, whichever it is. Returns ``(shape, names)``."""
    counts: dict = {}
    for _, shape in named:
        counts[shape] = counts.get(shape, 0) + 1
    best = max(counts.values())
    shape = next(s for _, s in named if counts[s] == best)
    return shape, [n for n, s in named if s == shape]


def check_bool(name, v):
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    return v


def chain_choice(name, v, options):
    if v not in options:
        raise ValueError(f"{name} must be one of {options}, got {v!r}")
    return v


class Fields:
    """The checked fields of one call (``shape`` = ``[*B, T]``)."""

    def __init__(self, shape, device, reference=None):
        self.shape, self.device = shape, device
        self.reference = reference  # the fields that fix the shape, for the error messages
        self.fields: dict[str, torch.Tensor | None] = {}
        self.floats: list[torch.Tensor] = []

    def add_float(self, name, x, required=True):
        if x is None:
            if required:
                raise ValueError(f"{name} is required by this call")
            self.fields[name] = None
            return
        check_tensor(name, x, FLOATS, _FLOAT_TEXT)
        _same(name, x, self.shape, self.device, self.reference)
        self.floats.append(x)
        self.fields[name] = x

    def add_flag(self, name, x):
        if x is not None:
            check_tensor(name, x, FLAGS, _FLAG_TEXT)
            _same(name, x, self.shape, self.device, self.reference)
        self.fields[name] = x

    def add_bootstrap(self, bv, window_end, needed: bool):
        """``bootstrap_values`` is ``[*B, T]`` or ``[*B]`` (window-end column only)."""
        tr = self.fields.get("truncated")
        if bv is None:
            if needed and window_end == "bootstrap":
                raise ValueError(
                    "bootstrap_values is required: the window end bootstraps from V(s_T). Pass "
                    "bootstrap_values ([*B, T], or [*B] for the window-end column only), call "
                    "Rollout.bootstrap(last_values), chain with carry=, or pass "
                    "window_end='terminal' if the window really ends in terminal states"
                )
            if tr is not None:
                raise ValueError(
                    "bootstrap_values is required when truncated is given: a truncated step "
                    "bootstraps from bootstrap_values[t] = V(s'_t)"
                )
            self.fields["bootstrap_values"] = None
            return
        check_tensor("bootstrap_values", bv, FLOATS, "a floating-point tensor")
        B = self.shape[:-1]
        if tuple(bv.shape) == tuple(self.shape):
            pass
        elif tuple(bv.shape) == tuple(B):
            if tr is not None and not torch.compiler.is_compiling():
                self.check_window_end_column()
        else:
            raise ValueError(
                f"bootstrap_values must have shape {tuple(self.shape)} or {tuple(B)} "
                f"(window-end column only), got {tuple(bv.shape)}"
            )
        if bv.device != self.device:
            raise ValueError(f"bootstrap_values is on {bv.device} but the rollout is on {self.device}")
        self.floats.append(bv)
        self.fields["bootstrap_values"] = bv

    def check_window_end_column(self):
        """A ``[*B]`` bootstrap column serves the window end only: no truncation before it."""
        f = self.fields
        check_window_end_column(f.get("terminated"), f["truncated"], f.get("mask"), self.device)

    def dtypes(self, out_dtype, carry=None):
        """``(compute dtype, output dtype)``: float64 accumulation when any floating input is float64,
        the carry (``initial``) included; the outputs in ``out_dtype``, else the fields' promoted
        dtype (the carry is always in an accumulation dtype, so it does not widen the outputs)."""
        compute = torch.float64 if any(x.dtype == torch.float64 for x in self.floats) or (
            carry is not None and carry.dtype == torch.float64) else torch.float32
        if out_dtype is None:
            out = self.floats[0].dtype
            for x in self.floats[1:]:
                out = torch.promote_types(out, x.dtype)
        else:
            if out_dtype not in FLOATS:
                raise TypeError(f"out_dtype must be a floating-point dtype, got {out_dtype}")
            out = out_dtype
        return compute, out


def check_window_end_column(terminated, truncated, mask, device):
    """A ``[*B]`` ``bootstrap_values`` holds the window-end column only: refuse truncations before
    the window end. One device sync, only for this combination; pass ``[*B, T]`` bootstrap values to
    avoid it (and inside a CUDA graph capture, where no sync can happen)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise ValueError(
            "bootstrap_values of shape [*B] (the window-end column only) with truncated is "
            "validated by reading the flags back, a device sync that a CUDA graph capture "
            "cannot hold; pass bootstrap_values of shape [*B, T] when capturing"
        )
    if bool(windows.interior_truncation(terminated, truncated, mask).any()):
        raise ValueError(
            "bootstrap_values of shape [*B] holds the window-end column only, but truncated "
            "has truncations before the window end; pass bootstrap_values of shape [*B, T]"
        )


def main_tensor(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError(f"{name} must have shape [*batch, T], got a 0-d tensor")
    return x


def _params(est: Estimator, params: Mapping) -> dict:
    out = {}
    for prm in est.params:
        if prm.name in params:
            out[prm.name] = prm.check(prm.name, params[prm.name])
        elif prm.required:
            raise TypeError(f"{est.function_name}() missing the parameter {prm.name!r}")
        else:
            out[prm.name] = prm.default
    return out


# Validated calls, by a cheap signature (estimator, parameters, keywords, and each field's shape,
# dtype and device): a call that matches one skips every check that depends only on the signature
# and rebinds its tensors to the validated problem. The checks that read data (a [*B] bootstrap
# column against the truncations; check_finite) run on every call.
_PLANS: dict = {}
_PLANS_MAX = 1024


def _tensor_key(x):
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TypeError  # not cacheable: the full path gives the error
    return (x.shape, x.dtype, x.device)


def prepare(est: Estimator, fields: Mapping, params: Mapping, *, carry=None, return_carry=False,
            out_dtype=None, window_end="bootstrap", reverse=True) -> Problem:
    """Check one call of ``est`` and build its :class:`Problem` (batch dims flattened to one).

    ``fields``: the per-step tensors by name (absent ones ``None``); ``params``: the scalar
    parameters; ``carry``: the chained window's carry (forward estimators: ``initial``). A call
    with the signature of an earlier valid call (the same estimator, parameters, keywords, and
    fields of the same shapes, dtypes and devices) reuses its validation.
    """
    key = None
    if not torch.compiler.is_compiling():
        try:
            key = (est.name, window_end, return_carry, out_dtype, reverse, tuple((k, type(v), v) for k, v in params.items()),
                   _tensor_key(carry), *[_tensor_key(fields.get(n)) for n in est.field_names])
            plan = _PLANS.get(key)
        except TypeError:  # an unhashable parameter or a field that is not a tensor: validate in full
            key = plan = None
        if plan is not None and plan[0] is est:
            return _checked(_bind(plan[1], est, fields, carry), data_only=True)
    p = _validate(est, fields, params, carry=carry, return_carry=return_carry, out_dtype=out_dtype,
                  window_end=window_end, reverse=reverse)
    if key is not None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        # the skeleton keeps each field's flattened shape, never the tensors (no memory held alive)
        skeleton = p._replace(fields={k: (None if v is None else v.shape) for k, v in p.fields.items()},
                              carry=None if p.carry is None else p.carry.shape)
        _PLANS[key] = (est, skeleton)
    return _checked(p, data_only=False)


def _bind(template: Problem, est: Estimator, fields: Mapping, carry) -> Problem:
    """``template`` (the skeleton of a validated problem of the same signature: each field's and
    the carry's flattened shape in place of the tensor) with this call's tensors."""
    flat = {}
    for name, shape in template.fields.items():
        x = fields.get(name)
        flat[name] = None if x is None or shape is None else (x if x.shape == shape else x.reshape(shape))
    if carry is not None:
        carry = carry if carry.shape == template.carry else carry.reshape(template.carry)
    return template._replace(fields=flat, carry=carry)


def recheck(p: Problem) -> Problem:
    """The checks of a validated problem that read its data, for a caller that runs it again on new
    contents (:class:`rollbuf.functional.Bound`): a ``[*B]`` bootstrap column against the
    truncations and, when on, :func:`check_finite`."""
    return _checked(p, data_only=True)


def checks_column(p: Problem) -> bool:
    """Whether a run of ``p`` on new contents checks a ``[*B]`` bootstrap column against the
    truncations (:func:`recheck`): the one data check besides :func:`check_finite`."""
    bv = p.fields.get("bootstrap_values")
    return bv is not None and bv.dim() == 1 and p.fields.get("truncated") is not None


def _checked(p: Problem, data_only: bool) -> Problem:
    """The checks that read the data: a ``[*B]`` bootstrap column against the truncations (on a
    rebound problem; a new one had it in :func:`_validate`) and, when on, :func:`check_finite`."""
    if torch.compiler.is_compiling():
        return p
    f = p.fields
    if data_only and checks_column(p):
        check_window_end_column(f.get("terminated"), f["truncated"], f.get("mask"), f["bootstrap_values"].device)
    if _FINITE["on"]:
        hit = first_non_finite(p)
        if hit is not None:
            _raise_non_finite(p, hit)
    return p


def _validate(est: Estimator, fields: Mapping, params: Mapping, *, carry, return_carry, out_dtype,
              window_end, reverse) -> Problem:
    """Every check of one call, and its :class:`Problem`."""
    prm = _params(est, params)
    if est.fields[0].kind == "features":
        c, feature_shape = _forward_fields(est, fields)
    else:
        c = _backward_fields(est, fields, window_end, carry)
        feature_shape = ()
    B, T = c.shape[:-1], c.shape[-1]
    N = math.prod(B)
    flat = {}
    for name, x in c.fields.items():
        if x is None:
            flat[name] = None
        elif name == "x":
            flat[name] = x.reshape(N, T, *x.shape[len(c.shape):])
        elif name == "bootstrap_values" and x.dim() == len(B):
            flat[name] = x if x.dim() == 1 else x.reshape(N)
        else:
            flat[name] = x if x.dim() == 2 else x.reshape(N, T)
    if carry is not None:
        if est.direction == "forward":
            carry_name, carry_shape = "initial", (*B, *feature_shape)
        else:
            carry_name, carry_shape = "carry", (*B, 2) if est.family == Family.VTRACE else B
        check_tensor(carry_name, carry, FLOATS, "a floating-point tensor")
        if tuple(carry.shape) != tuple(carry_shape):
            raise ValueError(f"{carry_name} must have shape {tuple(carry_shape)}, got {tuple(carry.shape)}")
        if carry.device != c.device:
            raise ValueError(f"{carry_name} is on {carry.device} but the rollout is on {c.device}")
        carry = carry.reshape(N, *carry.shape[len(B):])
    compute, out = c.dtypes(out_dtype, carry)
    kw = dict(est.problem_params(prm))
    kw.setdefault("window_end", window_end)
    generic = est.family == Family.GENERIC
    problem_kw = {k: v for k, v in kw.items() if k in _PROBLEM_PARAMS}
    return Problem(
        family=est.family, outputs=est.outputs, fields=flat, carry=carry, want_carry=return_carry,
        compute_dtype=compute, out_dtype=out, batch_shape=tuple(B), feature_shape=feature_shape,
        estimator=est, reverse=(est.direction == "backward") if generic else reverse,
        params=kw if generic else {}, **problem_kw,
    )




_PROBLEM_PARAMS = set(Problem._fields) - {
    "family", "outputs", "fields", "carry", "want_carry", "compute_dtype", "out_dtype", "batch_shape",
    "feature_shape", "estimator", "params", "reverse"}


def _backward_fields(est: Estimator, fields: Mapping, window_end, carry) -> Fields:
    first = est.fields[0]
    main = main_tensor(first.name, fields.get(first.name))
    # [*B, T] is the shape most per-step fields have (ties: the first field's), so that the one
    # field that disagrees is named (a transposed rewards is blamed on rewards, not on values)
    named = [(f.name, tuple(x.shape)) for f in est.fields if f.kind in ("float", "flag")
             for x in (fields.get(f.name),) if isinstance(x, torch.Tensor) and x.dim() >= 1]
    shape, have = _layout(named) if named else (tuple(main.shape), [first.name])
    c = Fields(shape, fields.get(have[0]).device, ", ".join(have))
    boot = None
    for f in est.fields:
        x = fields.get(f.name)
        if f.kind == "flag":
            c.add_flag(f.name, x)
        elif f.kind == "bootstrap":
            boot = f
        elif f.read:
            c.add_float(f.name, x, required=f.required)
        elif x is not None:  # accepted, not read
            check_tensor(f.name, x, FLOATS, _FLOAT_TEXT)
            _same(f.name, x, c.shape, c.device, c.reference)
    chain_choice("window_end", window_end, WINDOW_ENDS)
    if boot is not None:
        if boot.read:
            c.add_bootstrap(fields.get("bootstrap_values"), window_end, needed=carry is None)
        else:
            c.fields["bootstrap_values"] = None
    for f in est.fields:  # fields accepted but not read reach no backend
        if not f.read:
            c.fields[f.name] = None
    return c


def _forward_fields(est: Estimator, fields: Mapping):
    x = fields.get("x")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_tensor("x", x, FLOATS, "a floating-point tensor")
    flags = [(f.name, fields.get(f.name)) for f in est.fields if f.kind == "flag"]
    flags = [(n, f) for n, f in flags if f is not None]
    if not flags:
        raise ValueError(
            f"{est.name} needs terminated, truncated or mask of shape [*B, T] to place x's time "
            "dimension; pass terminated=torch.zeros(...) for a single episode"
        )
    # [*B, T] is x's leading dims (x comes first: the layout reference), as many as the flags
    # have; the flags that agree with x's leading dims choose them (the most, ties: the first), and
    # a flag that disagrees is named. Where none agrees, x is named when two or more flags agree
    # with each other, else the first flag.
    tensors = [(n, f) for n, f in flags if isinstance(f, torch.Tensor) and f.dim() >= 1]
    fits = [(n, tuple(f.shape)) for n, f in tensors if tuple(x.shape[:f.dim()]) == tuple(f.shape)]
    if fits:
        shape, have = _layout(fits)
    else:
        name, first = flags[0]
        check_tensor(name, first, FLAGS, _FLAG_TEXT)
        if first.dim() < 1:
            raise ValueError(f"{name} must have shape [*B, T], got a 0-d tensor")
        shape, have = _layout([(n, tuple(f.shape)) for n, f in tensors])
        if len(have) < 2:
            raise ValueError(
                f"{name} must have shape [*B, T], the leading dims of x ([*B, T, *F], shape "
                f"{tuple(x.shape)}), got {tuple(first.shape)}; nothing is broadcast"
            )
        raise ValueError(
            f"x must have shape [*B, T, *F] with [*B, T] = {shape} (the shape of {', '.join(have)}), "
            f"got {tuple(x.shape)}"
        )
    c = Fields(shape, x.device, f"x's leading dims and {', '.join(have)}")
    for f in est.fields:
        if f.kind == "flag":
            c.add_flag(f.name, fields.get(f.name))
    c.fields["x"] = x
    c.floats.append(x)
    return c, tuple(x.shape[len(shape):])


def finish(p: Problem, outs, carry):
    """The backend's flat outputs with the batch shape and the output dtype restored (a forward
    estimator's ``final`` and every carry stay in the accumulation dtype: chains are exact to its
    rounding). Returns ``(outputs, carry)``."""
    B = p.batch_shape
    flat = len(B) == 1  # [N, T] in, [N, T] out: no reshape (the common case, kept cheap)
    shaped = []
    for name, o in zip(p.outputs, outs):
        o = o if flat else o.reshape(tuple(B) + tuple(o.shape[1:]))
        dt = p.compute_dtype if name == "final" else p.out_dtype
        shaped.append(o if o.dtype == dt else o.to(dt))
    if p.want_carry and carry is not None:
        carry = carry if flat else carry.reshape(tuple(B) + tuple(carry.shape[1:]))
        carry = carry if carry.dtype == p.compute_dtype else carry.to(p.compute_dtype)
    return shaped, carry
