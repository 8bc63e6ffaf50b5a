"""The compiled CPU backend: every estimator as a sequential loop over time, compiled by numba.

On a CPU the fast algorithm is the plain one: each row is one pass over its steps in scan order,
carrying its state, every step read once and every output written once. The arithmetic is not
restated here: the own-step coefficient functions of :mod:`rollbuf.boundary.coefficients` (the
source the torch backend runs on tensors and Triton compiles) are compiled by numba
(``njit(inline="always")``) and called on scalars; ``boot=None`` (no step reads a bootstrap value)
is a type, so its branch is compiled out.

**One driver.** Every family goes through one loop, :func:`_drive`, specialised per family and
direction (backward in time, or forward). It owns the rules the families share:

* a masked step is the identity: it writes 0 and hands the state on unchanged ("as if deleted");
* flags are read as 0/1 floats; ``bootstrap_values[t]`` is read only where step ``t`` is truncated
  and not terminated, through a branch, so a NaN in any other slot never reaches the arithmetic;
* backward, the state past the window end is the ``carry`` when given, else ``V(s_T)``
  (``bootstrap_values`` at the row's last unmasked step; 0 if that step terminated, or when the
  window end is terminal); forward, it is ``initial``, else 0; the state at the row's other end is
  the carry out (``final`` of the forward estimators).

A family is one function, ``step(data, at, k, tr, boot, prm, z0, z1)``: it loads the step's own
fields, calls the coefficient functions and returns the state one step further along the scan and
the step's outputs. A done step stops the state by multiplying it by 0 (``γ·nd``, ``nd·e``), so a
NaN or inf in the state goes on as ``0·NaN = NaN`` as in the reference loop and the other backends
(docs/semantics.md, "Non-finite inputs"); a clipped ratio is ``min(bar, ratio)`` with a NaN ratio
kept NaN and an overflowed one (``inf``) clipped to ``bar``. The state is two numbers ``(z0, z1)``:
V-trace's pair ``(u, V)``, which starts at ``(0, V(s_T))``; the other families leave ``z1`` at 0
(``NS = 1``: neither stored nor carried). The driver is specialised by binding the family's step
as a global of a copy of its code (numba caches a function that takes compiled functions as
arguments under a new key in every process, so ``cache=True`` would never hit); the copies' names
hold a hash of ``coefficients.py``, so that editing it recompiles them (numba checks only the
source file of the function it caches).

**Two loop orders.** Rows are independent. The driver runs them one after the other, the state in
registers (the rows order), or — when the main input is time-major (its stride over rows smaller
than over time) with at least ``LANES_MIN_ROWS`` rows — time outermost and the rows innermost (the
lanes order): memory is read in order, each row's state lives in a small array, and the loop over
the rows is vectorised. Its outputs are written time-major and returned as ``[N, T]`` views of
``[T, N]`` tensors, so that a caller writing them back into its time-major buffer copies memory in
order; a per-step field laid out otherwise (a flag ``[N, T]`` next to ``[T, N]`` buffers) is copied
to time-major first. Both orders run the same step on the same numbers: their results are equal
bit for bit. An address is ``(g, j, t)``: a row is ``g`` (rows order) or ``j`` (lanes order); the
features of the forward estimators are the lanes ``j`` of row ``g`` (time outermost where they are
nearer in memory than the steps). In the lanes order the step index reaches the loop over the lanes
through an empty assembly block (:func:`_opaque`): LLVM otherwise hoists the vectoriser's overlap
checks out of the loop over time and, the time step being negative in a backward scan, gives up
on vectorising.

**Arguments.** Every field and carry in is ``(address, stride_g, stride_j, stride_t)`` (``None`` when
absent: its loads are compiled out; a stride ``None`` is a 0 the compiler knows: flags shared by
the features), so any layout is read in place and shares one compiled loop per combination of
present fields, loop order and accumulation dtype. Outputs are ``(arrays, strides)``, the carry
out ``(array, stride_g, stride_j, stride_k)``. Flags are read as bytes (bool or uint8 tensors in
place; 0/1 floating flags are converted to bool first); floating fields in another dtype than the
accumulation dtype are converted to it first. The arithmetic and the state are float64 (the
parameters are Python floats); outputs are written in the accumulation dtype and converted to the
output dtype afterwards when that differs. The driver's seven arguments are ``rows`` ``(g0, g1,
j0, j1, T)``, ``fields`` ``((terminated, truncated, mask, bootstrap_values), data)``, the outputs,
the carry in, the carry out, ``prm`` ``(zero, end_boot, family parameters)`` and ``lanes`` (None:
rows order); no compiled function takes more than eight.

With enough work, contiguous ranges of rows run on ``torch.get_num_threads()`` threads at once (the
compiled loops release the GIL; plain threads rather than numba's ``prange``, whose OpenMP pool
spins next to torch's own and slows both).

The entry point is :func:`run` (same contract as the torch backend's ``run``). Gradients are not
computed here: a call whose inputs require grad goes to the torch backend (or is wrapped by the
autograd layer, whose TD(λ) adjoint is the ``lambda_adjoint`` family below). The loops are compiled
on first use and cached on disk (``cache=True``: numba's cache directory, next to this file or
``NUMBA_CACHE_DIR``); the first call of each family in a fresh environment compiles it, later
processes load it.
"""

