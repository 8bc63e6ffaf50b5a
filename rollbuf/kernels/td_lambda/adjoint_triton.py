"""The adjoint of the TD(λ) family (its backward pass), forward in time: with ``Ḡ_t = ḡ_G + ḡ_A``
and ``W_t = ∂L/∂Z_t``, ``U_t = W_{t+1} = c_t·Ḡ_t + λc_t·U_{t−1}`` (``c = γ·nd``) from
:func:`rollbuf.boundary.coefficients.lambda_adjoint_step`, and ``(r̄_t, V̄_t)`` from
:func:`~rollbuf.boundary.coefficients.lambda_adjoint_out`; the row's carry out is ``W_T``, the
gradient of the window-end carry."""

import triton
import triton.language as tl

from rollbuf.boundary import coefficients as C
from rollbuf.kernels import core

lambda_adjoint_step = core.jit_boundary(C.lambda_adjoint_step)
lambda_adjoint_out = core.jit_boundary(C.lambda_adjoint_out)


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """``(Ḡ, ḡ_A, k, tr, live)`` at the steps ``o``."""
    fields = fam[0]
    p_g, p_ga, p_m = fields[0], fields[1], fields[5]
    off = core.offsets(geo, o)
    k, tr, boot, live = core.boundary(fields, off, ok, ACC)
    g = core.load(p_g, off, ok, live, p_m is not None, ACC)
    if p_ga is None:
        ga = tl.zeros(off.shape, ACC)
    else:
        ga = core.load(p_ga, off, ok, live, p_m is not None, ACC)
    return g + ga, ga, k, tr, live


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    gamma, lam = fam[2]
    g, ga, k, tr, live = x
    return core.identity_where(lambda_adjoint_step(g, k, tr, gamma, lam), live, False)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    gamma, lam = fam[2]
    p_gr, p_gv = fam[1]
    zu = z[0]
    g, ga, k, tr, live = x
    d_r, d_v = lambda_adjoint_out(g, ga, lam, zu)
    o_out = core.out_offsets(geo, o)
    tl.store(p_gr + o_out, core.out_value(core.masked(d_r, live, fam[0][5]), p_gr), mask=ok)
    if p_gv is not None:
        tl.store(p_gv + o_out, core.out_value(core.masked(d_v, live, fam[0][5]), p_gv), mask=ok)
    a, b = lambda_adjoint_step(g, k, tr, gamma, lam)
    return tl.where(live, a + b * zu, zu), zu


@triton.jit
def lambda_adjoint_kernel(
    fields,  # (grad_returns, grad_advantages, terminated, truncated, None, mask): [N, T] at (s_n, s_t)
    p_gr, p_gv, p_ci, p_co, p_ws,  # r̄, V̄ [N, T] (V̄: None = not asked for); W_0 in, W_T out [N]; scratch
    R, T, s_n, s_t, s_on, s_ot,
    gamma: "fp64", lam: "fp64",
    CARRY_IN: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    PASS: tl.constexpr, SHIFT_LOAD: tl.constexpr, FLIP: tl.constexpr,
):
    """Gradients of rewards and values through the TD(λ) family, forward in time."""
    scal = (tl.full((), gamma, ACC), tl.full((), lam, ACC))
    core.drive((fields, (p_gr, p_gv), scal), R, T, 1, (s_n, s_t, s_on, s_ot), p_ci, p_co, p_ws, _load, _step,
               _emit, (False, False, False), False, CARRY_IN, ACC, BLOCK_N, BLOCK_T, PASS, SHIFT_LOAD,
               FLIP)
