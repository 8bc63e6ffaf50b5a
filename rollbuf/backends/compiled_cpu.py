"""The compiled CPU backend: every estimator as a sequential loop over time, compiled by numba.

On a CPU the fast algorithm is the plain one: each row is one pass over its steps in scan order,
every step read once and every output written once. The loop is :mod:`rollbuf.kernels.loop` (one
driver, specialised per family and direction, running the family's step, ``Row.step``); this
module is the call: layouts, outputs, threads.

Rows are independent: run one after the other (the rows order), or, when the main input is
time-major with at least ``LANES_MIN_ROWS`` rows, time outermost and the rows innermost (the lanes
order: memory read in order, the loop over the rows vectorised; the outputs returned as ``[N, T]``
views of ``[T, N]`` tensors, a per-step field laid out otherwise copied to time-major first). The
forward estimators' features are the lanes of their row. Fields are read in place; flags as bytes
(0/1 floating flags converted to bool first), floating fields in the accumulation dtype (converted
where they are in another); outputs written in it, converted to the output dtype after. With enough
work, contiguous ranges of rows run on ``torch.get_num_threads()`` plain threads (the loops release
the GIL; numba's ``prange`` pool spins next to torch's own and slows both).

:func:`run` has the torch backend's contract; no gradients (see :mod:`rollbuf.backends`). The loops
are compiled on first use and cached on disk (numba's cache, or ``NUMBA_CACHE_DIR``).
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch
from numba import njit

from rollbuf.backends import torch_backend
from rollbuf.kernels.families import FAMILIES
from rollbuf.kernels.loop import JIT, specialise
from rollbuf.kernels.row import Row
from rollbuf.problem import Family, Problem

__all__ = ["run", "pool", "PARALLEL_MIN_ELEMENTS", "PARALLEL_MIN_ROWS", "LANES_MIN_ROWS"]

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


# one compiled loop per family and direction (the affine scan runs both ways)
_DRIVERS = {(fam, reverse): specialise(fam, reverse, row.step(), row.state) for fam, row in FAMILIES.items()
            if row.step is not None for reverse in (True, False) if reverse == row.backward or fam == Family.AFFINE}


@njit(**JIT)
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

_POOL: dict[str, Any] = {"pool": None, "size": 0}
_POOL_LOCK = threading.Lock()


def _after_fork_in_child():
    _POOL["pool"], _POOL["size"] = None, 0  # the parent's worker threads do not exist in a child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def pool(workers: int):
    """The worker threads' pool, of ``workers`` threads (made anew when that changes)."""
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
    workers = pool(parts - 1)
    futures = [workers.submit(driver, r, *args, lanes) for r in ranges[1:]]
    driver(ranges[0], *args, lanes)
    for fut in futures:
        fut.result()


def _time_major(x):
    """Whether to run the lanes order on ``x`` ``[N, T]``: it steps through memory faster along its
    rows than along time, and has enough rows (``LANES_MIN_ROWS``)."""
    s = x.stride()
    return x.shape[0] >= LANES_MIN_ROWS and x.shape[1] > 1 and s[0] < s[1]


_FLAG_NAMES = ("terminated", "truncated", "mask")
# the families this module tells apart, as module constants (an enum member read off its class costs
# a Python-level lookup on Python 3.11, and a call reads several)
_TD_LAMBDA, _FORWARD, _AFFINE, _ADJOINT = Family.TD_LAMBDA, Family.FORWARD, Family.AFFINE, Family.TD_LAMBDA_ADJOINT


class _Args(NamedTuple):
    """One call as the loop reads it (see :func:`rollbuf.kernels.loop._drive`)."""
    nj: bool  # the rows are the lanes j (time outermost)
    lanes: bool  # the lanes order
    G: int  # rows g
    J: int  # lanes j of each
    data: tuple  # the main input and the step's data fields
    bounds: list  # terminated, truncated, mask
    cin: tuple | None  # the carry in
    res: list  # the outputs, as returned
    outs: tuple  # their addresses and strides


def _rows(p: Problem, row: Row, main: torch.Tensor, cin, npdt, keep: list) -> _Args:
    """One feature: the rows of ``[N, T]``, in the lanes order when ``main`` is time-major."""
    N, T, dt, f = main.shape[0], main.shape[1], p.compute_dtype, p.fields
    nj = _time_major(main)  # the rows are the lanes j, time outermost
    data = tuple([_field(main, dt, nj, keep)] + [_field(f.get(n), dt, nj, keep) for n in row.step_data])
    bounds = [None if (x := f.get(n)) is None else _field(x, None, nj, keep) for n in _FLAG_NAMES]
    n_out = row.step_outputs
    if n_out is None:  # TD(λ): the returns always (G is its first output); the adjoint: as asked
        n_out = (2 if "advantages" in p.outputs else 1) if p.family == _TD_LAMBDA else len(p.outputs)
    res, outs = _outputs(n_out, N, T, npdt, nj)
    return _Args(nj, nj, 1 if nj else N, N if nj else 1, data, bounds, _field(cin, dt, nj, keep, False), res, outs)


