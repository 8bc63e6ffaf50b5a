"""Retrace(λ) (Munos et al., 2016): ``Q^ret_t = local_t + γ·nd_t·W_{t+1}``, state
``W_t = V_t + c_t(Q^ret_t − q_t)`` scanned backward with the coefficients of
:func:`rollbuf.kernels.retrace.coefficients.retrace_step`, ``c_t = λ·min(c̄, π/μ)`` (V-trace's
:func:`~rollbuf.kernels.vtrace.coefficients.truncated_weights`).
"""

from collections import namedtuple

import triton
import triton.language as tl

from rollbuf.kernels import core
from rollbuf.kernels.retrace import coefficients as C
from rollbuf.kernels.td_lambda.coefficients import lambda_out as td_lambda_out
from rollbuf.kernels.vtrace.triton import truncated_weights

retrace_step = core.jit_boundary(C.retrace_step)
lambda_out = core.jit_boundary(td_lambda_out)

# rewards, values, terminated, truncated, bootstrap_values, mask, log_probs, target_log_probs,
# q_values: [N, T] each
Fields = namedtuple("Fields", "p_r p_v p_k p_tr p_bv p_m p_lp p_tlp p_q")
Outputs = namedtuple("Outputs", "p_q")  # Q^ret [N, T]
Scalars = namedtuple("Scalars", "gamma lam c_bar")
Steps = namedtuple("Steps", "r v k tr boot live q c")  # a step's values (LOAD)


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """:data:`Steps` at the steps ``o``."""
    fields, scal = fam.fields, fam.scalars
    HAS_M: tl.constexpr = fields.p_m is not None
    off = core.offsets(geo, o)
    k, tr, boot, live = core.boundary(fields, off, ok, ACC)
    r = core.load(fields.p_r, off, ok, live, HAS_M, ACC)
    v = core.load(fields.p_v, off, ok, live, HAS_M, ACC)
    tlp = core.load(fields.p_tlp, off, ok, live, HAS_M, ACC)
    ratio = tl.exp(tlp - core.load(fields.p_lp, off, ok, live, HAS_M, ACC))
    q = core.load(fields.p_q, off, ok, live, HAS_M, ACC)
    _, c, _ = truncated_weights(ratio, scal.lam, scal.c_bar, scal.c_bar, scal.c_bar)  # c alone is used
    return Steps(r, v, k, tr, boot, live, q, c)


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    boot = x.boot
    if fam.fields.p_tr is None or fam.fields.p_bv is None:  # no step reads one (core.boundary)
        boot = None
    return core.identity_where(retrace_step(x.r, x.v, x.k, x.tr, boot, x.q, x.c, fam.scalars.gamma), x.live, False)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    gamma = fam.scalars.gamma
    p_out = fam.outputs.p_q
    boot = x.boot
    if fam.fields.p_tr is None or fam.fields.p_bv is None:  # no step reads one (core.boundary)
        boot = None
    q_ret = core.masked(lambda_out(x.r, x.k, x.tr, boot, gamma, z.u), x.live, fam.fields.p_m)
    tl.store(p_out + core.out_offsets(geo, o), core.out_value(q_ret, p_out), mask=ok)
    a, b = retrace_step(x.r, x.v, x.k, x.tr, boot, x.q, x.c, gamma)
    return tl.where(x.live, a + b * z.u, z.u), z.u


@triton.jit
def retrace_kernel(
    fields,  # (rewards, values, terminated, truncated, bootstrap_values, mask, log_probs, target_log_probs,
             #  q_values): [N, T] at (s_n, s_t); None = absent
    outputs,  # (Q^ret,): [N, T] at (s_on, s_ot)
    carries, sizes,  # core.Carries (carry in / out [N]), core.Sizes
    gamma: "fp64", lam: "fp64", c_bar: "fp64",
    CFG: tl.constexpr,  # core.Config
):
    """Retrace targets, backward in time (see :func:`rollbuf.kernels.core.drive`)."""
    ACC: tl.constexpr = CFG.ACC
    scal = Scalars(tl.full((), gamma, ACC), tl.full((), lam, ACC), tl.full((), c_bar, ACC))
    core.drive(core.Fam(Fields(*fields), Outputs(*outputs), scal), core.Sizes(*sizes), core.Carries(*carries),
               core.Scan(_load, _step, _emit, PAIR=False, CARRY2=False, INCLUSIVE=False, REVERSE=True), CFG)