from __future__ import annotations

import math
import os
import threading
import types as pytypes
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from llvmlite import ir as llvmir
from numba import njit, types
from numba.extending import intrinsic

from rollbuf.backends import torch_backend
from rollbuf.boundary import coefficients as C
from rollbuf.problem import Problem

__all__ = ["run", "PARALLEL_MIN_ELEMENTS", "PARALLEL_MIN_ROWS", "LANES_MIN_ROWS"]

# Rows are split over ``torch.get_num_threads()`` threads when there are at least this many rows
# and at least this many elements (steps × features) per thread; below, the calling thread runs
# every row (handing work to a thread costs more than it saves). Module attributes so that
# benchmarks and tests can move them.
PARALLEL_MIN_ROWS = 2
PARALLEL_MIN_ELEMENTS = 1 << 20
# Time-major inputs with at least this many rows run in the lanes order; fewer lanes cost more per
# step (the loop over them is too short to vectorise) than reading in order saves. (The features of
# the forward estimators are lanes whenever they are nearer in memory than the steps.)
LANES_MIN_ROWS = 16

_JIT = dict(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy", boundscheck=False)
_INLINE = dict(_JIT, inline="always")  # compiled into the caller (numba IR), not on their own

# the boundary coefficients, compiled from the source the torch and Triton backends run
_lambda_step, _lambda_out, _retrace_step, _vtrace_step, _vtrace_pg, _trace_out, _trace_state, \
    _adjoint_step, _adjoint_out = (njit(inline="always", error_model="numpy")(fn) for fn in (
        C.lambda_step, C.lambda_out, C.retrace_step, C.vtrace_step, C.vtrace_pg, C.trace_out,
        C.trace_state, C.lambda_adjoint_step, C.lambda_adjoint_out))


# ---------------------------------------------------------------------------------------------
# loads and stores at (g, j, t); a field is (address, stride_g, stride_j, stride_t) or None
# ---------------------------------------------------------------------------------------------


@intrinsic
def _load(typingctx, addr, index, like):
    """The element ``index`` of the array of ``like``'s type at address ``addr``."""

    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], context.get_value_type(sig.return_type).as_pointer())
        return builder.load(builder.gep(ptr, [args[1]]))

    return like(addr, index, like), codegen


@intrinsic
def _store(typingctx, addr, index, value, like):
    """Write ``value``, converted to ``like``'s type, as element ``index`` of the array at ``addr``."""

    def codegen(context, builder, sig, args):
        ty = sig.args[3]
        ptr = builder.inttoptr(args[0], context.get_value_type(ty).as_pointer())
        builder.store(context.cast(builder, args[2], sig.args[2], ty), builder.gep(ptr, [args[1]]))
        return context.get_dummy_value()

    return types.none(addr, index, value, like), codegen


