"""Validation: a call's keyword arguments, checked against its registry entry, become a
:class:`~rollbuf.problem.Problem`; the backend's flat outputs get the caller's shape and dtype back.

Every check names the argument and what was expected; nothing is broadcast, coerced or dropped.
What each estimator takes comes from its :class:`~rollbuf.estimators.Estimator` entry (field kinds,
parameter checks); the window rules used here (which step a ``[*B]`` bootstrap column serves) come
from :mod:`rollbuf.windows`.

Every call is validated (no cache): the checks read shapes, dtypes and devices on the host, never
the data, so no call synchronises the host with the device. What only the data could tell is left
to the arithmetic (a ``[*B]`` window-end column read by a truncation before the window end gives
NaN there, docs/semantics.md) or to :class:`check_finite`, the debug mode that reads the inputs back.
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
           "finish", "chain_choice", "check_window_end_column", "check_finite", "checking_finite",
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


class check_finite:
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
    hit = _first_bad_field(p)
    if hit is None and p.fields.get("bootstrap_values") is not None and not p.no_bootstrap:
        hit = _first_bad_bootstrap(p)
    if hit is None and p.carry is not None:
        bad = ~torch.isfinite(p.carry).reshape(p.carry.shape[0], -1).any(-1, keepdim=True)
        at = _first(bad)
        if at is not None:
            hit = ("initial" if p.family == Family.FORWARD else "carry"), at[0], None, float("nan")
    return hit


def _first_bad_field(p: Problem):
    """:func:`first_non_finite` over the per-step float fields but ``bootstrap_values``."""
    m = p.flag("mask")
    for name, x in p.fields.items():
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
    return None


def _first_bad_bootstrap(p: Problem):
    """:func:`first_non_finite` over the ``bootstrap_values`` the call reads (after truncations and at
    the window end; never at a terminated or masked step)."""
    f = p.fields
    bv = f["bootstrap_values"]
    assert bv is not None  # (first_non_finite calls this only when it is given)
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
            m = p.flag("mask")
            read = read & ~(k if m is None else k & m)
        hit = _first(read & ~torch.isfinite(bv))
        return None if hit is None else ("bootstrap_values", hit[0], hit[1], float(bv[hit[0], hit[1]]))
    if end_read or read.any():
        k_end = windows.window_end_value(torch.ones(N, device=bv.device), f.get("terminated"),
                                         f.get("mask"), (N, T)) == 0
        hit = _first((~torch.isfinite(bv) & ~k_end).unsqueeze(-1))
        if hit is not None:
            return "bootstrap_values", hit[0], None, float(bv[hit[0]])
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
    with the others is the one named, whichever it is. Returns ``(shape, names)``. (The same rule
    picks the call's device: ``(name, device)`` pairs.)"""
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
    """The checked fields of one call (``shape`` = ``[*B, T]``). ``reference``: the fields that fix
    the shape, for the error messages."""

    def __init__(self, shape, device, reference=None):
        self.shape, self.device = shape, device
        self.reference = reference
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
        """``bootstrap_values`` is ``[*B, T]`` or ``[*B]`` (window-end column only). With truncations,
        a ``[*B]`` column becomes ``[*B, T]`` bootstrap values holding it at each row's window-end
        step and NaN at every other step (:func:`rollbuf.windows.window_end_column`): a truncation
        before the window end reads NaN (no device sync; under :class:`check_finite` it is an error
        naming it)."""
        f = self.fields
        tr = f.get("truncated")
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
            f["bootstrap_values"] = None
            return
        check_tensor("bootstrap_values", bv, FLOATS, "a floating-point tensor")
        shape = self.shape
        bs = bv.shape
        if bs == shape:
            pass
        elif bs == shape[:-1]:
            if bv.device != self.device:
                raise ValueError(f"bootstrap_values is on {bv.device} but the rollout is on {self.device}")
            if tr is not None and shape[-1]:  # truncations: the column serves the window end only
                if _FINITE["on"] and not torch.compiler.is_compiling():
                    check_window_end_column(f.get("terminated"), tr, f.get("mask"))
                self.floats.append(bv)
                bv = windows.window_end_column(bv, f.get("mask"), shape)
                f["bootstrap_values"] = bv
                return
        else:
            raise ValueError(
                f"bootstrap_values must have shape {tuple(shape)} or {tuple(shape[:-1])} "
                f"(window-end column only), got {tuple(bs)}"
            )
        if bv.device != self.device:
            raise ValueError(f"bootstrap_values is on {bv.device} but the rollout is on {self.device}")
        self.floats.append(bv)
        f["bootstrap_values"] = bv

    def dtypes(self, out_dtype, carry=None):
        """``(compute dtype, output dtype)``: float64 accumulation when any floating input is float64,
        the carry (``initial``) included; the outputs in ``out_dtype``, else the fields' promoted
        dtype (the carry is always in an accumulation dtype, so it does not widen the outputs)."""
        floats = self.floats
        f64 = torch.float64
        out = floats[0].dtype
        compute = f64 if out is f64 else torch.float32
        for x in floats[1:]:
            dt = x.dtype
            if dt is not out:
                out = torch.promote_types(out, dt)
            if dt is f64:
                compute = f64
        if carry is not None and carry.dtype is f64:
            compute = f64
        if out_dtype is not None:
            if out_dtype not in FLOATS:
                raise TypeError(f"out_dtype must be a floating-point dtype, got {out_dtype}")
            out = out_dtype
        return compute, out


