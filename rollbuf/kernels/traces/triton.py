"""Forward estimators: eligibility traces (``decay = γλ``) and episodic sums (``decay = 1``) over
``x`` of shape ``[N, T, *F]``: ``e_t = x_t + decay·(1−d_{t−1})·e_{t−1}``. State ``F_t = nd_t·e_t``
scanned forward with :func:`rollbuf.boundary.coefficients.trace_step`, outputs from
:func:`~rollbuf.boundary.coefficients.trace_out`; the row's carry out is ``final = F_{T−1}``.

Without a mask the step before is the one before in memory, and the kernel scans the trace itself
(:func:`~rollbuf.boundary.coefficients.trace_next_step`: ``α_t = x_t``, ``β_t = decay·nd_{t−1}``, the
flags of the step before read from memory, as rl-triton's kernel does), so the output is the scan's
inclusive state: ``x`` is read at its own steps only (aligned loads), no shift, and ``final =
nd_{T−1}·e_{T−1}`` (:func:`~rollbuf.boundary.coefficients.trace_state`). With a mask, ``F_t`` is
scanned and the output reads the exclusive state.

Row ``n·F + f`` is feature ``f`` of environment ``n``: ``x`` and the traces at ``F·(n·s_n + t·s_t) + f``,
the flags at ``n·s_n + t·s_t`` (the one pair of strides, scaled by the feature count).
"""

import triton
import triton.language as tl

from rollbuf.boundary import coefficients as C
from rollbuf.kernels import core

trace_step = core.jit_boundary(C.trace_step)
trace_out = core.jit_boundary(C.trace_out)
trace_next_step = core.jit_boundary(C.trace_next_step)
trace_state = core.jit_boundary(C.trace_state)


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """``(x, k, tr, live, k_prev, tr_prev)`` at the steps ``o``; the flags of the step before
    (0 before the row's first step) only without a mask (else ``k, tr``, unused)."""
    fields = fam[0]
    f, F = geo[1], geo[2]
    off = core.offsets(geo, o)
    k, tr, boot, live = core.boundary(fields, off, ok, ACC)
    x = core.load(fields[0], off * F + f, ok, live, fields[5] is not None, ACC)
    if fields[5] is None:
        before = ok & (o >= 1)
        off_p = core.offsets(geo, o - 1)
        k_prev = core.load_flag(fields[2], off_p, before, None, ACC)
        tr_prev = core.load_flag(fields[3], off_p, before, None, ACC)
    else:
        k_prev = k
        tr_prev = tr
    return x, k, tr, live, k_prev, tr_prev


@triton.jit
def _step(fam, v, ACC: tl.constexpr):
    decay = fam[2][0]
    x, k, tr, live, k_prev, tr_prev = v
    if fam[0][5] is None:  # the maps of e itself
        return core.identity_where(trace_next_step(x, k_prev, tr_prev, decay), live, False)
    else:  # the maps of F
        return core.identity_where(trace_step(x, k, tr, decay), live, False)


@triton.jit
def _emit(fam, geo, o, ok, v, z, ACC: tl.constexpr):
    """Without a mask ``z`` is the inclusive ``e_t`` (the output; returns ``F_t``), with one the
    exclusive ``F_{t−1}`` (returns the inclusive ``F_t``)."""
    decay = fam[2][0]
    p_out = fam[1][0]
    zu = z[0]
    x, k, tr, live, k_prev, tr_prev = v
    f, F = geo[1], geo[2]
    if fam[0][5] is None:
        e = zu
        f_t = trace_state(zu, k, tr)
    else:
        e = trace_out(x, decay, zu)
        a, b = trace_step(x, k, tr, decay)
        f_t = tl.where(live, a + b * zu, zu)
    tl.store(p_out + core.out_offsets(geo, o) * F + f, core.out_value(core.masked(e, live, fam[0][5]), p_out), mask=ok)
    return f_t, f_t


@triton.jit
def trace_kernel(
    fields,  # (x [N, T, F], None, terminated, truncated, None, mask [N, T]); None = absent
    p_out, p_ci, p_co, p_ws,  # traces [N, T, F]; initial / final [N, F]; look-back scratch
    R, T, F, s_n, s_t, s_on, s_ot,
    decay: "fp64",
    CARRY_IN: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    PASS: tl.constexpr, SHIFT_LOAD: tl.constexpr, FLIP: tl.constexpr,
):
    """Eligibility traces and episodic sums, forward in time, ``R = N·F`` rows."""
    core.drive((fields, (p_out,), (tl.full((), decay, ACC),)), R, T, F, (s_n, s_t, s_on, s_ot), p_ci, p_co, p_ws, _load,
               _step, _emit, (False, False, fields[5] is None), False, CARRY_IN, ACC, BLOCK_N, BLOCK_T, PASS, SHIFT_LOAD,
               FLIP)