@intrinsic
def _opaque(typingctx, x):
    """``x`` itself, through an empty assembly block the optimiser cannot see into (see the lanes
    loop of :func:`_drive`)."""

    def codegen(context, builder, sig, args):
        ty = context.get_value_type(sig.return_type)
        return builder.asm(llvmir.FunctionType(ty, [ty]), "", "=r,0", [args[0]], False)

    return types.intp(x), codegen


@njit(**_INLINE)
def _index(f, at):
    """The element of field ``f`` at ``at`` ``(g, j, t)``; a stride ``None`` is 0 known to the compiler
    (a field shared by the lanes: the loop over them stays vectorisable)."""
    return at[0] * f[1] + _times(at[1], f[2]) + at[2] * f[3]


@njit(**_JIT)
def _times(j, stride):
    if stride is None:
        return 0
    return j * stride


@njit(**_JIT)
def _ld(f, at, zero):
    """Field ``f`` at ``at`` in ``zero``'s type; 0 for an absent field."""
    if f is None:
        return zero
    return _load(f[0], _index(f, at), zero)


@njit(**_JIT)
def _flag(f, at):
    """A flag as 0.0 or 1.0 (any nonzero byte is set); 0 for an absent flag."""
    if f is None:
        return 0.0
    return 1.0 if _load(f[0], _index(f, at), np.uint8(0)) != 0 else 0.0


@njit(**_JIT)
def _live(m, at):
    if m is None:
        return True
    return _load(m[0], _index(m, at), np.uint8(0)) != 0


@njit(**_JIT)
def _bootstrap(b, tr, at, k, trv, zero):
    """``bootstrap_values`` at a truncated step that did not terminate (read through a branch), 0
    at other steps; ``None`` where no step reads one (then ``local = r``, compiled out)."""
    if b is None:
        return None
    if tr is None:
        return None
    if trv != 0.0 and k == 0.0:
        return _load(b[0], _index(b, at), zero)
    return zero


@njit(**_JIT)
def _window_end(b, k, m, row, T, zero):
    """``V(s_T)`` of a row: ``bootstrap_values`` at its last unmasked step (at the last step when no
    step is unmasked), 0 where that step terminated."""
    if b is None:
        return 0.0
    g, j = row
    end = T - 1
    while end >= 0 and not _live(m, (g, j, end)):
        end -= 1
    z = _load(b[0], _index(b, (g, j, end if end >= 0 else T - 1)), zero)
    if end >= 0 and _flag(k, (g, j, end)) != 0.0:
        return 0.0
    return z


@njit(**_INLINE)
def _write(outs, at, vals, zero):
    """The step's outputs into ``outs`` ``(addresses, (stride_g, stride_j, stride_t))``, in ``zero``'s
    type."""
    addrs, s = outs
    i = at[0] * s[0] + at[1] * s[1] + at[2] * s[2]
    for o in range(len(addrs)):
        _store(addrs[o], i, vals[o], zero)


@njit(**_INLINE)
def _write0(outs, at, zero):
    addrs, s = outs
    i = at[0] * s[0] + at[1] * s[1] + at[2] * s[2]
    for o in range(len(addrs)):
        _store(addrs[o], i, zero, zero)


@njit(**_INLINE)
def _clip(ratio, bar):
    """``min(bar, ratio)`` that keeps a NaN ratio NaN (``ratio if ratio < bar else bar`` would give
    ``bar``: every comparison with NaN is false); an overflowed ratio (inf) is clipped to ``bar``."""
    return bar if ratio > bar else ratio


# ---------------------------------------------------------------------------------------------
# the driver: one row-loop for every family, specialised per family and direction (below); the
# family's STEP and NS (its state size), and REVERSE, are globals of each specialised copy
# ---------------------------------------------------------------------------------------------


