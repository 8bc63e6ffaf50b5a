"""The estimators on plain tensors: validation, then dispatch to a backend.

Every function takes the rollout fields as keyword arguments named as in SPEC §1, each ``[*B, T]``
(time last; ``x`` of the forward estimators may be ``[*B, T, *F]``), and ``backend=``:

* ``"reference"`` — the sequential float64 loop (:mod:`rollbuf.reference`), the oracle;
* ``"torch"`` — the vectorised scan (:mod:`rollbuf.vectorized`), the CPU path;
* ``"triton"`` — the fused kernels (:mod:`rollbuf.kernels`), CUDA tensors, or CPU tensors when
  ``TRITON_INTERPRET=1`` was set before import;
* ``"numba"`` — the compiled sequential loops (:mod:`rollbuf.backends.compiled_cpu`), CPU tensors;
  calls whose inputs require grad, or under ``torch.compile``, run the ``"torch"`` backend;
* ``"auto"`` — ``"triton"`` for CUDA tensors, ``"numba"`` for CPU tensors when numba is
  installed, ``"torch"`` otherwise.

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

import contextvars
import functools
import math
import os
from typing import NamedTuple

import torch

from rollbuf import autograd as _autograd
from rollbuf.problem import Problem

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
]

BACKENDS = ("auto", "triton", "torch", "reference", "numba")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FLAGS = (torch.bool, torch.uint8) + _FLOATS


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
# validation
# ---------------------------------------------------------------------------------------------


def _tensor(name, x, kinds, kind_text):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in kinds:
        raise TypeError(f"{name} must be {kind_text}, got dtype {x.dtype}")
    return x


def _float_field(name, x, shape, device):
    _tensor(name, x, _FLOATS, "a floating-point tensor (float16, bfloat16, float32, float64)")
    _same(name, x, shape, device)
    return x


def _flag_field(name, x, shape, device):
    if x is None:
        return None
    _tensor(name, x, _FLAGS, "a bool, uint8 or 0/1 floating-point tensor")
    _same(name, x, shape, device)
    return x


def _same(name, x, shape, device):
    if x.shape != shape:  # torch.Size against a tuple: element-wise
        raise ValueError(
            f"{name} must have shape {tuple(shape)} (the shape of the rollout, [*batch, T]), "
            f"got {tuple(x.shape)}; nothing is broadcast"
        )
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the rollout is on {device}")


def _unit(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    if not (0.0 <= float(v) <= 1.0) or math.isnan(v):
        raise ValueError(f"{name} must lie in [0, 1], got {v}")
    return float(v)


def _positive(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    if not float(v) > 0.0:
        raise ValueError(f"{name} must be > 0, got {v}")
    return float(v)


def _choice(name, v, options):
    if v not in options:
        raise ValueError(f"{name} must be one of {options}, got {v!r}")
    return v


def _compiling() -> bool:
    return torch.compiler.is_compiling()


class _Call:
    """Validates and flattens one call's fields into a :class:`Problem`."""

    def __init__(self, main_name, main, *, features=False):
        if not isinstance(main, torch.Tensor):
            raise TypeError(f"{main_name} must be a torch.Tensor, got {type(main).__name__}")
        if main.dim() < 1:
            raise ValueError(f"{main_name} must have shape [*batch, T], got a 0-d tensor")
        self.device = main.device
        self.fields: dict[str, torch.Tensor | None] = {}
        self.floats: list[torch.Tensor] = []
        self.features = features
        self.main_name = main_name
        if features:
            _tensor(main_name, main, _FLOATS, "a floating-point tensor")
            self.shape = None  # set by time_dim
        else:
            self.shape = tuple(main.shape)
            self.add_float(main_name, main)

    def add_float(self, name, x, required=True):
        if x is None:
            if required:
                raise ValueError(f"{name} is required by this estimator")
            self.fields[name] = None
            return
        self.floats.append(_float_field(name, x, self.shape, self.device))
        self.fields[name] = x

    def add_flag(self, name, x):
        self.fields[name] = _flag_field(name, x, self.shape, self.device)

    def add_bootstrap(self, bootstrap_values, window_end, needed: bool):
        """``bootstrap_values`` is ``[*B, T]`` or ``[*B]`` (window-end column only)."""
        bv = bootstrap_values
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
        _tensor("bootstrap_values", bv, _FLOATS, "a floating-point tensor")
        B = self.shape[:-1]
        if tuple(bv.shape) == tuple(self.shape):
            pass
        elif tuple(bv.shape) == tuple(B):
            if tr is not None and not _compiling():
                self._check_no_interior_truncation(tr)
        else:
            raise ValueError(
                f"bootstrap_values must have shape {tuple(self.shape)} or {tuple(B)} "
                f"(window-end column only), got {tuple(bv.shape)}"
            )
        if bv.device != self.device:
            raise ValueError(f"bootstrap_values is on {bv.device} but the rollout is on {self.device}")
        self.floats.append(bv)
        self.fields["bootstrap_values"] = bv

    def _check_no_interior_truncation(self, tr):
        # One device sync, only for this combination; pass [*B, T] bootstrap values to avoid it.
        from rollbuf.vectorized import last_unmasked_index

        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                "bootstrap_values of shape [*B] (the window-end column only) with truncated is "
                "validated by reading the flags back, a device sync that a CUDA graph capture "
                "cannot hold; pass bootstrap_values of shape [*B, T] when capturing"
            )

        t = tr != 0
        k = self.fields.get("terminated")
        if k is not None:
            t = t & (k == 0)  # terminated wins: nothing is read there
        T = self.shape[-1]
        m = self.fields.get("mask")
        if m is not None:
            t = t & (m != 0)
            j = last_unmasked_index(m != 0)
        else:
            j = torch.full(self.shape[:-1], T - 1, device=self.device)
        interior = t & (torch.arange(T, device=self.device) < j.unsqueeze(-1))
        if bool(interior.any()):
            raise ValueError(
                "bootstrap_values of shape [*B] holds the window-end column only, but truncated "
                "has truncations before the window end; pass bootstrap_values of shape [*B, T]"
            )

    def dtypes(self, out_dtype):
        compute = torch.float64 if any(x.dtype == torch.float64 for x in self.floats) else torch.float32
        if out_dtype is None:
            out = self.floats[0].dtype
            for x in self.floats[1:]:
                out = torch.promote_types(out, x.dtype)
        else:
            if out_dtype not in _FLOATS:
                raise TypeError(f"out_dtype must be a floating-point dtype, got {out_dtype}")
            out = out_dtype
        return compute, out

    def problem(self, family, outputs, out_dtype, carry=None, carry_shape=None, carry_name="carry",
                **params):
        B = self.shape[:-1]
        T = self.shape[-1]
        N = math.prod(B)
        flat = {}
        for name, x in self.fields.items():
            if x is None:
                flat[name] = None
            elif name == "x":
                flat[name] = x.reshape(N, T, *x.shape[len(self.shape):])
            elif name == "bootstrap_values" and x.dim() == len(B):
                flat[name] = x if x.dim() == 1 else x.reshape(N)
            else:
                flat[name] = x if x.dim() == 2 else x.reshape(N, T)
        if carry is not None:
            _tensor(carry_name, carry, _FLOATS, "a floating-point tensor")
            if tuple(carry.shape) != tuple(carry_shape):
                raise ValueError(f"{carry_name} must have shape {tuple(carry_shape)}, got {tuple(carry.shape)}")
            if carry.device != self.device:
                raise ValueError(f"{carry_name} is on {carry.device} but the rollout is on {self.device}")
            carry = carry.reshape(N, *carry.shape[len(B):])
        compute, out = self.dtypes(out_dtype)
        return Problem(
            family=family, outputs=outputs, fields=flat, carry=carry, compute_dtype=compute,
            out_dtype=out, batch_shape=tuple(B), **params,
        )


