"""The affine scan's step of the compiled CPU loop (:mod:`rollbuf.kernels.loop`)."""

from numba import njit

from rollbuf.kernels.loop import JIT, ld


@njit(**JIT)
def step(data, at, k, tr, boot, prm, y, z1):
    """The generic primitive y_t = α_t + β_t·y_{t∓1}: data (α, β), output y, state y."""
    y = ld(data[0], at, prm[0]) + ld(data[1], at, prm[0]) * y
    return (y, 0.0), (y,)
