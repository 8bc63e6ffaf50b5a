"""The forward estimators' step of the compiled CPU loop (:mod:`rollbuf.kernels.loop`)."""

from numba import njit

from rollbuf.kernels.loop import JIT, inline, ld
from rollbuf.kernels.traces import coefficients as C

_trace_out, _trace_state = inline(C.trace_out), inline(C.trace_state)


@njit(**JIT)
def step(data, at, k, tr, boot, prm, f_prev, z1):
    """Eligibility traces (decay = γλ), episodic sums (decay = 1), forward: data (x,), state F = nd·e."""
    e = _trace_out(ld(data[0], at, prm[0]), prm[2][0], f_prev)
    return (_trace_state(e, k, tr), 0.0), (e,)
