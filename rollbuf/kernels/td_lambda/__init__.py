"""The TD(λ) family (GAE, TD(λ) returns, discounted and Monte-Carlo returns) and its adjoint, family
``TD_LAMBDA_ADJOINT`` (``adjoint_triton.py``; its CPU step ``cpu.adjoint_step``)."""

from rollbuf.kernels.row import Row, WholeRows
from rollbuf.kernels.td_lambda.adjoint import backward
from rollbuf.problem import Family

BOUNDARY = ("terminated", "truncated", "bootstrap_values", "mask")  # fields [2:6] of every backward family


def kernel():
    from rollbuf.kernels.td_lambda.triton import gae_kernel  # Triton is optional: imported at the first launch
    return gae_kernel


def adjoint_kernel():
    from rollbuf.kernels.td_lambda.adjoint_triton import lambda_adjoint_kernel  # (Triton is optional)
    return lambda_adjoint_kernel


def step():
    from rollbuf.kernels.td_lambda.cpu import step  # numba is optional: imported by the CPU backend
    return step


def adjoint_step():
    from rollbuf.kernels.td_lambda.cpu import adjoint_step  # (numba is optional)
    return adjoint_step


# Rows held whole (rollbuf.kernels.host.strategy): rows of 2049-4096 steps that would be split (fewer
# rows than 8 programs per SM), 16 warps. Measured on the H200 at 28e5dea (results/ab_whole_rows_28e5dea.csv,
# device time): 128x4096 8.1 -> 4.8 µs, 512x4096 17.9 -> 13.5; rows of 1024 steps or fewer were slower
# held one per program (2048x512 7.1 -> 11.1 with 16 warps), and the walked long rows of many
# environments were not timed: both keep the table. Calls writing one output or both: measured on the
# H200 at 1bcfbfe (results/ab_family_1bcfbfe/, device µs, the table -> held whole with 16 warps): GAE's
# two outputs 128x4096 8.5 -> 5.5, 512x4096 19.2 -> 15.1 (held whole they had lost at 5055e67, before
# the returns were scanned themselves: 512x4096 20.8 against 19.1 split). The returns-only calls are
# held whole as advantages are (same bytes), never timed against the table: in that A/B both sides of
# them already ran held whole.
# Chunks held in reverse in a backward call: 512 steps (measured: above rollbuf.kernels.host.flip_rule).
ROW = Row(Family.TD_LAMBDA, kernel, ("rewards", "values", *BOUNDARY), ("advantages", "returns"), ("p_adv", "p_ret"),
          scalars=("gamma", "lam"), whole_rows=WholeRows(2049, 4096, True, ((4096, 16),), 2), flip_chunks=(512,),
          step=step, step_data=("values",), adjoint=backward)
ADJOINT = Row(Family.TD_LAMBDA_ADJOINT, adjoint_kernel, ("grad_returns", "grad_advantages", "terminated", "truncated",
                                                        None, "mask"),
              ("rewards", "values"), ("p_gr", "p_gv"), scalars=("gamma", "lam"), backward=False,
              step=adjoint_step, step_data=("grad_advantages",))