def _resolve_backend(backend, device):
    _choice("backend", backend, BACKENDS)
    if backend == "auto":
        if device.type == "cuda" and _triton_available():
            return "triton"
        # [compiled CPU backend routing] auto on CPU tensors: numba when importable
        return "numba" if device.type == "cpu" and _numba_available() else "torch"
    if backend == "numba":  # [compiled CPU backend routing]
        if not _numba_available():
            raise ValueError("backend='numba' needs the numba package, which is not importable")
        if device.type != "cpu":
            raise ValueError(f"backend='numba' runs on CPU tensors (got {device})")
    if backend == "triton":
        if not _triton_available():
            raise ValueError("backend='triton' needs the triton package, which is not importable")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"backend='triton' runs on CUDA tensors (got {device}); on the CPU set "
                "TRITON_INTERPRET=1 before importing rollbuf, or use backend='torch'"
            )
    return backend


@functools.cache
def _numba_available() -> bool:  # [compiled CPU backend routing]
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# Set by rollbuf.distributed for the duration of one call: receives the validated Problem of the
# rank's time shard, exchanges the shards' carries, and runs it through _run with the hook unset.
_RUN_HOOK: contextvars.ContextVar = contextvars.ContextVar("rollbuf_run_hook", default=None)


def _run(p: Problem, backend: str, reference_call, return_carry: bool):
    compiling = _compiling()
    hook = None if compiling else _RUN_HOOK.get()
    if hook is not None:
        return hook(p, backend, reference_call, return_carry)
    B = p.batch_shape
    p.want_carry = return_carry
    if backend == "reference":
        if (p.carry is not None and p.family != "trace") or return_carry:
            raise ValueError(
                "the reference backend computes whole windows: carry= and return_carry=True are "
                "for the torch and triton backends (chain the windows, or run the whole row)"
            )
        outs = reference_call()
        outs = outs if isinstance(outs, tuple) else (outs,)
        carry = None
    elif backend == "numba" and not compiling and not _autograd.needs_grad(p):
        # [compiled CPU backend routing] no gradients, not under torch.compile: the compiled loops;
        # otherwise the torch backend (below) computes the call and its gradients
        from rollbuf.backends import compiled_cpu

        outs, carry = compiled_cpu.run(p)
    elif backend in ("torch", "numba") or (compiling and _autograd.needs_grad(p)):
        # (gradients under torch.compile: the torch backend, traced and differentiated by
        # AOTAutograd, the scans through AffineScanFunction; the fused kernel has no traceable backward)
        from rollbuf import vectorized

        outs, carry = vectorized.run(p)
    elif compiling:  # one opaque custom op for Dynamo; the eager path launches directly
        from rollbuf.kernels import op

        outs, carry = op.run(p)
    elif _autograd.needs_grad(p):  # fused forward, backward through the torch backend
        outs, carry = _autograd.run(p)
    else:
        from rollbuf import kernels

        outs, carry = kernels.run(p)
    flat = len(B) == 1  # [N, T] in, [N, T] out: no reshape (the common case, kept cheap)
    T = p.main.shape[1]
    shaped = []
    for name, o in zip(p.outputs, outs):
        if name == "final":  # a carry too (the next window's `initial`): accumulation dtype
            o = o if flat else o.reshape(*B, *o.shape[1:])
            dt = p.compute_dtype
        else:
            o = o if flat else o.reshape(*B, T, *o.shape[2:])
            dt = p.out_dtype
        shaped.append(o if o.dtype == dt else o.to(dt))
    if return_carry:  # carries stay in the accumulation dtype: chains are exact to its rounding
        carry = carry if flat else carry.reshape(*B, *carry.shape[1:])
        carry = carry if carry.dtype == p.compute_dtype else carry.to(p.compute_dtype)
    return shaped, carry