def _visit(fields, outs, prm, at, z0, z1):
    """One step of one row: masked, the identity writing 0; else the family's step."""
    k, tr, m, b = fields[0]
    zero = prm[0]
    if not _live(m, at):
        _write0(outs, at, zero)
        return z0, z1
    kv = _flag(k, at)
    trv = _flag(tr, at)
    z, vals = STEP(fields[1], at, kv, trv, _bootstrap(b, tr, at, kv, trv, zero), prm, z0, z1)  # noqa: F821
    _write(outs, at, vals, zero)
    return np.float64(z[0]), np.float64(z[1])


def _enter(cin, bounds, prm, g, j, T):
    """The state past the row's far end: the carry in; else 0, or backward ``V(s_T)`` (the pair
    state of V-trace: ``(u, V) = (0, V(s_T))``)."""
    if cin is not None:
        z0 = np.float64(_ld(cin, (g, j, 0), prm[0]))
        return z0, (np.float64(_ld(cin, (g, j, 1), prm[0])) if NS == 2 else 0.0)  # noqa: F821
    z = 0.0
    if REVERSE and prm[1]:  # noqa: F821
        z = np.float64(_window_end(bounds[3], bounds[0], bounds[2], (g, j), T, prm[0]))
    return (0.0, z) if NS == 2 else (z, 0.0)  # noqa: F821


def _leave(cout, g, j, z0, z1, zero):
    """The state at the row's near end into the carry out ``(address, stride_g, stride_j, stride_k)``."""
    i = g * cout[1] + j * cout[2]
    _store(cout[0], i, z0, zero)
    if NS == 2:  # noqa: F821
        _store(cout[0], i + cout[3], z1, zero)


def _drive(rows, fields, outs, cin, cout, prm, lanes):
    """Rows ``g0 ≤ g < g1`` × ``j0 ≤ j < j1`` over ``T`` steps: one row at a time (``lanes`` None),
    or every step of all of them before the next (``lanes`` True), one state per row in ``S``."""
    g0, g1, j0, j1, T = rows
    if lanes is None:
        for g in range(g0, g1):
            for j in range(j0, j1):
                z0, z1 = _enter(cin, fields[0], prm, g, j, T)
                for i in range(T):
                    z0, z1 = _visit(fields, outs, prm, (g, j, T - 1 - i if REVERSE else i), z0, z1)  # noqa: F821
                _leave(cout, g, j, z0, z1, prm[0])
    else:
        S = np.empty((2, j1 - j0), np.float64)
        for g in range(g0, g1):
            for j in range(j0, j1):
                S[0, j - j0], S[1, j - j0] = _enter(cin, fields[0], prm, g, j, T)
            for i in range(T):
                t = _opaque(T - 1 - i if REVERSE else i)  # keeps the lanes loop vectorised  # noqa: F821
                for j in range(j0, j1):
                    z0, z1 = _visit(fields, outs, prm, (g, j, t), S[0, j - j0], S[1, j - j0])
                    S[0, j - j0] = z0
                    if NS == 2:  # noqa: F821
                        S[1, j - j0] = z1
            for j in range(j0, j1):
                _leave(cout, g, j, S[0, j - j0], S[1, j - j0], prm[0])


# the compiled copies are named after this hash of coefficients.py (see the module docstring)
with open(C.__file__, "rb") as _src:
    _TAG = format(zlib.crc32(_src.read()), "08x")


def _specialise(name, reverse, step, ns):
    """``_drive`` (and the functions it calls) compiled for one family and direction."""
    ns_ = dict(globals(), STEP=step, NS=ns, REVERSE=reverse)
    tag = f"{name}_{'backward' if reverse else 'forward'}_{_TAG}"
    for fname in ("_visit", "_enter", "_leave", "_drive"):
        fn = globals()[fname]
        copy = pytypes.FunctionType(fn.__code__, ns_, fname)
        copy.__qualname__ = f"{fname}_{tag}"
        copy.__module__, copy.__doc__ = fn.__module__, fn.__doc__
        ns_[fname] = njit(**(_INLINE if fname != "_drive" else _JIT))(copy)
    return ns_["_drive"]


