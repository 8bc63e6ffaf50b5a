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


# the state past a row's end: 0 (its last turn terminal), or V(s') of a truncated row as the carry in.
# Turn GAE (values given) runs the same kernel as its own family for its longest chunk: 1024 tokens, where
# the exclusive state it reads comes faster than from 2048-token chunks (673 µs against 295 at 256 x
# 131072 on an H100; the returns, which read the inclusive state, are fastest at 2048: 162 µs against
# 207; docs/kernel-choices.md, 'The turn kernels').
FIELDS = ("rewards", "model", "values")
ROW = Row(Family.TURN, kernel, FIELDS, ("returns", "start_advantages"), ("p_ret", "p_adv"), scalars=("gamma", "lam"))
GAE = Row(Family.TURN_GAE, kernel, FIELDS, ("returns", "start_advantages"), ("p_ret", "p_adv"),
          scalars=("gamma", "lam"), max_chunk=1024)
FILL = Row(Family.TURN_FILL, fill_kernel, ("start_advantages", "model"), ("advantages",), ("p_out",), backward=False)
