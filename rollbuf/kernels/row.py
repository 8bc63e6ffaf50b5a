"""A family's row of the kernel table: everything the backends read about one scan kind.

Each family package (:mod:`rollbuf.kernels.td_lambda`, ...) defines its :class:`Row` next to the code
it points at: the Triton kernel (``triton.py``), the step of the compiled CPU loop (``cpu.py``) and
the analytic adjoint (``adjoint.py``). :data:`rollbuf.kernels.families.FAMILIES` holds the rows by
:class:`~rollbuf.problem.Family`. The Triton kernel and the numba step are reached through functions
that import them on first use (both packages are optional); the adjoint is plain torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from rollbuf.problem import Family


@attrs.frozen
class WholeRows:
    """Env-major rows of ``shortest`` to ``longest`` steps held whole, one per program in one chunk,
    where the family reads no mask (see :func:`rollbuf.kernels.host.strategy`)."""

    shortest: int
    longest: int
    only_split: bool  # only where the table would split them
    warps: tuple[tuple[int, int], ...]  # (chunk length, warps), per chunk length
    most_outputs: int  # a call writing more outputs than were timed keeps the table


@attrs.frozen
class LongRows:
    """Chunks of 1024 steps and more: ``rows`` per walking program with ``warps``, split rows with
    ``split_warps`` (see :func:`rollbuf.kernels.host.strategy`)."""

    rows: int
    warps: int
    split_warps: int


@attrs.frozen
class Row:
    """One family: its kernels, their fields and outputs, and its entries of the strategy table."""

    family: Family
    kernel: Callable[[], Any]  # the Triton kernel (``@triton.jit``), imported when first asked for
    fields: tuple[str | None, ...]  # the kernel's ``fields`` tuple, by field name (None: a slot left empty)
    outputs: tuple[str, ...]  # output names (Problem.outputs)
    out_params: tuple[str, ...]  # the kernel parameter of each output (the forward families write one: both name it)
    scalars: tuple[str, ...] = ()  # Problem attributes passed as float64 scalars (the kernel's and the step's)
    pair: bool = False  # the state is a pair (V-trace's (u, V))
    backward: bool = True  # backward in time, window end bootstrapped from V(s_T); else forward/affine
    # the strategy table (rollbuf.kernels.host.strategy): rows held whole, long rows, the longest chunk
    # and the chunk lengths of a backward scan held in reverse
    whole_rows: WholeRows | None = None
    long_rows: LongRows | None = None
    max_chunk: int | None = None
    flip_chunks: tuple[int, ...] = ()
    # the compiled CPU loop (rollbuf.backends.compiled_cpu): the step (imported when first asked for),
    # the data fields it reads after the main input, and its outputs (None: as the problem asks)
    step: Callable[[], Any] | None = None
    step_data: tuple[str, ...] = ()
    step_outputs: int | None = None
    # the analytic adjoint ``adjoint(a, grads, out0)`` (rollbuf.backends.autograd; None: the generic
    # backward), and whether it reads the first output (``out0``), saved by the forward
    adjoint: Callable[..., list] | None = None
    saves_output: bool = False

    @property
    def state(self) -> int:
        """The scan state's size: 2 for a pair, else 1."""
        return 2 if self.pair else 1
