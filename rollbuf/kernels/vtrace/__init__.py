"""V-trace (Espeholt et al., 2018)."""

from rollbuf.kernels.row import LongRows, Row, WholeRows
from rollbuf.kernels.td_lambda import BOUNDARY
from rollbuf.kernels.vtrace.adjoint import backward
from rollbuf.problem import Family


def kernel():
    from rollbuf.kernels.vtrace.triton import vtrace_kernel  # Triton is optional: imported at the first launch
    return vtrace_kernel


def step():
    from rollbuf.kernels.vtrace.cpu import step  # numba is optional: imported by the CPU backend
    return step


# The strategy table's entries (rollbuf.kernels.host.strategy):
# * the longest chunk: V-trace carries a pair state (five map components per lane): its 2048-step
#   chunks hold too many registers per program. Measured on the H200 at c612211
#   (results/ab_unit_chunk_c612211.csv): 1024-step chunks 16384x4096 1672 -> 1134 µs; for GAE the same
#   change was +5% at 16384x4096 and +15% at 1x2^20, Retrace +18%.
# * long rows, of 1024-step chunks: walked two to a program with 16 warps (2048x2048 48.4 µs, 8192x4096
#   345, against 58.9 and 429 with 8 warps; 1 row with 16 warps: 68.6 and 500), split ones with 4 warps
#   (256x131072 465 µs; with 16: 643). Measured on the H200 at 1ec5553 and 51c957e. With a mask, and
#   for rows longer than 4096 steps (the others are held whole).
# * rows held whole: its scalar scan without a mask, the targets read back; a row of 1024 steps and
#   more was walked two to a program in 1024-step chunks, or split. Measured on the H200 at 28e5dea
#   (results/ab_whole_rows_28e5dea.csv, device time): 16 warps from 2048 steps, 2048x2048 81.5 -> 41.5 µs
#   with truncations (49.7 -> 37.4 without), 8192x2048 306 -> 148, 8192x4096 601 -> 381, 16384x4096
#   1248 -> 767, 128x2048 7.6 -> 3.8, 128x4096 12.1 -> 7.3; equal at 2048x4096 without truncations
#   (95.2 -> 95.8); 8 warps at 1024 steps (2048x1024 20.4 -> 18.0; 16 warps 18.9).
# * chunks held in reverse in a backward call: 512 steps (measured: above rollbuf.kernels.host.flip_rule).
ROW = Row(Family.VTRACE, kernel, ("rewards", "values", *BOUNDARY, "log_probs", "target_log_probs"),
          ("vs", "pg_advantages"), ("p_vs", "p_pg"), scalars=("gamma", "lam", "rho_bar", "c_bar", "pg_rho_bar"),
          pair=True, whole_rows=WholeRows(1024, 4096, False, ((1024, 8), (2048, 16), (4096, 16)), 2),
          long_rows=LongRows(2, 16, 4), max_chunk=1024, flip_chunks=(512,),
          step=step, step_data=("values", "log_probs", "target_log_probs"), step_outputs=2,
          adjoint=backward, saves_output=True)
