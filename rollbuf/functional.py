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

from rollbuf import backends, estimators, validation
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
    "bind",
]

BACKENDS = backends.BACKENDS


def estimate(name, *, backend="auto", carry=None, return_carry=False, out_dtype=None,
             window_end="bootstrap", run=None, **kwargs):
    """Run the registered estimator ``name`` (:data:`rollbuf.estimators.REGISTRY`).

    ``kwargs`` hold its fields (tensors, by name) and its parameters (numbers, by name). The
    estimators below are this function with readable signatures; an estimator added with
    :func:`rollbuf.estimators.register` is called through it directly. Forward estimators take
    ``initial=`` where backward ones take ``carry=``. ``run`` is the backend seam
    (:func:`rollbuf.backends.run` by default; :mod:`rollbuf.distributed` passes its carry exchange).
    """
    arguments = dict(kwargs, backend=backend, carry=carry, return_carry=return_carry, out_dtype=out_dtype,
                     window_end=window_end)
    return _cached(("estimate", name), name, arguments, run)


def call(function: str, arguments: dict, run=None):
    """Call the public estimator function ``function`` (``"gae"``, ``"discounted_returns"``, ...)
    with its arguments by name (as ``inspect.signature(...).bind`` gives them), through the backend
    seam ``run``: the wrappers below are this call; :mod:`rollbuf.distributed` calls it with its
    carry exchange as ``run``."""
    return _cached(function, None, arguments, run)


def _cached(tag, name, arguments: dict, run):
    """One call, by ``tag``: ``name`` is a registry estimator called through :func:`estimate` (its
    ``arguments`` are :func:`estimate`'s keywords), ``None`` a public function ``tag``. A call with
    the signature of an earlier valid one takes the repeated path (below); any other is validated."""
    key = None
    if run is None and not torch.compiler.is_compiling():
        key = _call_key(tag, arguments)
        if key is not None:
            hit = _CALLS.get(key)
            if hit is not None and _REGISTRY.get(hit.estimator.name) is hit.estimator:  # not re-registered
                return hit(arguments)
    est_name, kw = _arguments(tag, arguments) if name is None else (name, arguments)
    p, be = _problem(est_name, **kw)
    if run is None:  # a sharded call's T = 0 shard is not the window end (rollbuf.distributed)
        _check_empty_window(p)
    outs, cout = (run or backends.run)(p, be)
    if key is not None:
        repeat = _Repeat.build(p, be, tag, name, arguments)
        if repeat is not None:
            if len(_CALLS) >= _CALLS_MAX:
                _CALLS.clear()
            _CALLS[key] = repeat
    return result(p, outs, cout)


# ---- repeated calls ----------------------------------------------------------------------------
# A call whose signature matches an earlier valid one (the function, every argument's name, every
# number's type and value, every tensor's shape, strides, dtype, device and 16-byte alignment) runs
# that call's validated problem with its own tensors, through the kernel launch built for it: no
# validation, no dispatch, no launch lookup, the launch's scalars and field slots taken as built.
# The checks that read data run on every call; inputs that require grad take the autograd path;
# other forced kernel choices take the full path. The cache holds shapes, never tensors.

_is_compiling = torch.compiler.is_compiling

_CALLS: dict = {}
_CALLS_MAX = 1024
_FIELDS, _CARRY = Problem._fields.index("fields"), Problem._fields.index("carry")
_make = Problem._make
_REGISTRY = estimators.REGISTRY
_PLAIN = {t: t for t in (int, float, bool, str, torch.dtype)}  # the types keyed by value
_TENSOR = torch.Tensor


def _call_key(tag, arguments: dict):
    """The signature of one call, or ``None`` where it cannot be keyed cheaply (a tensor subclass,
    an argument of another type than a plain number, string, dtype or ``None``): such a call is
    validated in full. A tensor where a number goes is keyed, but never cached (see
    :meth:`_Repeat.build`), so its calls are validated in full too."""
    try:
        return (tag, tuple(arguments), *[
            (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15) if type(x) is _TENSOR
            else x if x is None else (_PLAIN[type(x)], x) for x in arguments.values()])
    except KeyError:  # a type that is not keyed
        return None


