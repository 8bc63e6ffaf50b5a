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

import triton
import triton.language as tl

from rollbuf.boundary import coefficients as C
from rollbuf.kernels import core

lambda_step = core.jit_boundary(C.lambda_step)
lambda_out = core.jit_boundary(C.lambda_out)


@triton.jit
def _load(fam, geo, o, ok, end, ACC: tl.constexpr):
    """``(r, v, k, tr, boot, live, v_next)`` at the steps ``o``; ``v_next`` (``V_{t+1}``, the window
    end's past the last step) only without a mask (else ``v``, unused)."""
    fields = fam[0]
    p_v, p_m = fields[1], fields[5]
    off = core.offsets(geo, o)
    k, tr, boot, live = core.boundary(fields, off, ok, ACC)
    r = core.load(fields[0], off, ok, live, p_m is not None, ACC)
    if p_v is None:  # Monte-Carlo returns
        v = tl.zeros(off.shape, ACC)
        v_next = v
    else:
        v = core.load(p_v, off, ok, live, p_m is not None, ACC)
        if p_m is None:
            v_next = core.next_value(p_v, geo, o, ok, end[0], ACC)
        else:
            v_next = v
    return r, v, k, tr, boot, live, v_next


@triton.jit
def _step(fam, x, ACC: tl.constexpr):
    gamma, lam = fam[2]
    r, v, k, tr, boot, live, v_next = x
    if fam[0][3] is None or fam[0][4] is None:  # no step reads one (core.boundary)
        boot = None
    a, b = lambda_step(r, v, k, tr, boot, gamma, lam)
    if fam[0][5] is None:  # the maps of G: α = lambda_out(…, (1−λ)V_{t+1}), β = γλ·nd
        return core.identity_where((lambda_out(r, k, tr, boot, gamma, (1.0 - lam) * v_next), b), live, False)
    else:  # the maps of Z
        return core.identity_where((a, b), live, False)


@triton.jit
def _emit(fam, geo, o, ok, x, z, ACC: tl.constexpr):
    """Outputs from ``z``: ``G_t`` itself without a mask, ``Z_{t+1}`` with one; returns ``Z_t``."""
    gamma, lam = fam[2]
    p_adv, p_ret = fam[1]
    r, v, k, tr, boot, live, v_next = x
    if fam[0][3] is None or fam[0][4] is None:  # no step reads one (core.boundary)
        boot = None
    o_out = core.out_offsets(geo, o)
    if fam[0][5] is None:
        g = z[0]
        z_t = (1.0 - lam) * v + lam * g  # the state Z_t, for the row's carry out
    else:
        g = lambda_out(r, k, tr, boot, gamma, z[0])
        a, b = lambda_step(r, v, k, tr, boot, gamma, lam)
        z_t = tl.where(live, a + b * z[0], z[0])
    if p_adv is not None:
        tl.store(p_adv + o_out, core.out_value(core.masked(g - v, live, fam[0][5]), p_adv), mask=ok)
    if p_ret is not None:
        tl.store(p_ret + o_out, core.out_value(core.masked(g, live, fam[0][5]), p_ret), mask=ok)
    return z_t, z_t


@triton.jit
def gae_kernel(
    fields,  # (rewards, values, terminated, truncated, bootstrap_values, mask): [N, T] at (s_n, s_t); None = absent
    p_adv, p_ret,  # outputs [N, T] at (s_on, s_ot); None = not asked for
    p_ci, p_co, p_ws,  # carry in / out [N], look-back scratch; None = absent
    R, T, s_n, s_t, s_on, s_ot,
    gamma: "fp64", lam: "fp64",
    CARRY_IN: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    PASS: tl.constexpr, SHIFT_LOAD: tl.constexpr, FLIP: tl.constexpr,
):
    """TD(λ) returns and GAE advantages, backward in time (see :func:`rollbuf.kernels.core.drive`)."""
    scal = (tl.full((), gamma, ACC), tl.full((), lam, ACC))  # float64 in, rounded once to ACC
    core.drive((fields, (p_adv, p_ret), scal), R, T, 1, (s_n, s_t, s_on, s_ot), p_ci, p_co, p_ws, _load, _step,
               _emit, (False, False, fields[5] is None), True, CARRY_IN, ACC, BLOCK_N, BLOCK_T, PASS, SHIFT_LOAD,
               FLIP)
