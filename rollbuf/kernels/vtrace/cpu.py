"""V-trace's step of the compiled CPU loop (:mod:`rollbuf.kernels.loop`)."""

import numpy as np
from numba import njit, types
from numba.extending import overload

from rollbuf.kernels.loop import JIT, inline, ld
from rollbuf.kernels.vtrace import coefficients as C


@overload(C.clip, inline="always")
def _clip(ratio, bar):
    """numba's :func:`~rollbuf.kernels.vtrace.coefficients.clip`, chosen by the bar's type: ``None`` for a
    ``None`` bar (Retrace's call), else ``min(bar, ratio)`` keeping a NaN ratio NaN and clipping an overflowed
    one (inf) to ``bar``."""
    if isinstance(bar, types.NoneType):
        return lambda ratio, bar: None
    return lambda ratio, bar: bar if ratio > bar else ratio


weights, _vtrace_step, _vtrace_pg = inline(C.truncated_weights), inline(C.vtrace_step), inline(C.vtrace_pg)


@njit(**JIT)
def step(data, at, k, tr, boot, prm, u_next, v_next):
    """V-trace: data (rewards, values, log_probs, target_log_probs), outputs (vs, pg), state (u, V)."""
    zero = prm[0]
    gamma, lam, rho_bar, c_bar, pg_rho_bar = prm[2]
    r, v = ld(data[0], at, zero), ld(data[1], at, zero)
    rho, c, rho_pg = weights(np.exp(ld(data[3], at, zero) - ld(data[2], at, zero)), lam, rho_bar, c_bar, pg_rho_bar)
    p, q, _, a, w = _vtrace_step(r, v, k, tr, boot, rho, c, gamma)
    pg = _vtrace_pg(r, v, k, tr, boot, rho_pg, gamma, v_next + u_next)
    u = a + p * u_next + q * v_next  # the pair map; its V part is V_t itself
    return (u, w), (v + u, pg)