class _Arg:
    """Marks where an argument's tensor went when a call's arguments are mapped to its fields."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Repeat:
    """The validated problem of one call signature, as the pieces the repeated path needs: which
    argument fills which field (and the flattened shape it is reshaped to, where it differs), the
    problem's other members, its backend and, on the ``triton`` backend, its kernel launch with the
    call's scalars and the kernel's field slot of each argument."""

    __slots__ = ("estimator", "backend", "values", "take", "carry_arg", "carry_shape", "grads", "column",
                 "launch", "slots", "n_slots", "scalars", "carry_in", "fast", "go")

    @classmethod
    def build(cls, p: Problem, backend: str, tag, name, arguments: dict):
        """The repeated path of a validated call, or ``None`` where its problem's tensors are not its
        arguments reshaped (a tensor given where a number goes, a field that validation made)."""
        marked = {k: (_Arg(k) if type(v) is _TENSOR else v) for k, v in arguments.items()}
        kw = marked if name is not None else _arguments(tag, marked)[1]  # where each tensor went
        est = p.estimator
        allowed = set(est.field_names) | {"carry", "initial"}
        if any(type(v) is _Arg and k not in allowed for k, v in kw.items()):
            return None  # a tensor where a number goes: validated in full every time
        self = cls()
        self.estimator, self.backend = est, backend
        take = []
        for fname, x in p.fields.items():
            if x is None:
                continue
            src = kw.get(fname)
            if type(src) is not _Arg:
                return None
            src = src.name
            a = arguments[src]
            if a.data_ptr() != x.data_ptr():
                return None
            take.append((src, fname, None if a.shape == x.shape else x.shape))
        self.take = tuple(take)
        self.carry_arg = self.carry_shape = None
        if p.carry is not None:
            # as _problem reads it: a forward estimator's `initial` when given, else `carry`
            src = kw.get("initial") if est.direction == "forward" and "initial" in kw else kw.get("carry")
            if type(src) is not _Arg:
                return None
            src = src.name
            a = arguments[src]
            self.carry_arg = src
            self.carry_shape = None if a.shape == p.carry.shape else p.carry.shape
        self.values = list(p)  # the problem's members; fields and carry filled per call
        self.values[_FIELDS] = self.values[_CARRY] = None  # no tensor of this call is kept
        differentiable = backends.autograd.differentiable_fields(p)
        self.grads = tuple(src for src, fname, _ in take if fname in differentiable)
        self.column = validation.checks_column(p)
        self.launch = self.slots = self.scalars = self.carry_in = self.go = None
        self.fast = False
        if backend == "triton" and p.family != Family.GENERIC and p.num_rows and p.num_steps:
            launch = backends.launch_for(p)  # built under the kernel choices forced now
            self.launch = launch
            # The fast path: [N, T] fields (no reshape, outputs as the kernel writes them: the
            # outputs in out_dtype, a forward estimator's final in the accumulation dtype), no carry
            # in or out, no [N] column to check, no field made to match the launch's layout. The kernel's fields tuple
            # and carry in are then the arguments themselves, its scalars those of this signature.
            if (launch.direct() and len(p.batch_shape) == 1 and not p.want_carry and not self.column
                    and p.carry is None and all(shape is None for _, _, shape in take)):
                names = launch.field_slots()
                where = {fname: i for i, fname in enumerate(names) if fname is not None}
                source = {fname: src for src, fname, _ in take}
                self.slots = tuple((source[fname], i) for fname, i in where.items() if fname in source)
                self.n_slots = len(names)
                self.scalars = launch.scalar_values(p)
                ci = launch.carry_source()
                if ci is None or ci in source:
                    self.carry_in = None if ci is None else source[ci]
                    self.fast = True
        return self

    def __call__(self, arguments: dict):
        launch = self.launch
        if self.fast and launch.current() and not validation.checking_finite() and not self._grad(arguments, None):
            # the kernel's fields straight from the arguments; the result straight from its outputs
            fields = [None] * self.n_slots
            for src, i in self.slots:
                fields[i] = arguments[src]
            ci = self.carry_in
            if ci is not None:
                ci = arguments[ci]
                ci = ci if ci.is_contiguous() else ci.contiguous()
            go = self.go
            if go:
                outs, _ = go(tuple(fields), ci)
            else:
                outs, _ = launch(None, tuple(fields), ci, self.scalars)
                if go is None:  # after the first run (compiled now): the lean launch, or False
                    self.go = launch.lean(None, None, self.scalars) or False
            res = self.estimator.result
            return res(*outs) if res is not None else outs[0]
        flat = {}
        for src, fname, shape in self.take:
            x = arguments[src]
            flat[fname] = x if shape is None else x.reshape(shape)
        carry = None
        if self.carry_arg is not None:
            carry = arguments[self.carry_arg]
            if self.carry_shape is not None:
                carry = carry.reshape(self.carry_shape)
        v = self.values.copy()
        v[_FIELDS], v[_CARRY] = flat, carry
        p = _make(v)
        if self.column or validation.checking_finite():
            validation.recheck(p)
        if launch is None or not launch.current() or self._grad(arguments, carry):
            outs, cout = backends.run(p, self.backend)
        else:
            outs, cout = launch(p)
        return result(p, outs, cout)

    def _grad(self, arguments: dict, carry) -> bool:
        """Whether this call must be recorded for autograd (as :func:`rollbuf.backends.autograd.needs_grad`)."""
        if not torch.is_grad_enabled():
            return False
        if carry is not None and carry.requires_grad:
            return True
        for src in self.grads:
            if arguments[src].requires_grad:
                return True
        return False


def _problem(name, *, backend="auto", carry=None, return_carry=False, out_dtype=None, window_end="bootstrap",
             **kwargs):
    """The validated :class:`Problem` of one :func:`estimate` call and its concrete backend."""
    est = estimators.get(name)
    fields = {f.name: kwargs.pop(f.name, None) for f in est.fields}
    if est.direction == "forward" and "initial" in kwargs:
        carry = kwargs.pop("initial")
    for key, v in est.fixed.items():
        if kwargs.pop(key, v) != v:
            raise ValueError(f"estimator {name!r} has {key}={v!r}")
    params = {prm.name: kwargs.pop(prm.name) for prm in est.params if prm.name in kwargs}
    if kwargs:
        raise TypeError(f"{est.function_name}() got unexpected keyword arguments {sorted(kwargs)}")
    validation.check_bool("return_carry", return_carry)
    if return_carry and est.direction == "forward":
        raise TypeError(f"{est.function_name}() returns its carry as `final`; it takes no return_carry")
    p = validation.prepare(est, fields, params, carry=carry, return_carry=return_carry,
                           out_dtype=out_dtype, window_end=window_end)
    return p, backends.resolve(backend, p.main.device)


class Bound:
    """One estimator call bound to its tensors (:func:`bind`): ``bound()`` returns what the call
    returns, computed from the tensors' current contents (written in place between calls), without
    validating, dispatching or building a launch again. On the ``triton`` backend it launches the
    kernel's pre-bound plan (:func:`rollbuf.kernels.plan`).

    Valid while those tensors are the call's, at the storage they had when it was bound: a caller
    that owns them (:class:`rollbuf.Rollout`) drops it when one is replaced or given new storage
    (``x.data = y``, ``set_``, ``resize_``), after which which storage a call reads is undefined
    (a warm kernel plan reads the addresses it was built with). Each call still runs the data
    checks (:class:`rollbuf.check_finite`, when on) and takes the autograd or ``torch.compile``
    path when an input requires grad or the call is being compiled, and the full path under other
    forced kernel choices than those it was built under. A call whose batch dimensions cannot be
    flattened without a copy (a slice of a ``[E, A, T]`` buffer, say) is not bound: each
    ``bound()`` is then the full call, so that writes into the caller's tensors are always seen."""

    __slots__ = ("problem", "backend", "_run", "_launch", "_column", "_plain", "_again", "_grads")

    def __init__(self, p: Problem, backend: str, again=None):
        self.problem, self.backend, self._again = p, backend, again
        # the bound tensors that can carry gradients (as backends.autograd.needs_grad reads them):
        # whether one requires grad is read on every call, the tensors are fixed
        f = p.fields
        self._grads = tuple(t for t in (p.carry, *map(f.get, backends.autograd.differentiable_fields(p)))
                            if t is not None)
        self._run = backends.bind(p, backend) if again is None else None
        self._launch = getattr(self._run, "launch", None)  # a kernel plan's launch
        self._column = validation.checks_column(p)  # a [*B] column against the truncations, every call
        # the outputs need no reshape, no cast and no carry: the result is built from them directly
        self._plain = (len(p.batch_shape) == 1 and not p.want_carry and p.out_dtype == p.compute_dtype
                       and "final" not in p.outputs)

    def __call__(self):
        if self._again is not None:
            return self._again()
        p = self.problem
        if self._column or validation.checking_finite():
            validation.recheck(p)
        if (_is_compiling() or (self._grads and torch.is_grad_enabled() and _any_requires_grad(self._grads))
                or (self._launch is not None and not self._launch.current())):
            outs, cout = backends.run(p, self.backend)
        else:
            outs, cout = self._run()
            if self._plain and outs[0].dtype == p.out_dtype:
                est = p.estimator
                return est.result(*outs) if est.result is not None else outs[0]
        return result(p, outs, cout)


