"""The TD(λ) family (GAE, TD(λ) returns, discounted and Monte-Carlo returns) and its adjoint, family
``TD_LAMBDA_ADJOINT`` (``adjoint_triton.py``; its CPU step ``cpu.adjoint_step``)."""

from rollbuf.kernels.row import Row, SplitRows, WholeRows
from rollbuf.kernels.td_lambda import torch_path
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
# rows than 8 programs per SM), 16 warps, for calls writing one output or both: faster than the split
# chunks; shorter rows were slower held one per program and keep the table, as do the walked long rows
# (not timed). Chunks held in reverse in a backward call: 512 steps (docs/kernel-choices.md, 'The TD(λ)
# family' and 'Flipped chunks').
# One row split across programs, fp32 without a mask, for calls writing advantages (GAE, advantages):
# 2048-step chunks of 8 warps chained by the look-back with a window of 256 words (one a thread), in lane
# order, in place of the three passes; returns alone (TD(λ), discounted returns) lost or tied and keep
# the three passes (docs/kernel-choices.md, 'Long rows split').
ROW = Row(Family.TD_LAMBDA, kernel, ("rewards", "values", *BOUNDARY), ("advantages", "returns"), ("p_adv", "p_ret"),
          scalars=("gamma", "lam"), whole_rows=WholeRows(2049, 4096, True, ((4096, 16),), 2), flip_chunks=(512,),
          quads=True, split_row=SplitRows(2048, 8, 256, ("advantages",)), step=step, step_data=("values",),
          adjoint=backward, torch_steps=torch_path.steps,
          torch_outputs=torch_path.outputs)
ADJOINT = Row(Family.TD_LAMBDA_ADJOINT, adjoint_kernel, ("grad_returns", "grad_advantages", "terminated", "truncated",
                                                        None, "mask"),
              ("rewards", "values"), ("p_gr", "p_gv"), scalars=("gamma", "lam"), backward=False,
              step=adjoint_step, step_data=("grad_advantages",))
