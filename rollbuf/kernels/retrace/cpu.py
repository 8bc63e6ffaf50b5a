"""Retrace's step of the compiled CPU loop (:mod:`rollbuf.kernels.loop`)."""

import numpy as np
from numba import njit

from rollbuf.kernels.loop import JIT, inline, ld
from rollbuf.kernels.retrace import coefficients as C
from rollbuf.kernels.td_lambda.coefficients import lambda_out
from rollbuf.kernels.vtrace.cpu import weights

_retrace_step, _lambda_out = inline(C.retrace_step), inline(lambda_out)


@njit(**JIT)
def step(data, at, k, tr, boot, prm, z0, z1):
    """Retrace(λ): data (rewards, values, q_values, log_probs, target_log_probs), output Q, state
    W = V + c(Q − q), c = λ·min(c̄, π/μ)."""
    zero = prm[0]
    gamma, lam, c_bar = prm[2]
    r, v = ld(data[0], at, zero), ld(data[1], at, zero)
    _, c, _ = weights(np.exp(ld(data[4], at, zero) - ld(data[3], at, zero)), lam, None, c_bar, None)
    a, b = _retrace_step(r, v, k, tr, boot, ld(data[2], at, zero), c, gamma)
    return (a + b * z0, 0.0), (_lambda_out(r, k, tr, boot, gamma, z0),)