def _any_requires_grad(tensors) -> bool:
    for t in tensors:
        if t.requires_grad:
            return True
    return False


def bind(function: str, arguments: dict) -> Bound:
    """The call ``function(**arguments)`` (a public estimator function, as :func:`call` takes it),
    validated once and bound to its tensors: see :class:`Bound`."""
    name, kw = _arguments(function, arguments)
    p, be = _problem(name, **dict(kw))
    _check_empty_window(p)
    given = dict(kw, carry=kw.get("carry"))
    for key, x in (*p.fields.items(), ("carry", p.carry)):
        t = given.get(key)
        if x is not None and t is not None and x is not t and x.untyped_storage().data_ptr() != \
                t.untyped_storage().data_ptr():  # flattened by a copy: later writes would not reach it
            return Bound(p, be, again=lambda: call(function, arguments))
    return Bound(p, be)


_WINDOW_END_FAMILIES = (Family.TD_LAMBDA, Family.RETRACE, Family.VTRACE)  # their carry holds V(s_T)


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


def _arguments(function: str, arguments: dict):
    """The registry estimator and :func:`estimate`'s keyword arguments of a public function's call."""
    kw = dict(arguments)
    if function == "discounted_returns":
        bootstrap = validation.check_bool("bootstrap", kw.pop("bootstrap", True))
        name = "discounted_returns" if bootstrap else "monte_carlo_returns"
        if not bootstrap:
            kw.pop("bootstrap_values", None)  # Monte-Carlo returns read no bootstrap value
    elif function == "episodic_sums":
        name = function
        if kw.get("x") is None:
            if kw.get("rewards") is None:
                raise ValueError("episodic_sums needs x or rewards")
            kw["x"] = kw.pop("rewards")
        elif kw.get("rewards") is not None:  # rewards is only x's default: never dropped silently
            raise TypeError("episodic_sums() got an unexpected keyword argument 'rewards' alongside x: "
                            "rewards is the default of x; pass one of them")
        kw.pop("rewards", None)
    else:
        name = function
    if "initial" in kw:
        kw["carry"] = kw.pop("initial")
    return name, kw


