"""The generic affine scan: the float64 reference loop, the oracle.

:mod:`rollbuf.reference` gathers the families' loops; its docstring gives the conventions they share.
"""

from __future__ import annotations

from rollbuf.oracle import as_output, differentiable, elems, num, zeros


def affine_scan(alpha, beta, reverse, initial):
    """``y_t = α_t + β_t·y_{t−1}`` (``y_{t+1}`` if ``reverse``), ``y`` outside the row = ``initial``."""
    N, T = alpha.shape
    diff = differentiable(alpha, beta, initial)
    out = zeros(N, T)
    for n in range(N):
        a, b = elems(alpha[n], diff), elems(beta[n], diff)
        y = num(initial[n], diff)
        for t in (reversed(range(T)) if reverse else range(T)):
            y = a[t] + b[t] * y
            out[n][t] = y
    return as_output(out, alpha)
