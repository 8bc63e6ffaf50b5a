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

from collections import namedtuple

import triton
import triton.language as tl

from rollbuf.kernels import core
from rollbuf.kernels.traces import coefficients as C

trace_step = core.jit_boundary(C.trace_step)
trace_out = core.jit_boundary(C.trace_out)
trace_next_step = core.jit_boundary(C.trace_next_step)
trace_state = core.jit_boundary(C.trace_state)

# x [N, T, F], (none), terminated, truncated, (none), mask [N, T]
Fields = namedtuple("Fields", "p_x p_v p_k p_tr p_bv p_m")
Outputs = namedtuple("Outputs", "p_out")  # traces [N, T, F]
Scalars = namedtuple("Scalars", "decay")
# a step's values (LOAD): the flags of the step before (0 before the row's first step) only without
# a mask
Steps = namedtuple("Steps", "x k tr live k_prev tr_prev")


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """:data:`Steps` at the steps ``o`` (``k_prev, tr_prev``: ``k, tr`` themselves with a mask, unused)."""
    fields = fam.fields
    off = core.offsets(geo, o)
    k, tr, _, live = core.boundary(fields, off, ok, ACC)
    x = core.load(fields.p_x, off * geo.F + geo.f, ok, live, fields.p_m is not None, ACC)
    if fields.p_m is None:
        before = ok & (o >= 1)
        off_p = core.offsets(geo, o - 1)
        k_prev = core.load_flag(fields.p_k, off_p, before, None, ACC)
        tr_prev = core.load_flag(fields.p_tr, off_p, before, None, ACC)
    else:
        k_prev = k
        tr_prev = tr
    return Steps(x, k, tr, live, k_prev, tr_prev)


@triton.jit
def _step(fam, v, ACC: tl.constexpr):
    decay = fam.scalars.decay
    if fam.fields.p_m is None:  # the maps of e itself
        return core.identity_where(trace_next_step(v.x, v.k_prev, v.tr_prev, decay), v.live, False)
    else:  # the maps of F
        return core.identity_where(trace_step(v.x, v.k, v.tr, decay), v.live, False)


@triton.jit
def _emit(fam, geo, o, ok, v, z, ACC: tl.constexpr):
    """Without a mask ``z.u`` is the inclusive ``e_t`` (the output; returns ``F_t``), with one the
    exclusive ``F_{t−1}`` (returns the inclusive ``F_t``)."""
    decay = fam.scalars.decay
    p_out, p_m = fam.outputs.p_out, fam.fields.p_m
    if p_m is None:
        e = z.u
        f_t = trace_state(z.u, v.k, v.tr)
    else:
        e = trace_out(v.x, decay, z.u)
        a, b = trace_step(v.x, v.k, v.tr, decay)
        f_t = tl.where(v.live, a + b * z.u, z.u)
    o_out = core.out_offsets(geo, o) * geo.F + geo.f
    tl.store(p_out + o_out, core.out_value(core.masked(e, v.live, p_m), p_out), mask=ok)
    return f_t, f_t


@triton.jit
def trace_kernel(
    fields,  # (x [N, T, F], None, terminated, truncated, None, mask [N, T]); None = absent
    outputs,  # (traces [N, T, F],)
    carries, sizes,  # core.Carries (initial / final [N, F]), core.Sizes (R = N·F rows)
    decay: "fp64",
    CFG: tl.constexpr,  # core.Config
):
    """Eligibility traces and episodic sums, forward in time, ``R = N·F`` rows."""
    f = Fields(*fields)
    core.drive(core.Fam(f, Outputs(*outputs), Scalars(tl.full((), decay, CFG.ACC))), core.Sizes(*sizes),
               core.Carries(*carries),
               core.Scan(_load, _step, _emit, PAIR=False, CARRY2=False, INCLUSIVE=f.p_m is None, REVERSE=False), CFG)
