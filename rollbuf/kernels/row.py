"""A family's row of the kernel table (:data:`rollbuf.kernels.families.FAMILIES`), defined in its
package next to the code it points at. The Triton kernel and the numba step are reached through
functions that import them on first use (both are optional); the adjoint is plain torch."""

from collections.abc import Callable
from typing import Any

import attrs

from rollbuf.problem import Family


@attrs.frozen
class WholeRows:
    """Rows held whole, one per program in one chunk (see :func:`rollbuf.kernels.host.strategy`)."""

    shortest: int
    longest: int
    only_split: bool  # only where the table would split them
    warps: tuple[tuple[int, int], ...]  # (chunk length, warps), per chunk length
    most_outputs: int  # a call writing more outputs than were timed keeps the table


@attrs.frozen
class LongRows:
    """Chunks of 1024 steps and more: walked ``rows`` to a program, split rows' warps (``strategy``)."""

    rows: int
    warps: int
    split_warps: int


@attrs.frozen
class SplitRows:
    """Rows split across programs and chained by the look-back, one chunk a program: the family's
    chunk length, warps and look-back window (the words of ``window`` chunks read at once, a power of
    two from 32; 0: one chunk at a time); ``outputs``: only for calls writing one of these outputs
    (empty: every call). See :func:`rollbuf.kernels.host.strategy`."""

    chunk: int
    warps: int
    window: int
    outputs: tuple[str, ...] = ()


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
    whole_rows: WholeRows | None = None  # the strategy table's (host.strategy): rows held whole,
    long_rows: LongRows | None = None  # long rows,
    split_rows: SplitRows | None = None  # several rows split (fp32 without a mask; else the table's),
    split_row: SplitRows | None = None  # one row split: the look-back in place of the three passes (the same),
    max_chunk: int | None = None  # the longest chunk,
    flip_chunks: tuple[int, ...] = ()  # the chunk lengths of a backward scan held in reverse
    quads: bool = False  # a backward scan's chunks held in quads by the table's rule (host.quads_rule)
    fill_per_sm: int | None = None  # programs per SM below which long rows are split (None: the table's)
    step: Callable[[], Any] | None = None  # the compiled CPU loop's step, imported when first asked for,
    step_data: tuple[str, ...] = ()  # the data fields it reads after the main input,
    step_outputs: int | None = None  # its outputs (None: as the problem asks)
    adjoint: Callable[..., list] | None = None  # the analytic adjoint(a, grads, out0) (None: the generic one)
    # the torch backend's path (torch_path.py): steps(t) -> (maps, env), outputs(t, maps, env) -> (outputs, carry)
    torch_steps: Callable[..., tuple] | None = None
    torch_outputs: Callable[..., tuple] | None = None
    saves_output: bool = False  # the adjoint reads the first output (out0): the forward saves it
    state: int = attrs.field(init=False, default=attrs.Factory(lambda row: 2 if row.pair else 1, takes_self=True))