def _finish(result, carry, return_carry):
    return (result, carry) if return_carry else result


# ---------------------------------------------------------------------------------------------
# estimators
# ---------------------------------------------------------------------------------------------


def _backward_call(rewards, values, terminated, truncated, bootstrap_values, mask, window_end,
                   carry, needs_values=True, needs_bootstrap=True):
    c = _Call("rewards", rewards)
    c.add_float("values", values, required=needs_values)
    c.add_flag("terminated", terminated)
    c.add_flag("truncated", truncated)
    c.add_flag("mask", mask)
    _choice("window_end", window_end, ("bootstrap", "terminal"))
    c.add_bootstrap(bootstrap_values, window_end, needed=needs_bootstrap and carry is None)
    return c


def gae(gamma, lam, *, rewards, values, terminated=None, truncated=None, bootstrap_values=None,
        mask=None, window_end="bootstrap", carry=None, return_carry=False, out_dtype=None,
        backend="auto"):
    r"""Generalized advantage estimation (Schulman et al., 2016).

    ``δ_t = r_t + γ(1−k_t)V'_t − V_t``, ``A_t = δ_t + γλ(1−d_t)A_{t+1}``; returns ``A + V``.
    ``V'_t`` is ``values[t+1]`` inside an episode and ``bootstrap_values[t]`` after a truncation or
    at the window end; terminated steps (``k_t``) never bootstrap; ``d_t`` (done) stops the trace.

    Returns :class:`GAEResult` ``(advantages, returns)``; outputs are 0 at masked steps.
    """
    gamma, lam = _unit("gamma", gamma), _unit("lam", lam)
    c = _backward_call(rewards, values, terminated, truncated, bootstrap_values, mask, window_end, carry)
    p = c.problem("lambda", ("advantages", "returns"), out_dtype, carry, c.shape[:-1],
                  gamma=gamma, lam=lam, window_end=window_end)
    be = _resolve_backend(backend, c.device)

    def ref():
        from rollbuf import reference

        f = p.fields
        return reference.gae(f["rewards"], f["values"], f["terminated"], f["truncated"],
                             f["bootstrap_values"], f["mask"], gamma, lam, window_end)

    outs, cout = _run(p, be, ref, return_carry)
    return _finish(GAEResult(*outs), cout, return_carry)


