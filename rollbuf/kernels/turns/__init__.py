"""The turn family: turn-level discounted returns over a row's model tokens (ROLL's
``agentic_reinforce``), the scan coefficients built from the rewards and the model-token mask in
registers (:func:`rollbuf.integrations.llm.turn_returns` on the kernel). Triton only: the other
backends run the same returns as one affine scan over coefficients made by torch ops."""

from rollbuf.kernels.row import Row
from rollbuf.problem import Family


def kernel():
    from rollbuf.kernels.turns.triton import turn_kernel  # Triton is optional: imported at the first launch
    return turn_kernel


# no window-end value (the state past a row's end is 0: its last turn's return is its own reward)
ROW = Row(Family.TURN, kernel, ("rewards", "model"), ("returns",), ("p_ret",), scalars=("gamma",))