def _features(p: Problem, main: torch.Tensor, cin, npdt, keep: list) -> _Args:
    """The forward estimators' features ``[N, T, F]``: the features of row g are its lanes j, time
    outermost where they are nearer than steps."""
    N, T, Fn = main.shape
    dt, s = p.compute_dtype, main.stride()
    data = ((main.data_ptr(), s[0], s[2], s[1]),)
    bounds = [_field(p.fields.get(n), None, False, keep) for n in _FLAG_NAMES]
    bounds = [None if b is None else (b[0], b[1], None, b[3]) for b in bounds]  # shared: stride_j None
    if cin is not None:
        cin = cin.reshape(N, Fn)
        cin = cin if cin.dtype is dt else cin.to(dt)
        keep.append(cin)
        cin = (cin.data_ptr(), cin.stride(0), cin.stride(1), 0)
    out = torch.from_numpy(np.empty((N, T, Fn), npdt))
    return _Args(False, s[2] < s[1], N, Fn, data, bounds, cin, [out], ((out.data_ptr(),), (T * Fn, 1, Fn)))


def _window_end(p: Problem, row: Row, nj: bool, keep: list):
    """``(end_boot, bootstrap_values)``: whether the window end reads ``V(s_T)``, and the field the loop
    reads it from (``None``: no step reads one)."""
    if not row.backward:
        return False, None
    bv = None if p.no_bootstrap else p.fields.get("bootstrap_values")
    # the window end reads V(s_T) unless a carry is given or it is terminal
    end_boot = p.carry is None and p.window_end != "terminal" and not p.no_bootstrap
    if end_boot and bv is None:
        raise ValueError("bootstrap_values is required: the window end bootstraps from V(s_T)")
    return end_boot, _field(bv, p.compute_dtype, nj, keep)


def _empty(p: Problem):
    """No step to run: empty outputs; the carry passes through the affine scan and the adjoint."""
    N, T, dt, od = p.main.shape[0], p.main.shape[1], p.compute_dtype, p.out_dtype
    if p.family not in (_AFFINE, _ADJOINT):
        return torch_backend.run(p)
    c = torch.zeros(N, dtype=dt) if p.carry is None else p.carry.to(dt)
    if p.family == _AFFINE:
        return (torch.empty((N, T), dtype=od), c), None
    return tuple(torch.zeros((N, T), dtype=od) for _ in p.outputs), c


def _results(p: Problem, res: list, carry: torch.Tensor | None, shape):
    """The loop's outputs in ``p.outputs`` order and ``p.out_dtype``, and the carry, as ``run`` returns them."""
    fam = p.family
    if fam == _TD_LAMBDA:
        res = [res[1] if o == "advantages" else res[0] for o in p.outputs]
    if p.out_dtype is not p.compute_dtype:
        res = [o.to(p.out_dtype) for o in res]
    if fam == _FORWARD:
        assert carry is not None  # the forward families' final: always made
        return (res[0].reshape(shape), carry.reshape(shape[0], *shape[2:])), None
    if fam == _AFFINE:
        return (res[0], carry), None
    return tuple(res), carry


def run(p: Problem):
    """Run one validated problem (see :class:`rollbuf.problem.Problem`) on the CPU.

    Returns ``(outputs, carry)`` like the torch backend: per-step outputs ``[N, T]`` (``[N, T, *F]``
    for the forward estimators) in ``p.out_dtype``, 0 at masked steps; ``carry`` in
    ``p.compute_dtype``: the state at the window's first step (``[N]``, ``[N, 2]`` for V-trace) for
    the backward families when ``p.want_carry`` (else ``None``, as on the triton backend; an empty
    window may return one all the same), ``W_T`` for ``lambda_adjoint``, ``None`` for ``trace`` and
    ``affine`` (whose outputs end with ``final``). In the lanes order the outputs are ``[N, T]`` views of
    time-major tensors.
    """
    dt = p.compute_dtype
    npdt = _NUMPY.get(dt)
    if npdt is None:
        raise TypeError(f"the compiled CPU backend accumulates in float32 or float64, got {dt}")
    fam = p.family
    row = FAMILIES.get(fam)
    if row is None or row.step is None:
        raise ValueError(f"unknown family {fam!r}")
    main = p.main
    if not main.is_cpu:
        raise ValueError(f"the compiled CPU backend runs on CPU tensors, got {main.device}")
    shape = main.shape
    N, T = shape[0], shape[1]
    Fn = math.prod(shape[2:]) if fam == _FORWARD else 1  # the forward estimators' features
    if N == 0 or T == 0 or Fn == 0:
        return _empty(p)
    keep: list = []
    cin = p.carry
    if fam == _FORWARD:
        main = (main if main.dtype is dt else main.to(dt)).reshape(N, T, Fn)  # a view unless they cannot merge
        keep.append(main)
        if Fn == 1:  # one feature: rows as for the other families
            main = main[:, :, 0]
            cin = None if cin is None else cin.reshape(N)
    a = _rows(p, row, main, cin, npdt, keep) if Fn == 1 else _features(p, main, cin, npdt, keep)
    end_boot, bv = _window_end(p, row, a.nj, keep)
    # the carry out: the forward families' and the affine scan's final, the adjoint's W_T; else asked for
    carry, cout = _carry_out(N * Fn, row.state, npdt, a.nj, a.J) if p.want_carry or not row.backward else (None, None)
    prm = (_ZERO[dt], end_boot, tuple([float(getattr(p, n)) for n in row.scalars]))
    driver = _DRIVERS[fam, bool(p.reverse) if fam == _AFFINE else row.backward]
    _launch(driver, a.G, a.J, T, a.lanes, ((tuple([*a.bounds, bv]), a.data), a.outs, a.cin, cout, prm))
    return _results(p, a.res, carry, shape)