# ---------------------------------------------------------------------------------------------
# the families: one step each, ``step(data, at, k, tr, boot, prm, z0, z1) -> ((z0, z1), outputs)``:
# the step's own fields, the coefficient functions, the state one step further along the scan
# ---------------------------------------------------------------------------------------------


@njit(**_JIT)
def _lambda(data, at, k, tr, boot, prm, z0, z1):
    """TD(λ), GAE, discounted returns (λ = 1), Monte Carlo (boot ≡ 0, V ≡ 0): data (rewards,
    values), outputs (G, A = G − V), state Z = (1−λ)V + λG."""
    r, v = _ld(data[0], at, prm[0]), _ld(data[1], at, prm[0])
    gamma, lam = prm[2]
    a, b = _lambda_step(r, v, k, tr, boot, gamma, lam)
    g = _lambda_out(r, k, tr, boot, gamma, z0)
    return (a + b * z0, 0.0), (g, g - v)


@njit(**_JIT)
def _retrace(data, at, k, tr, boot, prm, z0, z1):
    """Retrace(λ): data (rewards, values, q_values, log_probs, target_log_probs), output Q, state
    W = V + c(Q − q), c = λ·min(c̄, π/μ)."""
    zero = prm[0]
    gamma, lam, c_bar = prm[2]
    r, v = _ld(data[0], at, zero), _ld(data[1], at, zero)
    c = lam * _clip(np.exp(_ld(data[4], at, zero) - _ld(data[3], at, zero)), c_bar)
    a, b = _retrace_step(r, v, k, tr, boot, _ld(data[2], at, zero), c, gamma)
    return (a + b * z0, 0.0), (_lambda_out(r, k, tr, boot, gamma, z0),)


@njit(**_JIT)
def _vtrace(data, at, k, tr, boot, prm, u_next, v_next):
    """V-trace: data (rewards, values, log_probs, target_log_probs), outputs (vs, pg), state (u, V)."""
    zero = prm[0]
    gamma, lam, rho_bar, c_bar, pg_rho_bar = prm[2]
    r, v = _ld(data[0], at, zero), _ld(data[1], at, zero)
    ratio = np.exp(_ld(data[3], at, zero) - _ld(data[2], at, zero))
    p, q, _, a, w = _vtrace_step(r, v, k, tr, boot, _clip(ratio, rho_bar), lam * _clip(ratio, c_bar), gamma)
    pg = _vtrace_pg(r, v, k, tr, boot, _clip(ratio, pg_rho_bar), gamma, v_next + u_next)
    u = a + p * u_next + q * v_next  # the pair map; its V part is V_t itself
    return (u, w), (v + u, pg)


@njit(**_JIT)
def _trace(data, at, k, tr, boot, prm, f_prev, z1):
    """Eligibility traces (decay = γλ), episodic sums (decay = 1), forward: data (x,), state F = nd·e."""
    e = _trace_out(_ld(data[0], at, prm[0]), prm[2][0], f_prev)
    return (_trace_state(e, k, tr), 0.0), (e,)


@njit(**_JIT)
def _adjoint(data, at, k, tr, boot, prm, w, z1):
    """The TD(λ) adjoint, forward: data (∂L/∂G, ∂L/∂A), outputs (r̄, V̄), state W."""
    ga = _ld(data[1], at, prm[0])
    g = _ld(data[0], at, prm[0]) + ga
    gamma, lam = prm[2]
    a, b = _adjoint_step(g, k, tr, gamma, lam)
    return (a + b * w, 0.0), _adjoint_out(g, ga, lam, w)


@njit(**_JIT)
def _affine(data, at, k, tr, boot, prm, y, z1):
    """The generic primitive y_t = α_t + β_t·y_{t∓1}: data (α, β), output y, state y."""
    y = _ld(data[0], at, prm[0]) + _ld(data[1], at, prm[0]) * y
    return (y, 0.0), (y,)