def result(p: Problem, outs, carry):
    """The public result of a problem's flat backend outputs: the estimator's result type (or its
    one tensor), with ``(result, carry)`` when ``return_carry=True``."""
    outs, carry = validation.finish(p, outs, carry)
    est = p.estimator
    res = est.result(*outs) if est.result is not None else outs[0]
    return (res, carry) if p.want_carry else res


def gae(gamma, lam, *, rewards, values, terminated=None, truncated=None, bootstrap_values=None,
        mask=None, window_end="bootstrap", carry=None, return_carry=False, out_dtype=None,
        backend="auto"):
    r"""Generalized advantage estimation (Schulman et al., 2016).

    ``δ_t = r_t + γ(1−k_t)V'_t − V_t``, ``A_t = δ_t + γλ(1−d_t)A_{t+1}``; returns ``A + V``.
    ``V'_t`` is ``values[t+1]`` inside an episode and ``bootstrap_values[t]`` after a truncation or
    at the window end; terminated steps (``k_t``) never bootstrap; ``d_t`` (done) stops the trace.

    Returns :class:`GAEResult` ``(advantages, returns)``; outputs are 0 at masked steps.
    """
    return call("gae", dict(gamma=gamma, lam=lam, rewards=rewards, values=values, terminated=terminated,
                    truncated=truncated, bootstrap_values=bootstrap_values, mask=mask, window_end=window_end,
                    carry=carry, return_carry=return_carry, out_dtype=out_dtype, backend=backend))


def advantages(gamma, lam, **kwargs):
    """The default advantage estimator: GAE advantages (see :func:`gae`, same keyword arguments);
    only the advantages are computed and written."""
    return call("advantages", dict(kwargs, gamma=gamma, lam=lam))


def lambda_returns(gamma, lam, *, rewards, values, terminated=None, truncated=None,
                   bootstrap_values=None, mask=None, window_end="bootstrap", carry=None,
                   return_carry=False, out_dtype=None, backend="auto"):
    r"""TD(λ) returns (Sutton, 1988), the λ-return of Sutton & Barto §12.1 with episode bounds.

    ``G_t = r_t + γ(1−k_t)[(1 − λ(1−d_t))V'_t + λ(1−d_t)G_{t+1}]``. Equals GAE advantages + values.
    """
    return call("lambda_returns", dict(gamma=gamma, lam=lam, rewards=rewards, values=values,
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
    return call("vtrace", dict(target_log_probs=target_log_probs, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar,
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
    return call("retrace", dict(q_values=q_values, target_log_probs=target_log_probs, gamma=gamma, lam=lam,
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
    return call("eligibility_traces", dict(x=x, gamma=gamma, lam=lam, initial=initial, terminated=terminated,
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
