"""The public call of an estimator: its key, its plan, its launch.

Every estimator of the registry has one :class:`Call`, built when it is first called
(:func:`call_of`); :mod:`rollbuf.functional`, :class:`~rollbuf.Rollout` and the integrations call it
with the call's arguments by name. A warm call is four steps:

1. **the key**: the call's options (backend, window end, ``return_carry``, ``out_dtype``, the grad mode
   and any forced kernel choice) and, for every tensor it takes, its type, dtype, shape, strides,
   device and whether it requires grad;
2. **the plan** of that key, looked up in the one cache (:data:`rollbuf.cache.PLANS`);
3. **the per-call checks**: every scalar parameter (γ, λ, ρ̄, ...) through its registry check, the
   fixed keywords, the argument names;
4. **the launch**: the backend's plan run on the call's tensors (the compiled CPU loop,
   :class:`rollbuf.backends.compiled_cpu.Plan`, or the fused kernel's
   :class:`rollbuf.kernels.host.Launch`), the outputs already in the layout and dtype of the result.

The first call of a layout takes the checked path: :func:`rollbuf.validation.prepare` checks every
argument and builds the :class:`~rollbuf.problem.Problem`, the backend runs it, and the plan is made
from that problem. Nothing a layout does not fix is in a plan: the scalars are checked on every call,
and the tensors are the call's own. Calls whose plan would have to redo the checked path's work (a
batch of several leading dims, fields converted or expanded before the scan, inputs that require
grad, the torch and reference backends, registry estimators of ``Family.GENERIC``, empty windows)
keep a plan that says so and take the checked path every time, as do calls under ``torch.compile``
and while :class:`rollbuf.check_finite` is on.
"""

from __future__ import annotations

import importlib

import torch

from rollbuf import backends, cache, estimators, validation
from rollbuf.kernels import host
from rollbuf.problem import Family, Problem

__all__ = ["Call", "Plan", "call_of", "result", "launches", "SLOW"]

SLOW = "slow"  #: the plan of a layout that takes the checked path on every call
_REQUIRED = object()
_WINDOW_END_FAMILIES = (Family.TD_LAMBDA, Family.RETRACE, Family.VTRACE)  # their carry holds V(s_T)
_FLAT_FAMILIES = (Family.TD_LAMBDA, Family.RETRACE, Family.VTRACE, Family.FORWARD)  # planned
_FORWARD = Family.FORWARD
_is_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor
_REGISTRY = estimators.REGISTRY


class Call:
    """The callable of one registry estimator: ``call(kw)`` runs it on the keyword arguments ``kw``
    (fields, parameters and the call options by name; not modified)."""

    def __init__(self, est: estimators.Estimator):
        self.est, self.name = est, est.name
        self.names = est.argument_names
        forward = est.direction == "forward"
        self.carry_name = "initial" if forward else "carry"
        self.key_names = (*est.field_names, self.carry_name)
        self.params = tuple((prm.name, prm.check, _REQUIRED if prm.required else prm.default) for prm in est.params)
        self.fixed = tuple(est.fixed.items())
        self.forward = forward

    def __repr__(self) -> str:
        return f"<rollbuf estimator {self.est.name!r}>"

    def __call__(self, kw: dict):
        if _REGISTRY.get(self.name) is not self.est:  # the name was registered again: its new entry's call
            return call_of(self.name)(kw)
        if validation.checking_finite() or torch.compiler.is_compiling() or not kw.keys() <= self.names:
            return self.checked(kw)
        get = kw.get
        rc = get("return_carry", False)
        if (rc is not False and rc is not True) or (self.forward and get("carry") is not None):
            return self.checked(kw)
        key = [self, get("backend", "auto"), get("window_end", "bootstrap"), rc, get("out_dtype"),
               _is_grad_enabled(), host.FORCE.get()]
        try:
            for name in self.key_names:
                x = get(name)
                if x is None:
                    key.append(None)
                elif type(x) is _Tensor:  # a plain tensor (a subclass, or anything else: the checked path)
                    key += (x.dtype, x.shape, x.stride(), x.device, x.requires_grad)
                else:
                    return self.checked(kw)
            key_t = tuple(key)
            plan = cache.PLANS.get(key_t)
        except (AttributeError, TypeError):  # not a tensor, an unhashable option: the checked path names it
            return self.checked(kw)
        if plan is None:
            return self.first(key_t, kw)
        if plan is SLOW:
            return self.checked(kw)
        prm = self.parameters(kw)
        if prm is None:
            return self.checked(kw)  # it names what is missing or wrong
        return plan(get, get(self.carry_name), prm)

    def parameters(self, kw: dict) -> dict | None:
        """The call's scalar parameters, each through its registry check (which raises naming it);
        ``None`` where a required one is missing or a fixed keyword differs."""
        prm = {}
        for name, check, default in self.params:
            if name in kw:
                prm[name] = check(name, kw[name])
            elif default is _REQUIRED:
                return None
            else:
                prm[name] = default
        for name, value in self.fixed:
            if name in kw and kw[name] != value:
                return None
        return prm

    # -- the checked path ------------------------------------------------------------------------

    def problem(self, kw: dict):
        """The validated :class:`Problem` of the call ``kw`` and its concrete backend."""
        est = self.est
        get = kw.get
        for key, v in est.fixed.items():
            if key in kw and kw[key] != v:
                raise ValueError(f"estimator {est.name!r} has {key}={v!r}")
        if not kw.keys() <= self.names:  # any argument not recognised is an error
            raise TypeError(f"{est.function_name}() got unexpected keyword arguments "
                            f"{sorted(kw.keys() - self.names)}")
        fields = {name: get(name) for name in est.field_names}
        params = {prm.name: kw[prm.name] for prm in est.params if prm.name in kw}
        carry = get("carry")
        if self.forward and "initial" in kw:
            carry = kw["initial"]
        return_carry = get("return_carry", False)
        if return_carry is not False:
            validation.check_bool("return_carry", return_carry)
            if return_carry and self.forward:
                raise TypeError(f"{est.function_name}() returns its carry as `final`; it takes no return_carry")
        p = validation.prepare(est, fields, params, carry=carry, return_carry=return_carry,
                               out_dtype=get("out_dtype"), window_end=get("window_end", "bootstrap"))
        return p, backends.resolve(get("backend", "auto"), p.main.device)

    def checked(self, kw: dict, run=None):
        """The call through the checked path (``run``: the backend seam, :func:`rollbuf.backends.run`
        by default; :mod:`rollbuf.distributed` passes its carry exchange)."""
        if _REGISTRY.get(self.name) is not self.est:
            return call_of(self.name).checked(kw, run)
        p, be = self.problem(kw)
        if run is None:  # a sharded call's T = 0 shard is not the window end (rollbuf.distributed)
            _check_empty_window(p)
            outs, cout = backends.run(p, be)
        else:
            outs, cout = run(p, be)
        return result(p, outs, cout)

    def first(self, key: tuple, kw: dict):
        """The first call of a layout: the checked path, then its plan remembered under ``key``."""
        p, be = self.problem(kw)
        _check_empty_window(p)
        outs, cout = backends.run(p, be)
        res = result(p, outs, cout)
        cache.remember(key, self.plan(p, be, kw))
        return res

    def plan(self, p: Problem, be: str, kw: dict):
        """The plan of the layout of ``p`` (the validated call ``kw`` on backend ``be``), or :data:`SLOW`."""
        get = kw.get
        if p.family not in _FLAT_FAMILIES or len(p.batch_shape) != 1 or be not in ("numba", "triton"):
            return SLOW
        if p.num_rows == 0 or p.num_steps == 0 or p.main.dim() != 2:
            return SLOW
        if be == "triton" and p.main.device.type != "cuda":
            return SLOW  # Triton's interpreter (TRITON_INTERPRET, read on every call): the checked path
        if any(x is not None and x is not get(n) for n, x in p.fields.items()):
            return SLOW  # a field converted or expanded by the checks (a [*B] column under truncations)
        carry = get(self.carry_name)
        if p.carry is not carry or any(x is not None and x.requires_grad for x in (*p.fields.values(), carry)):
            return SLOW
        if be == "numba":
            launch = importlib.import_module("rollbuf.backends.compiled_cpu").Plan(p)
        else:
            launch = host.launch_for(p)
            if not launch.plannable(p):
                return SLOW
        return Plan(self.est, p, launch)