# family: (step, state size, the data fields after the main input, outputs (None: as the problem
# asks), parameters, whether the window end reads V(s_T))
_FAMILIES = {
    "lambda": (_lambda, 1, ("values",), None, ("gamma", "lam"), True),
    "retrace": (_retrace, 1, ("values", "q_values", "log_probs", "target_log_probs"), 1, ("gamma", "lam", "c_bar"),
                True),
    "vtrace": (_vtrace, 2, ("values", "log_probs", "target_log_probs"), 2,
               ("gamma", "lam", "rho_bar", "c_bar", "pg_rho_bar"), True),
    "trace": (_trace, 1, (), 1, ("decay",), False),
    "lambda_adjoint": (_adjoint, 1, ("grad_advantages",), None, ("gamma", "lam"), False),
    "affine": (_affine, 1, ("beta",), 1, (), False),
}
_DRIVERS = {(fam, reverse): _specialise(fam, reverse, spec[0], spec[1]) for fam, spec in _FAMILIES.items()
            for reverse in (True, False) if reverse == spec[5] or fam == "affine"}


# ---------------------------------------------------------------------------------------------
# the call
# ---------------------------------------------------------------------------------------------


@njit(**_JIT)
def _transpose(src, dst):
    """``dst[t, n] = src[n, t]``, in tiles of 32 rows × 32 steps."""
    N, T = src.shape
    for n0 in range(0, N, 32):
        for t0 in range(0, T, 32):
            for t in range(t0, min(t0 + 32, T)):
                for n in range(n0, min(n0 + 32, N)):
                    dst[t, n] = src[n, t]


_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}
_ZERO = {torch.float32: np.float32(0), torch.float64: np.float64(0)}  # the accumulation dtype's 0

_POOL = {"pool": None, "size": 0}
_POOL_LOCK = threading.Lock()


def _after_fork_in_child():
    _POOL["pool"], _POOL["size"] = None, 0  # the parent's worker threads do not exist in a child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _pool(workers):
    with _POOL_LOCK:
        if _POOL["pool"] is None or _POOL["size"] != workers:

            if _POOL["pool"] is not None:
                _POOL["pool"].shutdown(wait=False)
            _POOL["pool"] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollbuf-cpu")
            _POOL["size"] = workers
        return _POOL["pool"]


def _field(x, dt, nj, keep, per_step=True):
    """``x`` ``[N, T]`` (or ``[N]``, ``[N, K]``: a column along time, a carry's components) as
    ``(address, stride_g, stride_j, stride_t)``, its rows ``j`` (``nj``) or ``g``; converted to the
    accumulation dtype ``dt`` where it is in another (``dt`` None: a flag, converted to bool where it
    is neither bool nor uint8); ``None`` for an absent field. In the lanes order a per-step field
    that is not time-major (a flag made ``[N, T]`` next to ``[T, N]`` buffers, a field broadcast over
    the rows) is copied to time-major first: a transposing copy costs less than the loop over the
    lanes when it cannot be vectorised."""
    if x is None:
        return None
    if dt is None:
        if x.dtype is not torch.bool and x.dtype is not torch.uint8:
            x = x != 0
            keep.append(x)
    elif x.dtype is not dt:
        x = x.to(dt)
        keep.append(x)
    s = x.stride()
    if nj and per_step and s[0] != 1 and len(s) > 1 and x.shape[1] > 1:
        src = (x.view(torch.uint8) if x.dtype is torch.bool else x).numpy()  # a flag: its bytes
        dst = np.empty(src.shape[::-1], src.dtype)
        _transpose(src, dst)  # on this thread (torch's copy would wake its thread pool)
        x = torch.from_numpy(dst).mT
        keep.append(x)
        s = x.stride()
    st = s[1] if len(s) > 1 else 0
    return (x.data_ptr(), 0, s[0], st) if nj else (x.data_ptr(), s[0], 0, st)


