"""Retrace(λ) (Munos et al., 2016): ``Q^ret_t = local_t + γ·nd_t·W_{t+1}``, state
``W_t = V_t + c_t(Q^ret_t − q_t)`` scanned backward with the coefficients of
:func:`rollbuf.boundary.coefficients.retrace_step`, ``c_t = λ·min(c̄, π/μ)``.
"""

import triton
import triton.language as tl

from rollbuf.boundary import coefficients as C
from rollbuf.kernels import core

retrace_step = core.jit_boundary(C.retrace_step)
lambda_out = core.jit_boundary(C.lambda_out)


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """``(r, v, k, tr, boot, live, q, c)`` at the steps ``o``."""
    fields, outs, scal = fam
    gamma, lam, c_bar = scal
    p_r, p_v, p_m, p_lp, p_tlp, p_q = fields[0], fields[1], fields[5], fields[6], fields[7], fields[8]
    HAS_M: tl.constexpr = p_m is not None
    off = core.offsets(geo, o)
    k, tr, boot, live = core.boundary(fields, off, ok, ACC)
    r = core.load(p_r, off, ok, live, HAS_M, ACC)
    v = core.load(p_v, off, ok, live, HAS_M, ACC)
    ratio = tl.exp(core.load(p_tlp, off, ok, live, HAS_M, ACC) - core.load(p_lp, off, ok, live, HAS_M, ACC))
    q = core.load(p_q, off, ok, live, HAS_M, ACC)
    # the clip propagates a NaN ratio (the GPU's min would drop it), as on every backend
    return r, v, k, tr, boot, live, q, lam * tl.minimum(ratio, c_bar, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    gamma = fam[2][0]
    r, v, k, tr, boot, live, q, c = x
    if fam[0][3] is None or fam[0][4] is None:  # no step reads one (core.boundary)
        boot = None
    return core.identity_where(retrace_step(r, v, k, tr, boot, q, c, gamma), live, False)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    gamma = fam[2][0]
    p_out = fam[1][0]
    zu = z[0]
    r, v, k, tr, boot, live, q, c = x
    if fam[0][3] is None or fam[0][4] is None:  # no step reads one (core.boundary)
        boot = None
    q_ret = core.masked(lambda_out(r, k, tr, boot, gamma, zu), live, fam[0][5])
    tl.store(p_out + core.out_offsets(geo, o), core.out_value(q_ret, p_out), mask=ok)
    a, b = retrace_step(r, v, k, tr, boot, q, c, gamma)
    return tl.where(live, a + b * zu, zu), zu


@triton.jit
def retrace_kernel(
    fields,  # (rewards, values, terminated, truncated, bootstrap_values, mask, log_probs, target_log_probs,
             #  q_values): [N, T] at (s_n, s_t); None = absent
    p_q, p_ci, p_co, p_ws,  # Q^ret [N, T] at (s_n, s_t); carry in / out [N]; look-back scratch
    R, T, s_n, s_t, s_on, s_ot,
    gamma: "fp64", lam: "fp64", c_bar: "fp64",
    CARRY_IN: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    PASS: tl.constexpr, SHIFT_LOAD: tl.constexpr, FLIP: tl.constexpr,
):
    """Retrace targets, backward in time (see :func:`rollbuf.kernels.core.drive`)."""
    scal = (tl.full((), gamma, ACC), tl.full((), lam, ACC), tl.full((), c_bar, ACC))
    core.drive((fields, (p_q,), scal), R, T, 1, (s_n, s_t, s_on, s_ot), p_ci, p_co, p_ws, _load, _step,
               _emit, (False, False, False), True, CARRY_IN, ACC, BLOCK_N, BLOCK_T, PASS, SHIFT_LOAD,
               FLIP)
