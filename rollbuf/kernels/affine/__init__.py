"""The generic affine scan ``y_t = α_t + β_t·y_{t±1}`` (:func:`rollbuf.functional.affine_scan`, the scans of the
analytic adjoints); its gradient is the generic backward's."""

from rollbuf.kernels.row import Row
from rollbuf.problem import Family


def kernel():
    from rollbuf.kernels.affine.triton import affine_kernel  # Triton is optional: imported at the first launch
    return affine_kernel


def step():
    from rollbuf.kernels.affine.cpu import step  # numba is optional: imported by the CPU backend
    return step


FIELDS = ("alpha", "beta")
ROW = Row(Family.AFFINE, kernel, FIELDS, ("y",), ("p_out",), backward=False, step=step, step_data=("beta",),
          step_outputs=1)
