"""TD(λ) family: GAE, TD(λ) returns, bootstrapped discounted returns (λ = 1) and Monte-Carlo
returns (λ = 1, no values, no bootstrap).

State ``Z_t = (1−λ)V_t + λG_t`` scanned backward with ``(α_t, β_t)`` from
:func:`rollbuf.boundary.coefficients.lambda_step`; ``G_t = local_t + γ·nd_t·Z_{t+1}``
(:func:`~rollbuf.boundary.coefficients.lambda_out`), ``A_t = G_t − V_t``.
Bytes per step: rewards, values, flags once each, the outputs asked for once each; bootstrap values
only where a truncated step or the window end reads them.
"""

import triton
import triton.language as tl

from rollbuf.boundary import coefficients as C
from rollbuf.kernels import core

lambda_step = core.jit_boundary(C.lambda_step)
lambda_out = core.jit_boundary(C.lambda_out)


@triton.jit
def _fields(fam, geo, o, ok, ACC: tl.constexpr):
    fields, outs, scal = fam
    p_r, p_v, p_m = fields[0], fields[1], fields[5]
    off = core.offsets(geo, o)
    k, tr, boot, live = core.boundary(fields, off, ok, ACC)
    r = core.load(p_r, off, ok, live, p_m is not None, ACC)
    if p_v is None:  # Monte-Carlo returns
        v = tl.zeros(off.shape, ACC)
    else:
        v = core.load(p_v, off, ok, live, p_m is not None, ACC)
    return off, r, v, k, tr, boot, live


@triton.jit
def _step(fam, geo, o, ok, ACC: tl.constexpr):
    gamma, lam = fam[2]
    off, r, v, k, tr, boot, live = _fields(fam, geo, o, ok, ACC)
    return core.identity_where(lambda_step(r, v, k, tr, boot, gamma, lam), live, False)


@triton.jit
def _emit(fam, geo, o, ok, z, ACC: tl.constexpr):
    gamma, lam = fam[2]
    p_adv, p_ret = fam[1]
    zu = z[0]
    off, r, v, k, tr, boot, live = _fields(fam, geo, o, ok, ACC)
    g = lambda_out(r, k, tr, boot, gamma, zu)
    o_out = core.out_offsets(geo, o)
    if p_adv is not None:
        tl.store(p_adv + o_out, tl.where(live, g - v, 0.0).to(p_adv.dtype.element_ty), mask=ok)
    if p_ret is not None:
        tl.store(p_ret + o_out, tl.where(live, g, 0.0).to(p_ret.dtype.element_ty), mask=ok)
    a, b = lambda_step(r, v, k, tr, boot, gamma, lam)
    return tl.where(live, a + b * zu, zu), zu


@triton.jit
def gae_kernel(
    fields,  # (rewards, values, terminated, truncated, bootstrap_values, mask): [N, T] at (s_n, s_t); None = absent
    p_adv, p_ret,  # outputs [N, T] at (s_n, s_t); None = not asked for
    p_ci, p_co, p_ws,  # carry in / out [N], look-back scratch; None = absent
    R, T, s_n, s_t, s_on, s_ot,
    gamma: "fp64", lam: "fp64",
    CARRY_IN: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    PASS: tl.constexpr, SHIFT_LOAD: tl.constexpr,
):
    """TD(λ) returns and GAE advantages, backward in time (see :func:`rollbuf.kernels.core.drive`)."""
    scal = (tl.full((), gamma, ACC), tl.full((), lam, ACC))  # float64 in, rounded once to ACC
    core.drive((fields, (p_adv, p_ret), scal), R, T, 1, (s_n, s_t, s_on, s_ot), p_ci, p_co, p_ws, _step, _emit,
               False, True, CARRY_IN, ACC, BLOCK_N, BLOCK_T, PASS, SHIFT_LOAD)
