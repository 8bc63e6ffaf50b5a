"""The adjoint of the TD(λ) family (its backward pass), forward in time: with ``Ḡ_t = ḡ_G + ḡ_A``
and ``W_t = ∂L/∂Z_t``, ``U_t = W_{t+1} = c_t·Ḡ_t + λc_t·U_{t−1}`` (``c = γ·nd``) from
:func:`rollbuf.boundary.coefficients.lambda_adjoint_step`, and ``(r̄_t, V̄_t)`` from
:func:`~rollbuf.boundary.coefficients.lambda_adjoint_out`; the row's carry out is ``W_T``, the
gradient of the window-end carry."""

from collections import namedtuple

import triton
import triton.language as tl

from rollbuf.kernels import core
from rollbuf.kernels.td_lambda import coefficients as C

lambda_adjoint_step = core.jit_boundary(C.lambda_adjoint_step)
lambda_adjoint_out = core.jit_boundary(C.lambda_adjoint_out)

# grad_returns, grad_advantages, terminated, truncated, (none), mask: [N, T] each
Fields = namedtuple("Fields", "p_g p_ga p_k p_tr p_bv p_m")
Outputs = namedtuple("Outputs", "p_gr p_gv")  # r̄, V̄ [N, T] (V̄: None = not asked for)
Scalars = namedtuple("Scalars", "gamma lam")
Steps = namedtuple("Steps", "g ga k tr live")  # a step's values (LOAD): Ḡ = ḡ_G + ḡ_A, ḡ_A, flags


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """:data:`Steps` at the steps ``o``."""
    fields = fam.fields
    p_g, p_ga, p_m = fields.p_g, fields.p_ga, fields.p_m
    off = core.offsets(geo, o)
    k, tr, _, live = core.boundary(fields, off, ok, ACC)
    g = core.load(p_g, off, ok, live, p_m is not None, ACC)
    ga = tl.zeros(off.shape, ACC) if p_ga is None else core.load(p_ga, off, ok, live, p_m is not None, ACC)
    return Steps(g + ga, ga, k, tr, live)


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    s = fam.scalars
    return core.identity_where(lambda_adjoint_step(x.g, x.k, x.tr, s.gamma, s.lam), x.live, False)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    s = fam.scalars
    p_gr, p_gv, p_m = fam.outputs.p_gr, fam.outputs.p_gv, fam.fields.p_m
    d_r, d_v = lambda_adjoint_out(x.g, x.ga, s.lam, z.u)
    o_out = core.out_offsets(geo, o)
    tl.store(p_gr + o_out, core.out_value(core.masked(d_r, x.live, p_m), p_gr), mask=ok)
    if p_gv is not None:
        tl.store(p_gv + o_out, core.out_value(core.masked(d_v, x.live, p_m), p_gv), mask=ok)
    a, b = lambda_adjoint_step(x.g, x.k, x.tr, s.gamma, s.lam)
    return tl.where(x.live, a + b * z.u, z.u), z.u


@triton.jit
def lambda_adjoint_kernel(
    fields,  # (grad_returns, grad_advantages, terminated, truncated, None, mask): [N, T] at (s_n, s_t)
    outputs,  # (r̄, V̄): [N, T] (V̄: None = not asked for)
    carries, sizes,  # core.Carries (W_0 in, W_T out [N]), core.Sizes
    gamma: "fp64", lam: "fp64",
    CFG: tl.constexpr,  # core.Config
):
    """Gradients of rewards and values through the TD(λ) family, forward in time."""
    scal = Scalars(tl.full((), gamma, CFG.ACC), tl.full((), lam, CFG.ACC))
    core.drive(core.Fam(Fields(*fields), Outputs(*outputs), scal), core.Sizes(*sizes), core.Carries(*carries),
               core.Scan(_load, _step, _emit, PAIR=False, CARRY2=False, INCLUSIVE=False, REVERSE=False), CFG)