def advantages(gamma, lam, **kwargs):
    """The default advantage estimator: GAE advantages (see :func:`gae`)."""
    rc = kwargs.get("return_carry", False)
    res = gae(gamma, lam, **kwargs)
    return (res[0].advantages, res[1]) if rc else res.advantages


def lambda_returns(gamma, lam, *, rewards, values, terminated=None, truncated=None,
                   bootstrap_values=None, mask=None, window_end="bootstrap", carry=None,
                   return_carry=False, out_dtype=None, backend="auto"):
    r"""TD(λ) returns (Sutton, 1988), the λ-return of Sutton & Barto §12.1 with episode bounds.

    ``G_t = r_t + γ(1−k_t)[(1 − λ(1−d_t))V'_t + λ(1−d_t)G_{t+1}]``. Equals GAE advantages + values.
    """
    gamma, lam = _unit("gamma", gamma), _unit("lam", lam)
    c = _backward_call(rewards, values, terminated, truncated, bootstrap_values, mask, window_end, carry)
    p = c.problem("lambda", ("returns",), out_dtype, carry, c.shape[:-1], gamma=gamma, lam=lam,
                  window_end=window_end)
    be = _resolve_backend(backend, c.device)

    def ref():
        from rollbuf import reference

        f = p.fields
        return reference.lambda_returns(f["rewards"], f["values"], f["terminated"], f["truncated"],
                                        f["bootstrap_values"], f["mask"], gamma, lam, window_end)

    outs, cout = _run(p, be, ref, return_carry)
    return _finish(outs[0], cout, return_carry)


def discounted_returns(gamma, *, rewards, values=None, terminated=None, truncated=None,
                       bootstrap_values=None, mask=None, bootstrap=True, window_end="bootstrap",
                       carry=None, return_carry=False, out_dtype=None, backend="auto"):
    r"""Discounted returns.

    ``bootstrap=True``: ``G_t = r_t + γ(1−k_t)[d_t V'_t + (1−d_t)G_{t+1}]`` (= TD(1)): truncations
    and the window end bootstrap from ``bootstrap_values``; ``values`` is not read.
    ``bootstrap=False`` (Monte Carlo): ``G_t = r_t + γ(1−d_t)G_{t+1}``, ``G`` past the window is 0,
    truncations cut without bootstrap; neither ``values`` nor ``bootstrap_values`` is needed.
    """
    gamma = _unit("gamma", gamma)
    if not isinstance(bootstrap, bool):
        raise TypeError(f"bootstrap must be a bool, got {type(bootstrap).__name__}")
    c = _Call("rewards", rewards)
    if values is not None:
        _float_field("values", values, c.shape, c.device)  # accepted, not read
    c.add_flag("terminated", terminated)
    c.add_flag("truncated", truncated)
    c.add_flag("mask", mask)
    _choice("window_end", window_end, ("bootstrap", "terminal"))
    if bootstrap:
        c.add_bootstrap(bootstrap_values, window_end, needed=carry is None)
    else:
        c.fields["bootstrap_values"] = None
    c.fields["values"] = None
    p = c.problem("lambda", ("returns",), out_dtype, carry, c.shape[:-1], gamma=gamma, lam=1.0,
                  window_end=window_end if bootstrap else "terminal", no_bootstrap=not bootstrap)
    be = _resolve_backend(backend, c.device)

    def ref():
        from rollbuf import reference

        f = p.fields
        return reference.discounted_returns(f["rewards"], None, f["terminated"], f["truncated"],
                                            f["bootstrap_values"], f["mask"], gamma, bootstrap,
                                            p.window_end)

    outs, cout = _run(p, be, ref, return_carry)
    return _finish(outs[0], cout, return_carry)


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
    gamma, lam = _unit("gamma", gamma), _unit("lam", lam)
    rho_bar, c_bar = _positive("rho_bar", rho_bar), _positive("c_bar", c_bar)
    pg_rho_bar = rho_bar if pg_rho_bar is None else _positive("pg_rho_bar", pg_rho_bar)
    c = _backward_call(rewards, values, terminated, truncated, bootstrap_values, mask, window_end, carry)
    c.add_float("log_probs", log_probs)
    c.add_float("target_log_probs", target_log_probs)
    p = c.problem("vtrace", ("vs", "pg_advantages"), out_dtype, carry, (*c.shape[:-1], 2),
                  gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar,
                  window_end=window_end)
    be = _resolve_backend(backend, c.device)

    def ref():
        from rollbuf import reference

        f = p.fields
        return reference.vtrace(f["rewards"], f["values"], f["terminated"], f["truncated"],
                                f["bootstrap_values"], f["mask"], f["log_probs"],
                                f["target_log_probs"], gamma, rho_bar, c_bar, pg_rho_bar, lam,
                                window_end)

    outs, cout = _run(p, be, ref, return_carry)
    return _finish(VTraceResult(*outs), cout, return_carry)