class Plan:
    """A layout's plan: its backend launch and what turns the launch's outputs into the result."""

    __slots__ = ("launch", "problem_params", "result", "want_carry")

    def __init__(self, est: estimators.Estimator, p: Problem, launch):
        self.launch = launch
        self.problem_params = None if est.problem_params is dict else est.problem_params
        self.result = est.result
        self.want_carry = p.want_carry

    def __call__(self, get, carry, prm: dict):
        # γ and the other parameters go from the checked dict straight into the launch's arguments (a
        # parameter the estimator does not set has the Problem's default, 1.0)
        outs, cout = self.launch.run(get, carry, prm if self.problem_params is None else self.problem_params(prm))
        res = outs[0] if self.result is None else self.result(*outs)
        return (res, cout) if self.want_carry else res


def _check_empty_window(p: Problem) -> None:
    """Refuse the carry of a ``T = 0`` window that bootstraps from ``bootstrap_values`` of shape
    ``[*B, 0]``: the carry of an empty window is its window-end value V(s_T) itself (chaining an
    empty window changes nothing), and a ``[*B, 0]`` tensor has no column to hold it. Returning 0
    there would make the window before it bootstrap from 0."""
    if not p.want_carry or p.carry is not None or p.window_end != "bootstrap" or p.no_bootstrap:
        return
    if p.family not in _WINDOW_END_FAMILIES or p.num_steps:
        return
    bv = p.fields.get("bootstrap_values")
    if bv is not None and bv.dim() == 2:
        B = p.batch_shape
        raise ValueError(
            f"bootstrap_values of shape {(*B, 0)} has no column for V(s_T), which is the whole carry "
            f"of an empty (T = 0) window: pass the [*B] column bootstrap_values=V(s_T) (shape "
            f"{tuple(B)}) for an empty window, window_end='terminal' if it ends in a terminal state, "
            "or carry= to chain it"
        )


def result(p: Problem, outs, carry):
    """The public result of a problem's flat backend outputs: the estimator's result type (or its
    one tensor), with ``(result, carry)`` when ``return_carry=True``."""
    outs, carry = validation.finish(p, outs, carry)
    est = p.estimator
    res = est.result(*outs) if est.result is not None else outs[0]
    return (res, carry) if p.want_carry else res


_CALLS: dict[str, Call] = {}


def call_of(name: str) -> Call:
    """The :class:`Call` of the registry estimator ``name`` (made anew when the entry was replaced)."""
    est = estimators.get(name)
    c = _CALLS.get(name)
    if c is None or c.est is not est:
        c = _CALLS[name] = Call(est)
    return c


def launches() -> list:
    """Every kernel launch (:class:`rollbuf.kernels.host.Launch`) the cache holds: those of the plans
    and those kept for the package's own kernel calls."""
    out = []
    for v in cache.PLANS.values():
        la = v.launch if isinstance(v, Plan) else v
        if isinstance(la, host.Launch):
            out.append(la)
    return out
