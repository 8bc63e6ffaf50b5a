"""V-trace's step of the compiled CPU loop (:mod:`rollbuf.kernels.loop`)."""

import numpy as np
from numba import njit

from rollbuf.kernels.loop import JIT, clip, inline, ld
from rollbuf.kernels.vtrace import coefficients as C

_vtrace_step, _vtrace_pg = inline(C.vtrace_step), inline(C.vtrace_pg)


@njit(**JIT)
def step(data, at, k, tr, boot, prm, u_next, v_next):
    """V-trace: data (rewards, values, log_probs, target_log_probs), outputs (vs, pg), state (u, V)."""
    zero = prm[0]
    gamma, lam, rho_bar, c_bar, pg_rho_bar = prm[2]
    r, v = ld(data[0], at, zero), ld(data[1], at, zero)
    ratio = np.exp(ld(data[3], at, zero) - ld(data[2], at, zero))
    p, q, _, a, w = _vtrace_step(r, v, k, tr, boot, clip(ratio, rho_bar), lam * clip(ratio, c_bar), gamma)
    pg = _vtrace_pg(r, v, k, tr, boot, clip(ratio, pg_rho_bar), gamma, v_next + u_next)
    u = a + p * u_next + q * v_next  # the pair map; its V part is V_t itself
    return (u, w), (v + u, pg)