def retrace(q_values, target_log_probs, gamma, lam=1.0, c_bar=1.0, *, rewards, values, log_probs,
            terminated=None, truncated=None, bootstrap_values=None, mask=None,
            window_end="bootstrap", carry=None, return_carry=False, out_dtype=None, backend="auto"):
    r"""Retrace(λ) Q targets (Munos et al., 2016).

    ``Q^ret_t = r_t + γ(1−k_t)[V'_t + (1−d_t)c_{t+1}(Q^ret_{t+1} − q_{t+1})]`` with
    ``c_t = λ·min(c̄, π/μ)``, ``q_t = Q(s_t, a_t)`` (``q_values``) and ``values`` = ``E_{a~π}Q(s_t, a)``.
    Note the trace of the *next* step, ``c_{t+1}``, as in the paper and rlax.
    """
    gamma, lam = _unit("gamma", gamma), _unit("lam", lam)
    c_bar = _positive("c_bar", c_bar)
    c = _backward_call(rewards, values, terminated, truncated, bootstrap_values, mask, window_end, carry)
    c.add_float("log_probs", log_probs)
    c.add_float("target_log_probs", target_log_probs)
    c.add_float("q_values", q_values)
    p = c.problem("retrace", ("q_targets",), out_dtype, carry, c.shape[:-1], gamma=gamma, lam=lam,
                  c_bar=c_bar, window_end=window_end)
    be = _resolve_backend(backend, c.device)

    def ref():
        from rollbuf import reference

        f = p.fields
        return reference.retrace(f["rewards"], f["values"], f["terminated"], f["truncated"],
                                 f["bootstrap_values"], f["mask"], f["log_probs"],
                                 f["target_log_probs"], f["q_values"], gamma, lam, c_bar,
                                 window_end)

    outs, cout = _run(p, be, ref, return_carry)
    return _finish(outs[0], cout, return_carry)


def _forward(name, x, terminated, truncated, mask, initial, decay, out_dtype, backend, ref_fn,
             reference_kwargs, result_cls):
    c = _Call("x", x, features=True)
    flags = [f for f in (terminated, truncated, mask) if f is not None]
    if not flags:
        raise ValueError(
            f"{name} needs terminated, truncated or mask of shape [*B, T] to place x's time "
            "dimension; pass terminated=torch.zeros(...) for a single episode"
        )
    if not isinstance(flags[0], torch.Tensor) or flags[0].dim() < 1:
        raise TypeError("terminated/truncated/mask must be tensors of shape [*B, T]")
    c.shape = tuple(flags[0].shape)
    k = len(c.shape)
    if x.dim() < k or tuple(x.shape[:k]) != c.shape:
        raise ValueError(f"x must have shape [*B, T, *F] with [*B, T] = {c.shape}, got {tuple(x.shape)}")
    if x.device != c.device or flags[0].device != x.device:
        raise ValueError("x and the flags must be on the same device")
    c.device = x.device
    c.add_flag("terminated", terminated)
    c.add_flag("truncated", truncated)
    c.add_flag("mask", mask)
    c.fields["x"] = x
    c.floats.append(x)
    F = tuple(x.shape[k:])
    carry = initial
    p = c.problem("trace", (name, "final"), out_dtype, carry, (*c.shape[:-1], *F), carry_name="initial",
                  decay=decay, feature_shape=F)
    be = _resolve_backend(backend, c.device)

    def ref():
        f = p.fields
        return ref_fn(f["x"], f["terminated"], f["truncated"], f["mask"], initial=p.carry,
                      **reference_kwargs)

    outs, _ = _run(p, be, ref, False)
    return result_cls(*outs)


