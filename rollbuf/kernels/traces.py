"""Forward estimators: eligibility traces (``decay = γλ``) and episodic sums (``decay = 1``) over
``x`` of shape ``[N, T, *F]``: ``e_t = x_t + decay·(1−d_{t−1})·e_{t−1}``. State ``F_t = nd_t·e_t``
scanned forward with :func:`rollbuf.boundary.coefficients.trace_step`, outputs from
:func:`~rollbuf.boundary.coefficients.trace_out`; the row's carry out is ``final = F_{T−1}``.

Row ``n·F + f`` is feature ``f`` of environment ``n``: ``x`` and the traces at ``F·(n·s_n + t·s_t) + f``,
the flags at ``n·s_n + t·s_t`` (the one pair of strides, scaled by the feature count).
"""

import triton
import triton.language as tl

from rollbuf.boundary import coefficients as C
from rollbuf.kernels import core

trace_step = core.jit_boundary(C.trace_step)
trace_out = core.jit_boundary(C.trace_out)


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """``(x, k, tr, live)`` at the steps ``o``."""
    fields = fam[0]
    f, F = geo[1], geo[2]
    off = core.offsets(geo, o)
    k, tr, boot, live = core.boundary(fields, off, ok, ACC)
    x = core.load(fields[0], off * F + f, ok, live, fields[5] is not None, ACC)
    return x, k, tr, live


@triton.jit
def _step(fam, v, ACC: tl.constexpr):
    decay = fam[2][0]
    x, k, tr, live = v
    return core.identity_where(trace_step(x, k, tr, decay), live, False)


@triton.jit
def _emit(fam, geo, o, ok, v, z, ACC: tl.constexpr):
    decay = fam[2][0]
    p_out = fam[1][0]
    zu = z[0]
    x, k, tr, live = v
    f, F = geo[1], geo[2]
    tl.store(p_out + core.out_offsets(geo, o) * F + f, tl.where(live, trace_out(x, decay, zu), 0.0).to(p_out.dtype.element_ty), mask=ok)
    a, b = trace_step(x, k, tr, decay)
    return tl.where(live, a + b * zu, zu), zu


@triton.jit
def trace_kernel(
    fields,  # (x [N, T, F], None, terminated, truncated, None, mask [N, T]); None = absent
    p_out, p_ci, p_co, p_ws,  # traces [N, T, F]; initial / final [N, F]; look-back scratch
    R, T, F, s_n, s_t, s_on, s_ot,
    decay: "fp64",
    CARRY_IN: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    PASS: tl.constexpr, SHIFT_LOAD: tl.constexpr,
):
    """Eligibility traces and episodic sums, forward in time, ``R = N·F`` rows."""
    core.drive((fields, (p_out,), (tl.full((), decay, ACC),)), R, T, F, (s_n, s_t, s_on, s_ot), p_ci, p_co, p_ws, _load,
               _step, _emit, (False, False, False), False, CARRY_IN, ACC, BLOCK_N, BLOCK_T, PASS, SHIFT_LOAD)
