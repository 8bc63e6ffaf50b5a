"""The turn family: turn-level discounted returns and GAE over a row's model tokens (ROLL's
``agentic_reinforce``; the turn as GAE's time step), the scan coefficients built from the rewards,
values and model-token flags in registers (:func:`rollbuf.integrations.llm.turn_returns` and
:func:`~rollbuf.integrations.llm.turn_gae` on the kernel), and the forward fill that carries each
turn's advantage from its first token over the turn (family ``TURN_FILL``). Triton only: the other
backends run the same estimators over coefficients and turn values made by torch ops."""

from rollbuf.kernels.row import LongRows, Row
from rollbuf.problem import Family


def kernel():
    from rollbuf.kernels.turns.triton import turn_kernel  # Triton is optional: imported at the first launch
    return turn_kernel


def fill_kernel():
    from rollbuf.kernels.turns.triton import fill_kernel  # (Triton is optional)
    return fill_kernel


# the state past a row's end: 0 (its last turn terminal), or V(s') of a truncated row as the carry in.
# Turn GAE (values given) runs the same kernel as its own family for its own entries of the table: its
# long rows are walked, one program per row, from one row per SM on (the table splits them below 8 per
# SM), and its fill's split rows take 4 warps; at 256 x 131072 on an H100 the first pass took 250 µs
# walked against 306 split in 1024-token chunks and 673 in 2048-token ones, the fill 124 µs against 140
# with 8 warps (the returns keep the table: 162 µs; docs/kernel-choices.md, 'The turn kernels').
FIELDS = ("rewards", "model", "values")
ROW = Row(Family.TURN, kernel, FIELDS, ("returns", "start_advantages"), ("p_ret", "p_adv"), scalars=("gamma", "lam"))
GAE = Row(Family.TURN_GAE, kernel, FIELDS, ("returns", "start_advantages"), ("p_ret", "p_adv"),
          scalars=("gamma", "lam"), fill_per_sm=1)
FILL = Row(Family.TURN_FILL, fill_kernel, ("start_advantages", "model"), ("advantages",), ("p_out",), backward=False,
           long_rows=LongRows(1, 8, 4))
