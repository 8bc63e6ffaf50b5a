"""V-trace (Espeholt et al., 2018)."""

from rollbuf.kernels.row import LongRows, Row, SplitRows, WholeRows
from rollbuf.kernels.td_lambda import BOUNDARY
from rollbuf.kernels.vtrace import torch_path
from rollbuf.kernels.vtrace.adjoint import backward
from rollbuf.problem import Family


def kernel():
    from rollbuf.kernels.vtrace.triton import vtrace_kernel  # Triton is optional: imported at the first launch
    return vtrace_kernel


def step():
    from rollbuf.kernels.vtrace.cpu import step  # numba is optional: imported by the CPU backend
    return step


# The strategy table's entries (rollbuf.kernels.host.strategy; docs/kernel-choices.md, 'V-trace'):
# * the longest chunk: 1024 steps; V-trace carries a pair state (five map components per lane), and its
#   2048-step chunks hold too many registers per program.
# * long rows, of 1024-step chunks: walked two to a program with 16 warps, split ones with 4 warps, the
#   fastest of the counts timed. With a mask, and for rows longer than 4096 steps (the others are held whole).
# * 64 rows or more split (host.SPLIT_ROWS_FROM), fp32 without a mask: 8 warps, the look-back reading the
#   words of 32 chunks at once (one warp's); faster than 4 warps reading one chunk at a time (the split
#   warps above then apply with a mask, in other dtypes and to fewer rows). One row keeps the three passes.
# * rows held whole: its scalar scan without a mask, the targets read back, 8 warps at 1024 steps and 16
#   from 2048: faster than walking them two to a program in 1024-step chunks, or splitting them.
# * chunks held in reverse in a backward call: 512 steps (docs/kernel-choices.md, 'Flipped chunks').
ROW = Row(Family.VTRACE, kernel, ("rewards", "values", *BOUNDARY, "log_probs", "target_log_probs"),
          ("vs", "pg_advantages"), ("p_vs", "p_pg"), scalars=("gamma", "lam", "rho_bar", "c_bar", "pg_rho_bar"),
          pair=True, whole_rows=WholeRows(1024, 4096, False, ((1024, 8), (2048, 16), (4096, 16)), 2),
          long_rows=LongRows(2, 16, 4), split_rows=SplitRows(1024, 8, 32), max_chunk=1024, flip_chunks=(512,),
          quads=True,
          step=step, step_data=("values", "log_probs", "target_log_probs"), step_outputs=2,
          adjoint=backward, saves_output=True, torch_steps=torch_path.steps, torch_outputs=torch_path.outputs)
