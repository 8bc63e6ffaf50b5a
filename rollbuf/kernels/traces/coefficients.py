"""The forward family's arithmetic (eligibility traces, episodic sums): the own-step coefficients and outputs.

Pure arithmetic on clean per-step fields (:mod:`rollbuf.boundary.coefficients` says what clean means and
why the state is chosen so): the torch backend runs these functions on tensors, the Triton kernel
compiles them (:func:`rollbuf.kernels.core.jit_boundary`) and the CPU loop inlines them, from this one
source. ``boot = None``: no step reads a bootstrap value, so ``local = r``.
"""

# ----------------------------------------------------------------------------------------------
# Forward estimators: eligibility traces (decay = γλ) and episodic sums (decay = 1).
#   e_t = x_t + decay·(1−d_{t−1})·e_{t−1}.  State F_t = nd_t·e_t (what step t hands on):
#   F_t = nd_t·x_t + decay·nd_t·F_{t−1},   e_t = x_t + decay·F_{t−1},   F_{−1} = initial,
#   final = F_{T−1} = (1−d_{T−1})·e_{T−1}  (already reset, so it chains as the next `initial`).
# ----------------------------------------------------------------------------------------------


def trace_step(x, k, tr, decay):
    nd = (1.0 - k) * (1.0 - tr)
    return nd * x, decay * nd


def trace_out(x, decay, f_prev):
    return x + decay * f_prev


def trace_next_step(x, k_prev, tr_prev, decay):
    """Own-step coefficients of the trace itself, ``e_t = x_t + decay·nd_{t−1}·e_{t−1}``, where the
    step before is the one before in memory (no mask); at a row's first step ``k_prev = tr_prev =
    0``: the carry in is ``F_{−1}``, already reset. ``F_t = nd_t·e_t`` (:func:`trace_state`)."""
    return x, decay * (1.0 - k_prev) * (1.0 - tr_prev)


def trace_state(e, k, tr):
    """``F_t = nd_t·e_t``: what step t hands on (the row's ``final`` at its last step)."""
    return (1.0 - k) * (1.0 - tr) * e
