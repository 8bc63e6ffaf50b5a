"""Retrace's arithmetic: the own-step coefficients of its scan (its output is the TD(λ) family's ``lambda_out``).

Pure arithmetic on clean per-step fields (:mod:`rollbuf.boundary.coefficients` says what clean means and
why the state is chosen so): the torch backend runs these functions on tensors, the Triton kernel
compiles them (:func:`rollbuf.kernels.core.jit_boundary`) and the CPU loop inlines them, from this one
source. ``boot = None``: no step reads a bootstrap value, so ``local = r``.
"""

# ----------------------------------------------------------------------------------------------
# Retrace(λ):  Q_t = local_t + γ·nd_t·[V_{t+1} + c_{t+1}(Q_{t+1} − q_{t+1})]
# State W_t = V_t + c_t(Q_t − q_t) uses only step t's own V, c, q:
#   W_t = V_t + c_t(local_t − q_t) + γ·nd_t·c_t·W_{t+1},   Q_t = local_t + γ·nd_t·W_{t+1}
# Window end: W_T = V(s_T) (there is no step T to take c_T from; so Q_{T−1} = r + γ(1−k)V').
# Chaining: W_0 of the next window = V_0 + c_0(Q_0 − q_0) carries c_0 and q_0 with it.
# ----------------------------------------------------------------------------------------------


def retrace_step(r, v, k, tr, boot, q, c, gamma):
    """Own-step coefficients of ``W_t = V_t + c_t(Q^ret_t − q_t)``; ``c = λ·min(c̄, ratio)``."""
    local = r if boot is None else r + gamma * (1.0 - k) * tr * boot
    nd = (1.0 - k) * (1.0 - tr)
    return v + c * (local - q), gamma * nd * c
