"""The kernels: per estimator family, one folder with its Triton kernel, its step of the compiled
CPU loop, its analytic adjoint and its row of the kernel table.

* one package per family, each holding ``triton.py`` (the ``@triton.jit`` entry and its three device
  functions), ``cpu.py`` (the numba step), ``adjoint.py`` (the backward), ``torch_path.py`` (the torch
  backend's maps and epilogue), ``estimators.py`` (its registry entries) and its
  :class:`~rollbuf.kernels.row.Row`: :mod:`~rollbuf.kernels.td_lambda` (GAE, TD(λ), discounted
  and Monte-Carlo returns, and their adjoint), :mod:`~rollbuf.kernels.vtrace`,
  :mod:`~rollbuf.kernels.retrace`, :mod:`~rollbuf.kernels.traces` (eligibility traces, episodic
  sums), :mod:`~rollbuf.kernels.affine` (the generic scan); :mod:`~rollbuf.kernels.families`, the
  rows by :class:`~rollbuf.problem.Family`. Importing a family needs neither Triton nor numba:
  its row reaches the kernel and the step through functions that import them when asked for;
* what the families share: :mod:`~rollbuf.kernels.core` (the Triton side: loads, a chunk's scan,
  the carry past the window, the decoupled look-back, the driver that walks a row or takes one
  chunk of it), :mod:`~rollbuf.kernels.resolve` (the middle pass of a split single row) and
  :mod:`~rollbuf.kernels.loop` (the numba side: the one loop over a row's steps);
* :mod:`~rollbuf.kernels.host`: the strategy table, the :class:`Launch` built once per call
  signature (layout, strategy, grid, constexprs) and kept in the one plan cache (:mod:`rollbuf.cache`),
  launched by keyword through
  Triton's JIT call, and :func:`run` (the ahead-of-time compile matrix, a developer tool, is
  ``tools/aot.py`` at the repository root).
* :mod:`~rollbuf.kernels.group_stats`: the group statistics of :func:`rollbuf.groups.group_stats`
  (and verl's GRPO and vectorized RLOO fused), one launch over ``[B]`` scores; apart from the scans.

The arithmetic of every estimator comes from its family's ``coefficients.py``, compiled into the
kernels from the same source the torch backend runs.
"""

from rollbuf.kernels.families import FAMILIES  # noqa: F401
from rollbuf.kernels.host import (  # noqa: F401
    FORCE,
    GATHER_MAX_T,
    MAX_CHUNK,
    PRESOLVE_MAX_ROWS,
    TILE,
    Launch,
    Strategy,
    device_sms,
    forced,
    forced_choices,
    launch_for,
    output_buffers,
    run,
    signature,
    strategy,
)
