"""The forward estimators: eligibility traces and episodic sums."""

from rollbuf.kernels.row import Row, WholeRows
from rollbuf.kernels.traces import torch_path
from rollbuf.kernels.traces.adjoint import backward
from rollbuf.problem import Family


def kernel():
    from rollbuf.kernels.traces.triton import trace_kernel  # Triton is optional: imported at the first launch
    return trace_kernel


def step():
    from rollbuf.kernels.traces.cpu import step  # numba is optional: imported by the CPU backend
    return step


# Rows held whole (rollbuf.kernels.host.strategy): rows of 2049-4096 steps, 8 warps, faster than the
# table's chunks (docs/kernel-choices.md, 'Eligibility traces and episodic sums').
ROW = Row(Family.FORWARD, kernel, ("x", None, "terminated", "truncated", None, "mask"), ("traces", "sums"),
          ("p_out", "p_out"), scalars=("decay",), backward=False,
          whole_rows=WholeRows(2049, 4096, False, ((4096, 8),), 1), step=step, step_outputs=1, adjoint=backward,
          torch_steps=torch_path.steps, torch_outputs=torch_path.outputs)
