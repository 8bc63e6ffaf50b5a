"""TD(λ) family: GAE, TD(λ) returns, bootstrapped discounted returns (λ = 1) and Monte-Carlo
returns (λ = 1, no values, no bootstrap).

With a mask, the state ``Z_t = (1−λ)V_t + λG_t`` is scanned backward with ``(α_t, β_t)`` from
:func:`rollbuf.boundary.coefficients.lambda_step` (no next-step input: masked steps are the identity)
and ``G_t = local_t + γ·nd_t·Z_{t+1}`` (:func:`~rollbuf.boundary.coefficients.lambda_out`) reads the
exclusive state. Without one, the next step is the next in memory, and the kernel scans the return
itself: ``G_t = lambda_out(…, (1−λ)V_{t+1}) + γλ·nd_t·G_{t+1}`` (the same recursion, ``Z_{t+1}``
expanded), so the outputs read the inclusive state: no shift, no second pass over the chunk's
fields. At the window end ``V_T = G_T = Z_T`` (the state past the window), so that
``(1−λ)V_T + λG_T = Z_T``. ``A_t = G_t − V_t``.
Bytes per step: rewards, values, flags once each, the outputs asked for once each; bootstrap values
only where a truncated step or the window end reads them.
"""

from collections import namedtuple

import triton
import triton.language as tl

from rollbuf.kernels import core
from rollbuf.kernels.td_lambda import coefficients as C

lambda_step = core.jit_boundary(C.lambda_step)
lambda_out = core.jit_boundary(C.lambda_out)

# rewards, values, terminated, truncated, bootstrap_values, mask: [N, T] each
Fields = namedtuple("Fields", "p_r p_v p_k p_tr p_bv p_m")
Outputs = namedtuple("Outputs", "p_adv p_ret")  # [N, T] each; None = not asked for
Scalars = namedtuple("Scalars", "gamma lam")
# a step's values (LOAD): v_next (V_{t+1}, the window end's past the last step) only without a mask
Steps = namedtuple("Steps", "r v k tr boot live v_next")


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """:data:`Steps` at the steps ``o`` (``v_next``: ``v`` itself with a mask, unused)."""
    fields = fam.fields
    p_v, p_m = fields.p_v, fields.p_m
    off = core.offsets(geo, o)
    k, tr, boot, live = core.boundary(fields, off, ok, ACC)
    r = core.load(fields.p_r, off, ok, live, p_m is not None, ACC)
    if p_v is None:  # Monte-Carlo returns
        v = tl.zeros(off.shape, ACC)
        v_next = v
    else:
        v = core.load(p_v, off, ok, live, p_m is not None, ACC)
        v_next = core.next_value(p_v, geo, o, ok, end.u, ACC) if p_m is None else v
    return Steps(r, v, k, tr, boot, live, v_next)


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    gamma, lam = fam.scalars.gamma, fam.scalars.lam
    boot = x.boot
    if fam.fields.p_tr is None or fam.fields.p_bv is None:  # no step reads one (core.boundary)
        boot = None
    a, b = lambda_step(x.r, x.v, x.k, x.tr, boot, gamma, lam)
    if fam.fields.p_m is None:  # the maps of G: α = lambda_out(…, (1−λ)V_{t+1}), β = γλ·nd
        return core.identity_where((lambda_out(x.r, x.k, x.tr, boot, gamma, (1.0 - lam) * x.v_next), b), x.live,
                                   False)
    else:  # the maps of Z
        return core.identity_where((a, b), x.live, False)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    """Outputs from ``z``: ``G_t`` itself without a mask, ``Z_{t+1}`` with one; returns ``Z_t``."""
    gamma, lam = fam.scalars.gamma, fam.scalars.lam
    p_adv, p_ret, p_m = fam.outputs.p_adv, fam.outputs.p_ret, fam.fields.p_m
    boot = x.boot
    if fam.fields.p_tr is None or fam.fields.p_bv is None:  # no step reads one (core.boundary)
        boot = None
    o_out = core.out_offsets(geo, o)
    if p_m is None:
        g = z.u
        z_t = (1.0 - lam) * x.v + lam * g  # the state Z_t, for the row's carry out
    else:
        g = lambda_out(x.r, x.k, x.tr, boot, gamma, z.u)
        a, b = lambda_step(x.r, x.v, x.k, x.tr, boot, gamma, lam)
        z_t = tl.where(x.live, a + b * z.u, z.u)
    if p_adv is not None:
        tl.store(p_adv + o_out, core.out_value(core.masked(g - x.v, x.live, p_m), p_adv), mask=ok)
    if p_ret is not None:
        tl.store(p_ret + o_out, core.out_value(core.masked(g, x.live, p_m), p_ret), mask=ok)
    return z_t, z_t


@triton.jit
def gae_kernel(
    fields,  # (rewards, values, terminated, truncated, bootstrap_values, mask): [N, T] at (s_n, s_t); None = absent
    outputs,  # (advantages, returns): [N, T] at (s_on, s_ot); None = not asked for
    carries, sizes,  # core.Carries, core.Sizes
    gamma: "fp64", lam: "fp64",
    CFG: tl.constexpr,  # core.Config
):
    """TD(λ) returns and GAE advantages, backward in time (see :func:`rollbuf.kernels.core.drive`)."""
    f = Fields(*fields)
    scal = Scalars(tl.full((), gamma, CFG.ACC), tl.full((), lam, CFG.ACC))  # float64 in, rounded once to ACC
    core.drive(core.Fam(f, Outputs(*outputs), scal), core.Sizes(*sizes), core.Carries(*carries),
               core.Scan(_load, _step, _emit, PAIR=False, CARRY2=False, INCLUSIVE=f.p_m is None, REVERSE=True), CFG)