def _outputs(n, N, T, npdt, nj):
    """``n`` (1 or 2) outputs ``[N, T]`` in the accumulation dtype, and what the driver writes them
    through: views of ``[T, N]`` arrays when the rows are the lanes ``j`` (written in memory order)."""
    if nj:
        o = torch.from_numpy(np.empty((T, N), npdt).T)
        res = [o] if n == 1 else [o, torch.from_numpy(np.empty((T, N), npdt).T)]
        strides = (0, 1, N)
    else:
        o = torch.from_numpy(np.empty((N, T), npdt))
        res = [o] if n == 1 else [o, torch.from_numpy(np.empty((N, T), npdt))]
        strides = (T, 0, 1)
    return res, ((o.data_ptr(),) if n == 1 else (o.data_ptr(), res[1].data_ptr()), strides)


def _carry_out(N, k, npdt, nj, J=1):
    """The carry out ``[N]`` (``[N, k]`` for ``k`` > 1, ``N = G·J``), and its address and strides."""
    c = torch.from_numpy(np.empty((N,) if k == 1 else (N, k), npdt))
    return c, ((c.data_ptr(), 0, k, 1) if nj else (c.data_ptr(), k * J, k, 1))


def _launch(driver, G, J, T, lanes, args):
    """Run ``driver`` over rows ``g`` < ``G`` × ``j`` < ``J``: on this thread, or with enough work split
    into contiguous ranges of rows over ``torch.get_num_threads()`` threads (the loops release the
    GIL); ``args``: the driver's arguments after ``rows``."""
    lanes = True if lanes else None
    rows = G if G > 1 else J  # split over g when there is more than one, else over j
    work = G * J * T
    parts = 1
    if rows >= PARALLEL_MIN_ROWS and work >= PARALLEL_MIN_ELEMENTS:
        parts = min(torch.get_num_threads(), rows, work // PARALLEL_MIN_ELEMENTS)
    if parts <= 1:
        driver((0, G, 0, J, T), *args, lanes)
        return
    b = [rows * i // parts for i in range(parts + 1)]
    ranges = [(b[i], b[i + 1], 0, J, T) if G > 1 else (0, G, b[i], b[i + 1], T) for i in range(parts)]
    pool = _pool(parts - 1)
    futures = [pool.submit(driver, r, *args, lanes) for r in ranges[1:]]
    driver(ranges[0], *args, lanes)
    for fut in futures:
        fut.result()


def _time_major(x):
    """Whether to run the lanes order on ``x`` ``[N, T]``: it steps through memory faster along its
    rows than along time, and has enough rows (``LANES_MIN_ROWS``)."""
    s = x.stride()
    return x.shape[0] >= LANES_MIN_ROWS and x.shape[1] > 1 and s[0] < s[1]


_FLAG_NAMES = ("terminated", "truncated", "mask")


def run(p: Problem):
    """Run one validated problem (see :class:`rollbuf.problem.Problem`) on the CPU.

    Returns ``(outputs, carry)`` like the torch backend: per-step outputs ``[N, T]`` (``[N, T, *F]``
    for the forward estimators) in ``p.out_dtype``, 0 at masked steps; ``carry`` in
    ``p.compute_dtype``: the state at the window's first step (``[N]``, ``[N, 2]`` for V-trace) for
    the backward families, ``W_T`` for ``lambda_adjoint``, ``None`` for ``trace`` and ``affine``
    (whose outputs end with ``final``). In the lanes order the outputs are ``[N, T]`` views of
    time-major tensors.
    """
    fam = p.family
    f = p.fields
    dt = p.compute_dtype
    npdt = _NUMPY.get(dt)
    if npdt is None:
        raise TypeError(f"the compiled CPU backend accumulates in float32 or float64, got {dt}")
    spec = _FAMILIES.get(fam)
    if spec is None:
        raise ValueError(f"unknown family {fam!r}")
    _, ns, names, n_out, params, boots = spec
    main = p.main
    if main.device.type != "cpu":
        raise ValueError(f"the compiled CPU backend runs on CPU tensors, got {main.device}")
    shape = main.shape
    N, T = shape[0], shape[1]
    od = p.out_dtype
    feat = shape[2:]  # the forward estimators' features
    Fn = math.prod(feat) if feat else 1
    if N == 0 or T == 0 or Fn == 0:
        if fam == "affine" or fam == "lambda_adjoint":  # the carry passes through an empty window
            c = torch.zeros(N, dtype=dt) if p.carry is None else p.carry.to(dt)
            outs = (torch.empty((N, T), dtype=od),) if fam == "affine" else (
                tuple(torch.zeros((N, T), dtype=od) for _ in p.outputs))
            return (outs + (c,), None) if fam == "affine" else (outs, c)
        return torch_backend.run(p)
    keep = []
    cin = p.carry
    if fam == "trace":
        main = (main if main.dtype is dt else main.to(dt)).reshape(N, T, Fn)  # a view unless they cannot merge
        keep.append(main)
        if Fn == 1:  # one feature: rows as for the other families
            main = main[:, :, 0]
            cin = None if cin is None else cin.reshape(N)
    if Fn == 1:
        nj = lanes = _time_major(main)  # the rows are the lanes j, time outermost
        G, J = (1, N) if nj else (N, 1)
        data = tuple([_field(main, dt, nj, keep)] + [_field(f.get(n), dt, nj, keep) for n in names])
        bounds = [_field(f.get(n), None, nj, keep) for n in _FLAG_NAMES]
        cin = _field(cin, dt, nj, keep, False)
        if n_out is None:  # TD(λ): the returns always (G is its first output); the adjoint: as asked
            n_out = (2 if "advantages" in p.outputs else 1) if fam == "lambda" else len(p.outputs)
        res, outs = _outputs(n_out, N, T, npdt, nj)
    else:  # the features of row g are its lanes j, time outermost where they are nearer than steps
        s = main.stride()
        nj, lanes, G, J = False, s[2] < s[1], N, Fn
        data = ((main.data_ptr(), s[0], s[2], s[1]),)
        bounds = [_field(f.get(n), None, False, keep) for n in _FLAG_NAMES]
        bounds = [None if b is None else (b[0], b[1], None, b[3]) for b in bounds]  # shared: stride_j None
        if cin is not None:
            cin = cin.reshape(N, Fn)
            cin = cin if cin.dtype is dt else cin.to(dt)
            keep.append(cin)
            cin = (cin.data_ptr(), cin.stride(0), cin.stride(1), 0)
        out = torch.from_numpy(np.empty((N, T, Fn), npdt))
        res, outs = [out], ((out.data_ptr(),), (T * Fn, 1, Fn))
    end_boot = False
    if boots:
        bv = None if p.no_bootstrap else f.get("bootstrap_values")
        # the window end reads V(s_T) unless a carry is given or it is terminal
        end_boot = p.carry is None and p.window_end != "terminal" and not p.no_bootstrap
        if end_boot and bv is None:
            raise ValueError("bootstrap_values is required: the window end bootstraps from V(s_T)")
        bounds.append(_field(bv, dt, nj, keep))
    else:
        bounds.append(None)
    carry, cout = _carry_out(N * Fn, ns, npdt, nj, J)
    prm = (_ZERO[dt], end_boot, tuple([float(getattr(p, n)) for n in params]))
    driver = _DRIVERS[fam, bool(p.reverse) if fam == "affine" else boots]
    _launch(driver, G, J, T, lanes, ((tuple(bounds), data), outs, cin, cout, prm))
    if fam == "lambda":
        res = [res[1] if o == "advantages" else res[0] for o in p.outputs]
    if od is not dt:
        res = [o.to(od) for o in res]
    if fam == "trace":
        return (res[0].reshape(shape), carry.reshape(N, *feat)), None
    if fam == "affine":
        return (res[0], carry), None
    return tuple(res), carry
