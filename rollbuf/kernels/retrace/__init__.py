"""Retrace(λ) (Munos et al., 2016)."""

from rollbuf.kernels.retrace import torch_path
from rollbuf.kernels.retrace.adjoint import backward
from rollbuf.kernels.row import Row, SplitRows, WholeRows
from rollbuf.kernels.td_lambda import BOUNDARY
from rollbuf.problem import Family


def kernel():
    from rollbuf.kernels.retrace.triton import retrace_kernel  # Triton is optional: imported at the first launch
    return retrace_kernel


def step():
    from rollbuf.kernels.retrace.cpu import step  # numba is optional: imported by the CPU backend
    return step


# Rows held whole (rollbuf.kernels.host.strategy): rows of one 2048-step chunk, the table's program (one
# row, one chunk) with 16 warps instead of 8, faster in fp32 without a mask; rows of 1024 steps lose
# with 16 warps and keep the table (docs/kernel-choices.md, 'Retrace').
# Rows of 1025-2047 steps (the same 2048-step program, its tail masked) and bf16/fp16/float64 calls take
# the rule untimed; walked rows of Retrace and masked calls keep the table.
# Rows split across programs, fp32 without a mask: 1024-step chunks chained by the look-back, 64 rows or
# more (host.SPLIT_ROWS_FROM) with 8 warps reading the words of 32 chunks at once (one warp's), one row with
# 4 warps and a window of 128 (one word a thread) in place of the three passes; both faster than the
# table's 2048-step chunks (docs/kernel-choices.md, 'Long rows split').
ROW = Row(Family.RETRACE, kernel, ("rewards", "values", *BOUNDARY, "log_probs", "target_log_probs", "q_values"),
          ("q_targets",), ("p_q",), scalars=("gamma", "lam", "c_bar"),
          whole_rows=WholeRows(1025, 2048, False, ((2048, 16),), 1), quads=True,
          split_rows=SplitRows(1024, 8, 32), split_row=SplitRows(1024, 4, 128),
          step=step, step_data=("values", "q_values", "log_probs", "target_log_probs"), step_outputs=1,
          adjoint=backward, saves_output=True, torch_steps=torch_path.steps, torch_outputs=torch_path.outputs)
