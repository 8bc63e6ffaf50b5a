"""The turn family: turn-level discounted returns and GAE over a row's model tokens (ROLL's
``agentic_reinforce``; the turn as GAE's time step), the scan coefficients built from the rewards,
values and model-token flags in registers (:func:`rollbuf.integrations.llm.turn_returns` and
:func:`~rollbuf.integrations.llm.turn_gae` on the kernel), and the forward fill that carries each
turn's advantage from its first token over the turn (family ``TURN_FILL``). Triton only: the other
backends run the same estimators over coefficients and turn values made by torch ops."""

from rollbuf.kernels.row import Row
from rollbuf.problem import Family


def kernel():
    from rollbuf.kernels.turns.triton import turn_kernel  # Triton is optional: imported at the first launch
    return turn_kernel


def fill_kernel():
    from rollbuf.kernels.turns.triton import fill_kernel  # (Triton is optional)
    return fill_kernel


# the state past a row's end: 0 (its last turn terminal), or V(s') of a truncated row as the carry in
ROW = Row(Family.TURN, kernel, ("rewards", "model", "values"), ("returns", "start_advantages"), ("p_ret", "p_adv"),
          scalars=("gamma", "lam"))
FILL = Row(Family.TURN_FILL, fill_kernel, ("start_advantages", "model"), ("advantages",), ("p_out",), backward=False)
