"""The forward estimators: eligibility traces and episodic sums."""

from rollbuf.kernels.row import Row, WholeRows
from rollbuf.kernels.traces.adjoint import backward
from rollbuf.problem import Family


def kernel():
    from rollbuf.kernels.traces.triton import trace_kernel  # Triton is optional: imported at the first launch
    return trace_kernel


def step():
    from rollbuf.kernels.traces.cpu import step  # numba is optional: imported by the CPU backend
    return step


# Rows held whole (rollbuf.kernels.host.strategy): rows of 2049-4096 steps, 8 warps. Measured on the H200
# at 28e5dea (results/ab_whole_rows_28e5dea.csv, device time): 8192x4096 122.5 -> 86.2 µs, 2048x4096
# 34.1 -> 25.6, 512x4096 13.9 -> 8.1, 128x4096 6.5 -> 3.5.
ROW = Row(Family.FORWARD, kernel, ("x", None, "terminated", "truncated", None, "mask"), ("traces", "sums"),
          ("p_out", "p_out"), scalars=("decay",), backward=False,
          whole_rows=WholeRows(2049, 4096, False, ((4096, 8),), 1), step=step, step_outputs=1, adjoint=backward)