def eligibility_traces(x, gamma, lam, initial=None, *, terminated=None, truncated=None, mask=None,
                       out_dtype=None, backend="auto"):
    r"""Accumulating eligibility traces, forward in time (Sutton & Barto §12.1).

    ``e_t = x_t + γλ(1−d_{t−1})e_{t−1}``, ``e_{−1} = initial`` (default 0); ``x`` is ``[*B, T]`` or
    ``[*B, T, *F]`` (e.g. per-parameter gradients); flags are ``[*B, T]``. ``final`` is
    ``(1−d_{T−1})·e_{T−1}``: pass it as the next window's ``initial``.
    """
    gamma, lam = _unit("gamma", gamma), _unit("lam", lam)
    from rollbuf import reference

    return _forward("traces", x, terminated, truncated, mask, initial, gamma * lam, out_dtype,
                    backend, reference.eligibility_traces, {"gamma": gamma, "lam": lam}, TracesResult)


def episodic_sums(x=None, initial=None, *, rewards=None, terminated=None, truncated=None,
                  mask=None, out_dtype=None, backend="auto"):
    r"""Running sums within episodes, forward in time: ``S_t = x_t + (1−d_{t−1})S_{t−1}``.

    ``x`` defaults to ``rewards`` (the running undiscounted episode return). ``final`` is
    ``(1−d_{T−1})·S_{T−1}``: the unfinished episodes' sums, to pass as the next ``initial``.
    """
    if x is None:
        if rewards is None:
            raise ValueError("episodic_sums needs x or rewards")
        x = rewards
    from rollbuf import reference

    return _forward("sums", x, terminated, truncated, mask, initial, 1.0, out_dtype, backend,
                    reference.episodic_sums, {}, SumsResult)


def affine_scan(alpha, beta, reverse=False, initial=None, *, backend="auto"):
    r"""The generic primitive: ``y_t = α_t + β_t·y_{t−1}`` (or ``y_{t+1}`` with ``reverse=True``).

    ``alpha`` and ``beta`` are ``[*B, T]``; ``initial`` (``[*B]``, default 0) is ``y`` just outside
    the row (``y_{−1}``, or ``y_T`` when reversed). Returns ``y`` ``[*B, T]``.
    """
    if not isinstance(reverse, bool):
        raise TypeError(f"reverse must be a bool, got {type(reverse).__name__}")
    c = _Call("alpha", alpha)
    c.add_float("beta", beta)
    B = c.shape[:-1]
    if initial is not None:
        _tensor("initial", initial, _FLOATS, "a floating-point tensor")
        if tuple(initial.shape) != tuple(B):
            raise ValueError(f"initial must have shape {tuple(B)}, got {tuple(initial.shape)}")
        if initial.device != c.device:
            raise ValueError(f"initial is on {initial.device} but alpha is on {c.device}")
    be = _resolve_backend(backend, c.device)
    compute, out = c.dtypes(None)
    N, T = math.prod(B), c.shape[-1]
    a = alpha.reshape(N, T)
    b = beta.reshape(N, T)
    init = torch.zeros(N, dtype=compute, device=c.device) if initial is None else initial.reshape(N)
    if be == "reference":
        from rollbuf import reference

        y = reference.affine_scan(a, b, reverse, init)
    elif be == "torch" or (be == "numba" and (_compiling() or torch.is_grad_enabled() and (
            a.requires_grad or b.requires_grad or init.requires_grad))):  # [compiled CPU backend routing]
        from rollbuf import vectorized

        y = vectorized.affine_scan(a.to(compute), b.to(compute), reverse, init.to(compute))
    else:
        p = Problem(family="affine", outputs=("y", "final"), fields={"x": a, "values": b}, carry=init,
                    compute_dtype=compute, out_dtype=compute, reverse=reverse)
        if be == "numba":  # [compiled CPU backend routing]
            from rollbuf.backends import compiled_cpu

            y = compiled_cpu.run(p)[0][0]
        elif _autograd.needs_grad(p):
            y = _autograd.run(p)[0][0]
        else:
            from rollbuf import kernels

            y = kernels.run(p)[0][0]
    return y.reshape(*B, T).to(out)
