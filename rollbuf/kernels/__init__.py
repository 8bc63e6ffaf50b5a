"""The ``triton`` backend: one small kernel per estimator family behind a cached launch.

* :mod:`~rollbuf.kernels.core`: what every family shares (loads, a chunk's scan, the carry past
  the window, the decoupled look-back, the driver that walks a row or takes one chunk of it);
* one file per family, each an entry of at most 23 parameters and its three device functions
  (the fields a step reads, the scan's elements, the outputs): :mod:`~rollbuf.kernels.td_lambda` (GAE, TD(λ), discounted and
  Monte-Carlo returns), :mod:`~rollbuf.kernels.vtrace`, :mod:`~rollbuf.kernels.retrace`,
  :mod:`~rollbuf.kernels.traces` (eligibility traces, episodic sums),
  :mod:`~rollbuf.kernels.affine` (the generic scan), :mod:`~rollbuf.kernels.adjoint` (the TD(λ)
  family's backward); :mod:`~rollbuf.kernels.resolve`, the middle pass of a split single row;
* :mod:`~rollbuf.kernels.host`: the strategy table, the :class:`Launch` built once per call
  signature (layout, strategy, grid, constexprs) and cached under it, launched by keyword through
  Triton's JIT call, and :func:`run`.

The arithmetic of every estimator comes from :mod:`rollbuf.boundary.coefficients`, compiled into
the kernels from the same source the torch backend runs.
"""

from rollbuf.kernels.host import (  # noqa: F401
    FAMILIES,
    FAMILY_MAX_CHUNK,
    FAMILY_WHOLE_ROWS,
    GATHER_MAX_T,
    LAUNCHES,
    MAX_CHUNK,
    PRESOLVE_MAX_ROWS,
    TILE,
    Launch,
    Strategy,
    device_sms,
    forced,
    launch_for,
    output_buffers,
    run,
    signature,
    strategy,
)