def check_window_end_column(terminated, truncated, mask):
    """The check of a ``[*B]`` ``bootstrap_values`` (the window-end column only) against the
    truncations, under :class:`check_finite`: a truncation before the window end is an error naming
    it (one device sync). Without the check, such a step reads NaN (docs/semantics.md)."""
    interior = windows.interior_truncation(terminated, truncated, mask)
    if bool(interior.any()):
        flat = int(torch.nonzero(interior.reshape(-1))[0])
        T = interior.shape[-1]
        row, step = flat // T, flat % T
        B = tuple(interior.shape[:-1])
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(row), B)) if B else ()
        raise ValueError(
            "bootstrap_values of shape [*B] holds the window-end column only, but truncated has a "
            f"truncation before the window end (row {index[0] if len(index) == 1 else index}, step {step}), "
            "which would read NaN; pass bootstrap_values of shape [*B, T] "
            "(rollbuf.check_finite is on: it names what would read NaN)"
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
        name = prm.name
        if name in params:
            out[name] = prm.check(name, params[name])
        elif prm.required:
            raise TypeError(f"{est.function_name}() missing the parameter {name!r}")
        else:
            out[name] = prm.default
    return out


def prepare(est: Estimator, fields: Mapping, params: Mapping, *, carry=None, return_carry=False,
            out_dtype=None, window_end="bootstrap", reverse=True) -> Problem:
    """Check one call of ``est`` and build its :class:`Problem` (batch dims flattened to one).

    ``fields``: the per-step tensors by name (absent ones ``None``); ``params``: the scalar
    parameters; ``carry``: the chained window's carry (forward estimators: ``initial``). Every
    check reads shapes, dtypes and devices only; with :class:`check_finite` on, the inputs are then
    read back (one device sync) and the first non-finite value read is named.
    """
    p = _validate(est, fields, params, carry=carry, return_carry=return_carry, out_dtype=out_dtype,
                  window_end=window_end, reverse=reverse)
    if _FINITE["on"] and not torch.compiler.is_compiling():
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
    B = c.shape[:-1]
    flat = _flat_fields(c)
    if carry is not None:
        carry = _flat_carry(est, carry, B, feature_shape, c.device)
    compute, out = c.dtypes(out_dtype, carry)
    kw = est.problem_params(prm)
    generic = est.family == _GENERIC
    problem_kw = {k: v for k, v in kw.items() if k in _PROBLEM_PARAMS}
    problem_kw.setdefault("window_end", window_end)
    if generic:
        kw = dict(kw)
        kw.setdefault("window_end", window_end)
    return Problem(
        family=est.family, outputs=est.outputs, fields=flat, carry=carry, want_carry=return_carry,
        compute_dtype=compute, out_dtype=out, batch_shape=tuple(B), feature_shape=feature_shape,
        estimator=est, reverse=(est.direction == "backward") if generic else reverse,
        params=kw if generic else {}, **problem_kw,
    )


def _flat_fields(c: Fields) -> dict:
    """The checked fields ``[*B, T]`` as ``[N, T]`` (a ``[B, T]`` call, the common one, as it is)."""
    shape = c.shape
    B, T = shape[:-1], shape[-1]
    nb = len(B)
    flat = c.fields
    if nb == 1:
        return flat
    N = math.prod(B)
    for name, x in flat.items():
        if x is None:
            continue
        if name == "x":
            flat[name] = x.reshape(N, T, *x.shape[len(shape):])
        elif name == "bootstrap_values" and x.dim() == nb:
            flat[name] = x.reshape(N)
        else:
            flat[name] = x.reshape(N, T)
    return flat


def _flat_carry(est: Estimator, carry, B, feature_shape, device):
    """The checked ``carry`` (``initial`` of a forward estimator) ``[*B, ...]`` as ``[N, ...]``."""
    if est.direction == "forward":
        carry_name, carry_shape = "initial", (*B, *feature_shape)
    else:
        carry_name, carry_shape = "carry", (*B, 2) if est.family == Family.VTRACE else B
    check_tensor(carry_name, carry, FLOATS, "a floating-point tensor")
    if tuple(carry.shape) != tuple(carry_shape):
        raise ValueError(f"{carry_name} must have shape {tuple(carry_shape)}, got {tuple(carry.shape)}")
    if carry.device != device:
        raise ValueError(f"{carry_name} is on {carry.device} but the rollout is on {device}")
    return carry if len(B) == 1 else carry.reshape(math.prod(B), *carry.shape[len(B):])


_PROBLEM_PARAMS = frozenset(Problem._fields) - {
    "family", "outputs", "fields", "carry", "want_carry", "compute_dtype", "out_dtype", "batch_shape",
    "feature_shape", "estimator", "params", "reverse"}
_STEP_KINDS = ("float", "flag")
_GENERIC = Family.GENERIC  # (an enum member read off its class costs a Python-level lookup on 3.11)
_FLOAT_SET, _FLAG_SET = frozenset(FLOATS), frozenset(FLAGS)
_PLAIN_DTYPES = {"float": _FLOAT_SET, "flag": _FLAG_SET}  # a per-step field's dtypes, by its kind
_Tensor = torch.Tensor


def _backward_fields(est: Estimator, fields: Mapping, window_end, carry) -> Fields:
    """The checked fields of a backward estimator's call: :func:`backward_plain` for the calls
    whose every tensor is a plain tensor of the call's shape, device and a dtype of its kind (one
    pass, no message built), else :func:`backward_checked`, which checks the same and raises the
    error that names the argument."""
    c = backward_plain(est, fields, window_end, carry)
    return backward_checked(est, fields, window_end, carry) if c is None else c


def backward_plain(est: Estimator, fields: Mapping, window_end, carry) -> Fields | None:
    """:func:`backward_checked`'s result for a call that passes every one of its checks with the
    main field's shape as ``[*B, T]``; ``None`` for any other call (it then goes through
    :func:`backward_checked`, which accepts it or names what is wrong)."""
    if window_end not in WINDOW_ENDS:
        return None
    main = fields.get(est.fields[0].name)
    if type(main) is not _Tensor:
        return None
    shape = main.shape
    if not shape:
        return None
    device = main.device
    out: dict = {}
    floats: list = []
    boot = None
    for f in est.fields:
        name = f.name
        kind = f.kind
        if kind == "bootstrap":
            boot = f
            continue
        x = fields.get(name)
        if x is None:
            if kind == "float" and f.read and f.required:
                return None
            out[name] = None
            continue
        if type(x) is not _Tensor or x.shape != shape or x.device != device:
            return None
        if x.dtype not in _PLAIN_DTYPES.get(kind, ()):
            return None
        if kind == "float" and f.read:
            floats.append(x)
        out[name] = x if f.read else None
    if boot is not None and not _plain_bootstrap(boot, fields.get(boot.name), out, floats, (shape, device),
                                                 window_end == "bootstrap" and carry is None):
        return None
    c = Fields(shape, device)
    c.fields, c.floats = out, floats
    return c


def _plain_bootstrap(boot, bv, out: dict, floats: list, where, needed: bool) -> bool:
    """:func:`backward_plain`'s ``bootstrap_values``: put in ``out`` (and ``floats``), or ``False`` for
    a call the checked path must see (a required one missing, a wrong shape, dtype or device)."""
    shape, device = where
    if not boot.read:
        out[boot.name] = None
        return True
    if bv is None:
        out[boot.name] = None
        return not (needed or out.get("truncated") is not None)  # required: the checked path names it
    if type(bv) is not _Tensor or bv.dtype not in _FLOAT_SET or bv.device != device:
        return False
    floats.append(bv)
    bs = bv.shape
    if bs != shape:
        if bs != shape[:-1]:
            return False
        if out.get("truncated") is not None and shape[-1]:  # the window-end column only
            if _FINITE["on"]:
                return False  # the checked path reads the flags and names an interior truncation
            bv = windows.window_end_column(bv, out.get("mask"), shape)
    out[boot.name] = bv
    return True


def backward_checked(est: Estimator, fields: Mapping, window_end, carry) -> Fields:
    first = est.fields[0]
    main = main_tensor(first.name, fields.get(first.name))
    # [*B, T] is the shape most per-step fields have (ties: the first field's), so that the one
    # field that disagrees is named (a transposed rewards is blamed on rewards, not on values)
    named = [(f.name, tuple(x.shape)) for f in est.fields if f.kind in _STEP_KINDS
             for x in (fields.get(f.name),) if isinstance(x, torch.Tensor) and x.dim() >= 1]
    shape, have = _layout(named) if named else (tuple(main.shape), [first.name])
    # the device most of those fields are on (ties: the first's), so that the odd one is named
    device, _ = _layout([(n, fields[n].device) for n in have])
    c = Fields(shape, device, ", ".join(have))
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
    flags = [(f.name, t) for f in est.fields if f.kind == "flag" for t in (fields.get(f.name),) if t is not None]
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
    for name, out in zip(p.outputs, outs, strict=True):
        o = out if flat else out.reshape(tuple(B) + tuple(out.shape[1:]))
        dt = p.compute_dtype if name == "final" else p.out_dtype
        shaped.append(o if o.dtype == dt else o.to(dt))
    if p.want_carry and carry is not None:
        carry = carry if flat else carry.reshape(tuple(B) + tuple(carry.shape[1:]))
        carry = carry if carry.dtype == p.compute_dtype else carry.to(p.compute_dtype)
    return shaped, carry
