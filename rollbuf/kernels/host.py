"""Host side of the kernels: the strategy table, the launch and its cache.

A :class:`Launch` is everything about a call that does not change while its tensors' shapes,
strides, dtypes and device stay the same: the family's kernel, the call's layout (which fields must
be made to match it), the strategy, the grid and the constexprs. Launches are kept in the one plan
cache (:data:`rollbuf.cache.PLANS`) under a cheap signature of the call (:func:`signature`). Each
run launches the family's kernel through Triton's public JIT call with keyword arguments,
``kernel[grid](fields=..., outputs=..., carries=..., sizes=..., gamma=..., CFG=..., num_warps=...)``:
the names are the kernel's parameter names (checked against its signature when the launch is
built), so no argument order is written down outside the kernel itself.

Nothing is shared between calls: outputs, the carry out and the split rows' scratch are allocated
per call from PyTorch's caching allocator on the current stream (the scratch's flag words zeroed
there too), so calls on two streams, from several threads or replayed from a CUDA graph cannot
collide. A launch runs under the device of its tensors; under Triton's interpreter
(``TRITON_INTERPRET=1``) one launch runs at a time (the interpreter keeps its grid state global).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
import os
import threading

import attrs
import torch

from rollbuf import cache
from rollbuf.kernels.families import FAMILIES
from rollbuf.kernels.row import LongRows, SplitRows, WholeRows
from rollbuf.problem import Family, Problem

# ---- the strategy table ------------------------------------------------------------------------

# Tiles of short rows: 512 elements per program, one warp per 128 elements (4 per thread), 1 to 8
# warps (one per 64 for rows of 8 steps or fewer, SHORT_T): faster than larger tiles with fewer warps, from a
# joint sweep of rows per program and warps (docs/kernel-choices.md, 'Tiles of short rows').
TILE = 512
WARP_ELEMS = 128
# Rows of at most SHORT_T steps: tiles of TILE / 2 elements (time-contiguous rows), one warp per 64
# (2 per thread); but a forward scan over rows of 5-8 steps with rows enough to fill the GPU in whole
# tiles keeps TILE elements and a warp per 128 (4 a thread: the eligibility traces and episodic sums at
# 2^21 x 8 took 68.2 us against 72.2, H100, f1ba9b5; the backward scans lost there:
# docs/kernel-choices.md, 'Elements per thread').
SHORT_T = 8
# Backward scans (Triton's reverse scan flips every element across the warp) walk rows in WALK_CHUNK-step
# chunks, with 8 elements per thread (a warp per 2·WARP_ELEMS) without a mask and 4 with one; their one
# chunk of WIDE_FROM steps or more takes 8 per thread where a step moves at most FEW_BYTES bytes (the
# scan's work per element outweighs the loads in flight); with a mask over a scalar state (the exclusive
# state by the in-register shift), tiles of MASKED_WIDE steps take 8 per thread. None of it where a
# tiling choice is forced. Timed on every estimator (docs/kernel-choices.md, 'Elements per thread').
WIDE_FROM = 1024
FEW_BYTES = 10
MASKED_WIDE = (64, 512)
WALK_CHUNK = 1024
FILL_PER_SM = 8  # programs per SM below which long rows are split across programs
CPU_SMS = 132  # the SM count assumed off the GPU (an H200's), so the interpreter takes the GPU's choices
# The in-register shift (tl.gather) is faster for chunks up to 512 steps, re-loading the neighbour from
# 1024 on; 2048-step chunks beat 1024 from T = 2048 on (docs/kernel-choices.md, 'In-register shift
# or re-load, and the longest chunk').
GATHER_MAX_T = 512
MAX_CHUNK = 2048
# A family's own entries of the table (rows held whole, long rows, its longest chunk, chunks flipped) are
# in its Row (rollbuf.kernels.row); why each is what it is: docs/kernel-choices.md, 'Each family's entries'.
# Split rows of at most this many rows take the three passes instead of the look-back chain: they win for
# one row; they read the chunks twice, and with several rows the chains overlap, so from four rows on
# they lose (docs/kernel-choices.md, 'Long rows split: look-back or three passes'); a family's own program
# for one split row (its Row.split_row, host.split_rule) takes the look-back instead.
PRESOLVE_MAX_ROWS = 1
# A family's own program for several split rows (its Row.split_rows) from this many rows: timed at 64 and
# 256 rows; with fewer, each row's chain is longer and one row lost with it (docs/kernel-choices.md).
SPLIT_ROWS_FROM = 64
# A family's program for one split row, not where the three passes re-read the row from L2: a row of
# between L2 / L2_LOW_DIV and L2_HIGH_MUL · L2 bytes (read and written) keeps the three passes, whose last
# pass finds much of it still in L2; shorter rows (one launch instead of three) and longer ones (the second
# read from memory) take the family's program (docs/kernel-choices.md, 'Long rows split').
L2_LOW_DIV, L2_HIGH_MUL = 8, 2
CPU_L2 = 50 << 20  # the L2 bytes assumed off the GPU (an H100's and an H200's)


@attrs.frozen
class Strategy:
    """How one call's rows are cut into programs (see :func:`strategy`)."""

    block_n: int  # rows per program
    block_t: int  # steps per chunk
    split: bool  # rows split across programs, one chunk each (else walked by one program)
    num_seg: int  # chunks per row when split
    num_warps: int
    shift_load: bool  # the exclusive state by re-loading the neighbouring step (else an in-register shift)
    presolve: int = False  # split rows: three passes (True) instead of the look-back chain; 2: two passes
    resolve_block_r: int = 0  # chunks per block of the three passes' middle kernel (0: the rule)
    flip: bool = False  # backward scans: each chunk held in reverse, lane j at its step BLOCK_T−1−j
    quads: bool = False  # backward scans: each chunk held in quads of 4 steps, latest first (no reverse scan)
    poll: int = 0  # the look-back of one-row chunks: the words of this many chunks read at once (0: one at a time)


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@attrs.frozen
class Choices:
    """Choices forced on the strategy table (tests, experiments; :func:`forced`): ``None`` = the table's."""

    block_t: int | None = None  # steps per chunk
    split: bool | None = None  # rows split across programs
    shift_load: bool | None = None  # the exclusive state by re-loading the neighbouring step
    max_chunk: int | None = None  # the longest chunk
    block_n: int | None = None  # rows per program
    presolve: int | None = None  # split rows: three passes (True), two (2) or the look-back chain (False)
    num_warps: int | None = None
    resolve_block_r: int = 0  # chunks per block of the three passes' middle kernel (0: the rule)
    flip: bool | None = None  # backward scans: chunks held in reverse
    quads: bool | None = None  # backward scans: chunks held in quads, latest first
    poll: bool | int | None = None  # the look-back of one-row chunks: a window read at once (True: one word a
    # thread; a power of two from 32: that many words; checked by forced())


@functools.lru_cache(maxsize=4096)
def strategy(R: int, T: int, time_contiguous: bool = True, *, sms: int = CPU_SMS, long_rows: LongRows | None = None,
             whole_rows: WholeRows | None = None, flip_chunks: tuple = (), fill_per_sm: int | None = None,
             masked: bool = False, step_bytes: int = 0, reverse_scan: bool = True, **choices) -> Strategy:
    """Tile sizes, split and warps for ``R`` rows of ``T`` steps on a GPU of ``sms`` SMs.

    ======================================  ===============================================================
    case                                    programs
    ======================================  ===============================================================
    time-major, fewer than ``4·sms`` tiles  ``T ≤ 128``: 16 rows × the whole row each; longer: 32 rows ×
    of 16 rows                              128 steps, split across programs (look-back)
    ``T ≤ max_chunk``                       tiles of ``TILE / T`` rows (512 elements; halved while fewer
                                            than ``4·sms`` programs), the whole row in one chunk
    longer, ``R ≥ 8·sms``                   one row per program, walked in ``max_chunk`` chunks (a
                                            backward scan: ``WALK_CHUNK``)
    longer, ``R < 8·sms``                   one chunk per program: look-back; one row: three passes (a
                                            family's own: :func:`split_rule`)
    ======================================  ===============================================================

    ``max_chunk``: 2048 steps (1024 for V-trace's pair state); the exclusive state by an in-register
    shift for chunks up to 512 steps, by re-loading the neighbouring step beyond. Warps: one per 128
    elements of a program's tile, 1 to 8 (rows of 8 steps or fewer: 256-element tiles, one per 64; a
    forward scan's rows of 5-8 steps where 64-row tiles fill the GPU: 512-element tiles, one per 128);
    a backward scan's (``reverse_scan``) rows walked by one program in ``WALK_CHUNK``-step chunks (4
    warps: one per 256 elements, 8 a thread; 8 warps with a mask), and its one chunk of 1024 steps one
    warp per 256 where a step moves at most ``FEW_BYTES`` (``step_bytes``); tiles of 64-512 steps with
    a mask over a scalar state (``masked``) one warp per 256; none of these where a tiling choice is
    forced (``block_t``, ``max_chunk``, ``block_n``, ``num_warps``). ``long_rows``
    (:class:`~rollbuf.kernels.row.LongRows`: rows per program, its warps, split warps) for chunks of
    1024 steps and more: V-trace's. ``whole_rows`` (:class:`~rollbuf.kernels.row.WholeRows`): env-major
    rows of ``shortest`` to ``longest`` steps held whole, one per program in one chunk, with the warps
    of their chunk length (the family's, without a mask: its row's ``whole_rows``); ``only_split``:
    only where the table would split them; a forced
    ``block_t``, ``split``, ``block_n`` or ``presolve`` skips it. Every other argument forces that
    choice (tests, experiments): ``choices`` are :class:`Choices`' fields.

    ``flip`` (backward scans only; the caller passes ``False`` for the others): hold each chunk in
    reverse, so that the scan runs in lane order; by default :func:`flip_rule` with ``flip_chunks``,
    the chunk lengths flipped for this call (the family's ``Row.flip_chunks``). ``quads`` (backward
    scans only): hold each chunk of 4 steps or more in quads of 4 steps, the latest first
    (:func:`rollbuf.kernels.core.steps`), scanned without Triton's reverse scan; a flipped chunk is not
    in quads; in quads the exclusive state comes out of the scan: ``shift_load`` is off unless forced.
    Not forced, the table gives lane order, and :func:`in_quads` puts a family's chunks in quads
    where its rule says (the launch calls it for the families whose ``Row.quads`` says so).
    """
    c = Choices(**choices)
    st = _table(R, T, time_contiguous, c, sms, long_rows, whole_rows, sms * (fill_per_sm or FILL_PER_SM), masked,
                step_bytes, reverse_scan)
    flip = flip_rule(st, T, flip_chunks) if c.flip is None else bool(c.flip)
    st = attrs.evolve(st, flip=flip)
    return _quads(st, c.shift_load) if c.quads and st.block_t >= 4 and not flip else st


def split_rule(st: Strategy, R: int, T: int, time_contiguous: bool, own: tuple[SplitRows | None, SplitRows | None],
               shift_load: bool | None = None, row_bytes: int = 0, l2: int = CPU_L2) -> Strategy:
    """The table's strategy ``st`` for ``R`` rows of ``T`` steps with a family's own program where the
    table splits time-contiguous rows across programs: ``own``, its row's ``(split_rows, split_row)``
    (:class:`~rollbuf.kernels.row.SplitRows`: chunk, warps, look-back window), for ``SPLIT_ROWS_FROM`` rows
    or more and for one row (in place of the three passes). The launch applies it only to the calls they
    were timed on (fp32, no mask) with no tiling, lane order or quads forced; ``shift_load``: a forced
    choice. One row of ``row_bytes`` (read and written) between ``l2 // L2_LOW_DIV`` and ``L2_HIGH_MUL · l2``
    (the GPU's L2 bytes) keeps the three passes."""
    several = own[0] if R >= SPLIT_ROWS_FROM else None
    in_l2 = l2 // L2_LOW_DIV <= row_bytes <= L2_HIGH_MUL * l2
    entry = (None if in_l2 else own[1]) if R <= PRESOLVE_MAX_ROWS else several
    entry = entry if st.split and time_contiguous else None
    if entry is None:
        return st
    return Strategy(1, entry.chunk, True, -(-T // entry.chunk), entry.warps,
                    entry.chunk > GATHER_MAX_T if shift_load is None else shift_load, False, st.resolve_block_r,
                    poll=entry.window)


def _quads(st: Strategy, shift_load: bool | None) -> Strategy:
    """``st`` in quads: the scan gives the exclusive state itself, nothing to re-load (unless forced)."""
    return attrs.evolve(st, quads=True, shift_load=False if shift_load is None else shift_load)


def in_quads(st: Strategy, T: int, time_contiguous: bool, scan_output: bool,
             shift_load: bool | None = None, advantages: bool = False) -> Strategy:
    """The table's strategy ``st`` for a backward call of ``T`` steps, of a family whose chunks go in
    quads, with its chunks in quads where :func:`quads_rule` says so (time-contiguous rows, not flipped;
    ``scan_output``: the scan is the family's output itself; ``shift_load``: a forced choice;
    ``advantages``: the TD(λ) family writes advantages)."""
    if time_contiguous and not st.flip and not st.quads and quads_rule(st, T, scan_output, advantages):
        return _quads(st, shift_load)
    return st


# Backward scans with each chunk held in reverse, lane j at step BLOCK_T−1−j (the scan in lane order),
# against Triton's reverse scan (which flips every element across the warp with five chained butterfly
# shuffles on the way in and out, but keeps the loads vectorised; flipped, the loads are scalar).
# Flipping wins only for 512-step one-row chunks of the TD(λ) family and V-trace, fp32, without
# truncations or a mask (the families' Row.flip_chunks); bf16/fp16 inputs and float64 calls were not
# timed flipped and are not flipped by default (docs/kernel-choices.md, 'Flipped chunks').


# Backward chunks held in quads (core._quad_scan: each thread's 4 steps composed in registers, one forward
# scan over the quads that also gives the exclusive state) against Triton's reverse scan (every element
# flipped across the warp, and an exclusive state by a lane shift or a re-load). Quads won in most cases
# timed from 64-step chunks on (2^21 rows of 8 steps lost: two quads a row; 16 and 32 steps not timed),
# but for the TD(λ) family's advantages in the look-back (split rows chained: GAE and advantages lost
# 8-15%, the returns alone and the other families gained) and for a scan of the output itself (TD(λ)
# without a mask) walked at 8 elements a thread; the losses kept (GAE and TD(λ) returns 4% at
# 16384 x 1024, masked V-trace 9% there in the first version) are in docs/kernel-choices.md, 'Chunks in quads'.
QUADS_FROM = 64


def quads_rule(st: Strategy, T: int, scan_output: bool, advantages: bool = False) -> bool:
    """Whether a backward call of ``T`` steps with strategy ``st`` holds its chunks in quads by default:
    chunks of ``QUADS_FROM`` steps or more; split rows chained by the look-back unless the TD(λ) family
    writes advantages (``advantages``); a scan of the output itself (``scan_output``) not where its rows
    are walked with 8 or more elements a thread."""
    if st.block_t < QUADS_FROM:
        return False
    if st.split and not st.presolve:
        return not advantages
    walked = not st.split and st.block_t < T
    thick = st.block_n * st.block_t >= 8 * 32 * st.num_warps
    return not (scan_output and walked and thick)


def flip_rule(st: Strategy, T: int, chunks: tuple) -> bool:
    """Whether a backward call of ``T`` steps with strategy ``st`` holds its chunks in reverse: one row
    per program in one chunk whose length is in ``chunks``."""
    return st.block_n == 1 and not st.split and st.block_t >= T and st.block_t in chunks


def _table(R, T, time_contiguous, c: Choices, sms, long_rows, whole_rows, split_below, masked=False,
           step_bytes=0, reverse_scan=True) -> Strategy:
    """:func:`strategy`'s table; ``split_below``: the rows below which long rows are split (the table's
    ``FILL_PER_SM · sms``, or the family's own); ``masked``: a mask over a scalar state (the scan's
    outputs read the exclusive state); ``step_bytes``: the bytes a step reads and writes (0: unknown);
    ``reverse_scan``: the scan runs backward in time (Triton's reverse scan)."""
    block_t, split, shift_load, block_n, presolve = c.block_t, c.split, c.shift_load, c.block_n, c.presolve
    num_warps, resolve_block_r, max_chunk = c.num_warps, c.resolve_block_r, c.max_chunk
    fill = FILL_PER_SM * sms
    mc = max_chunk or MAX_CHUNK
    if whole_rows and time_contiguous and block_t is None and split is None and block_n is None and presolve is None:
        bt = _pow2(T)
        split_here = -(-T // min(bt, MAX_CHUNK)) > 1 and split_below > R
        if whole_rows.shortest <= T <= whole_rows.longest and (split_here or not whole_rows.only_split):
            return Strategy(1, bt, False, 1, num_warps or dict(whole_rows.warps)[bt],
                            bt > GATHER_MAX_T if shift_load is None else shift_load, resolve_block_r=resolve_block_r)

    # rows of at most SHORT_T steps in half tiles, 2 elements a thread; a forward scan over time-contiguous
    # rows of 5-8 steps in whole tiles, 4 a thread, where whole tiles still fill the GPU (no tiling forced)
    whole_tiles = -(-R // (TILE // SHORT_T))  # programs of 64-row tiles
    whole_tile = (not reverse_scan and time_contiguous and SHORT_T // 2 < T <= SHORT_T and whole_tiles >= fill // 2
                  and block_t is None and block_n is None and num_warps is None and max_chunk is None)

    def warps(elems, bt, wide=False):
        """One warp per WARP_ELEMS elements (``wide``: twice as many), half as many for rows of at most
        SHORT_T steps (but ``whole_tile``); 1 to 8."""
        if num_warps:
            return num_warps
        per = WARP_ELEMS // 2 if bt <= SHORT_T and not whole_tile else 2 * WARP_ELEMS if wide else WARP_ELEMS
        return max(1, min(8, elems // per))

    if not time_contiguous and block_t is None and split is None and block_n is None and fill // 2 > R // 16:
        # time-major, too few rows to fill the GPU with 16-row tiles walking their rows: rows up to 128
        # steps one 16 x T tile each; longer rows split across programs in 32-row x 128-step tiles
        # chained by the look-back; both faster than the walking tiles (docs/kernel-choices.md, 'Time-major rows')
        if T <= 128:
            bt = max(_pow2(T), 2)
            return Strategy(16, bt, False, 1, num_warps or max(1, min(8, 16 * bt // 256)), bt > GATHER_MAX_T,
                            resolve_block_r=resolve_block_r)
        return Strategy(32, 128, True, -(-T // 128), num_warps or 8, False, presolve or False,
                        resolve_block_r=resolve_block_r)
    bt = block_t or (min(_pow2(T), mc) if time_contiguous else min(_pow2(T), 32))
    bt = max(bt, 2)
    chunks = -(-T // bt)
    if split is None:
        split = chunks > 1 and split_below > R
    if (not split and chunks > 1 and time_contiguous and reverse_scan and block_t is None and max_chunk is None
            and block_n is None and num_warps is None):  # no tiling choice forced
        bt = min(bt, WALK_CHUNK)  # rows walked by one program: shorter chunks
        chunks = -(-T // bt)
    sl = bt > GATHER_MAX_T if shift_load is None else shift_load
    if split:
        bn = block_n or 1
        pre = R <= PRESOLVE_MAX_ROWS if presolve is None else presolve
        w = num_warps or long_rows.split_warps if long_rows and bt >= 1024 and not block_n else warps(bn * bt, bt)
        # the look-back's window: True, one word a thread; a number, that many words
        poll = (32 * w if c.poll is True else _window_words(c.poll)) if c.poll and bn == 1 and not pre else 0
        return Strategy(bn, bt, True, chunks, w, sl, pre,
                        resolve_block_r, poll=poll)
    if block_n:
        return Strategy(block_n, bt, False, 1, warps(block_n * bt, bt), sl,
                        resolve_block_r=resolve_block_r)
    if long_rows and bt >= 1024:
        return Strategy(long_rows.rows, bt, False, 1, num_warps or long_rows.warps, sl, resolve_block_r=resolve_block_r)
    bn = max(1, min((TILE // 2 if bt <= SHORT_T and time_contiguous and not whole_tile else TILE) // bt, _pow2(R)))
    if not time_contiguous:
        bn = max(bn, min(64, _pow2(R)))
    while bn > 1 and -(-R // bn) < fill // 2 and bn * bt > 256:  # keep enough programs in flight
        bn //= 2
    if block_t is not None or max_chunk is not None:  # a forced chunk: the warps as before the rule
        wide = False
    elif masked:
        wide = MASKED_WIDE[0] <= bt <= MASKED_WIDE[1]
    else:
        wide = reverse_scan and bt >= WIDE_FROM and (chunks > 1 or 0 < step_bytes <= FEW_BYTES)
    return Strategy(bn, bt, False, 1, warps(bn * bt, bt, wide), sl,
                    resolve_block_r=resolve_block_r)


_PROPS: dict[int, object] = {}


def _props(device: torch.device):
    """``torch.cuda.get_device_properties`` of a CUDA ``device``, kept per device index."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    props = _PROPS.get(idx)
    if props is None:
        props = _PROPS[idx] = torch.cuda.get_device_properties(idx)
    return props


def device_l2(device: torch.device) -> int:
    """L2 bytes of ``device`` (its properties' ``L2_cache_size``), :data:`CPU_L2` off the GPU."""
    return int(getattr(_props(device), "L2_cache_size", 0) or CPU_L2) if device.type == "cuda" else CPU_L2


def device_sms(device: torch.device) -> int:
    """SMs of ``device`` (``torch.cuda.get_device_properties``), :data:`CPU_SMS` off the GPU."""
    return _props(device).multi_processor_count if device.type == "cuda" else CPU_SMS


# ---- explicit choices for tests and experiments --------------------------------------------------

#: the kernel choices in force (a sorted tuple of (name, value)); part of every plan's key
FORCE: contextvars.ContextVar = contextvars.ContextVar("rollbuf_kernels_force", default=())
_FORCE_KEYS = ("block_t", "split", "shift_load", "max_chunk", "block_n", "presolve", "num_warps",
               "resolve_block_r", "flip", "quads", "poll", "poison", "layout")


def _window_words(poll) -> int:
    """A forced window's word count ``poll``: an ``int``, a power of two from 32, else a ``ValueError``."""
    if not (type(poll) is int and poll >= 32 and not poll & (poll - 1)):
        raise ValueError(f"poll: True, False or a window of words, a power of two from 32; got {poll!r}")
    return poll


@contextlib.contextmanager
def forced(**choices):
    """Inside the block, every kernel call takes these choices instead of the strategy table's (``block_t``, ``split``,
    ``shift_load``, ``max_chunk``, ``block_n``, ``presolve``, ``num_warps``, ``resolve_block_r``, ``flip``,
    ``quads``, ``poll``), and with ``poison=True`` fills its outputs with NaN before the launch (an element the
    kernel does not write then fails a comparison); ``layout="env"`` makes a time-major call env-major (its fields
    copied first). ``presolve=True``: split rows in three passes; ``presolve=2``: in two, the outputs' pass
    composing the aggregates of the chunks before its own (no resolve kernel, one launch fewer; timed slower than
    three: docs/kernel-choices.md). ``poll=True``: the look-back of one-row chunks reads the words of a window of
    chunks at once, one a thread (on the GPU by plain acquire loads); ``poll=N``: a window of ``N`` words (a
    power of two from 32; the window's timings: docs/kernel-choices.md, 'Long rows split'). For tests and
    A/B experiments; nested blocks merge."""
    bad = set(choices) - set(_FORCE_KEYS)
    if bad:
        raise TypeError(f"unknown kernel choice(s): {sorted(bad)}; known: {_FORCE_KEYS}")
    if not isinstance(choices.get("poll"), (bool, type(None))):
        _window_words(choices["poll"])  # checked here whatever the call, so that True never meets 1 in a key
    merged = dict(FORCE.get())
    merged.update({k: v for k, v in choices.items()})
    token = FORCE.set(tuple(sorted((k, v) for k, v in merged.items() if v is not None)))
    try:
        yield
    finally:
        FORCE.reset(token)


def forced_choices() -> dict:
    """The choices in force here (of the enclosing :func:`forced` blocks, merged)."""
    return dict(FORCE.get())


# CARRY_IN and PASS values (rollbuf.kernels.core holds the same as constexprs)
ZERO, STATE, END_COLUMN, END_STEP = 0, 1, 2, 3
WALK, LOOKBACK, AGGREGATES, OUTPUTS, ONE_CHUNK, RESOLVING = 0, 1, 2, 3, 4, 5


# ---- layout ------------------------------------------------------------------------------------


def time_major(x: torch.Tensor) -> bool:
    """A ``[N, T, ...]`` field laid out time-major (rows adjacent in memory): its outputs are too."""
    return x.shape[0] > 1 and x.shape[1] > 1 and x.stride(0) < x.stride(1)


def output_buffers(src: torch.Tensor, feat: tuple, dtype: torch.dtype, n: int, env: bool = False) -> list:
    """``n`` empty ``[N, T, *feat]`` outputs in the layout of the main input ``src``: dense, time-major
    for a time-major input (a ``[T, N]`` buffer seen as ``[N, T]``), else ``[N, T]`` contiguous
    (``env``: always). Shared with the custom op's fake implementation, so compiled graphs see the
    real strides."""
    N, T = src.shape[0], src.shape[1]
    if not env and time_major(src):
        return [torch.empty((T, N, *feat), dtype=dtype, device=src.device).transpose(0, 1) for _ in range(n)]
    return [torch.empty((N, T, *feat), dtype=dtype, device=src.device) for _ in range(n)]


def _distinct(x: torch.Tensor) -> bool:
    """Every step of the ``[N, T]`` field ``x`` at its own address (no stride 0, no overlap)."""
    N, T = x.shape[0], x.shape[1]
    s_n, s_t = abs(x.stride(0)), abs(x.stride(1))
    if N == 1 or T == 1:
        return (N == 1 or s_n > 0) and (T == 1 or s_t > 0)
    return s_n > 0 and s_t > 0 and (s_t * T <= s_n or s_n * N <= s_t)


def _same_layout(x: torch.Tensor, s_n: int, s_t: int, F: int) -> bool:
    """``x`` ([N, T] or [N, T, *feat], ``F`` features) is at ``(F·s_n, F·s_t)`` on every dim longer
    than 1, its features (if any) dense in row-major order: feature ``f`` of a step at ``+ f``.

    Read on ``x`` itself, the tensor the kernel is handed (not on a reshape of it, which is a
    contiguous copy where the feature dims cannot merge into one stride)."""
    N, T = x.shape[0], x.shape[1]
    dense = 1
    for size, stride in zip(reversed(x.shape[2:]), reversed(x.stride()[2:]), strict=True):
        if size != 1 and stride != dense:
            return False
        dense *= size
    return (N == 1 or x.stride(0) == F * s_n) and (T == 1 or x.stride(1) == F * s_t)


def _match(x: torch.Tensor, s_n: int, s_t: int, F: int = 1) -> torch.Tensor:
    """A copy of ``x`` ([N, T], or [N, T, F]) at ``(F·s_n, F·s_t, 1)``: the call's layout."""
    N, T = x.shape[0], x.shape[1]
    shape, strides = ((N, T, F), (F * s_n, F * s_t, 1)) if F > 1 else ((N, T), (s_n, s_t))
    out = torch.empty_strided(shape, strides, dtype=x.dtype, device=x.device)
    out.copy_(x.reshape(shape))
    return out


# ---- the launch ----------------------------------------------------------------------------------

_INTERPRET_LOCK = threading.Lock()  # the Triton interpreter keeps the grid index and its patches global


def _interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (it runs no inline PTX)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _parameter_names(jit) -> list:
    """The parameter names of a jitted kernel: its ``arg_names`` (Triton's JIT function and its
    interpreter), else the signature of the Python function it wraps (``jit.fn``)."""
    names = getattr(jit, "arg_names", None)
    return list(names) if names is not None else list(inspect.signature(jit.fn).parameters)


class Kernel:
    """One jitted kernel of a launch with its constexprs and warps, launched by keyword
    (``jit[(grid,)](**arguments, **const, num_warps=warps)``) the first time, and on a GPU from then on
    through the compiled kernel that launch returned (Triton's ``CompiledKernel``, the object its
    public ``warmup`` returns), called with the same arguments in the kernel's parameter order: the
    JIT's argument binding, specialisation and cache look-up are done once per plan instead of on
    every call. The compiled kernel is specialised on what the plan's key fixes (dtypes, shapes,
    strides, which fields are absent) and on the 16-byte alignment of the pointers; a call with a
    pointer (a field, an output, a carry, the scratch) not 16-byte aligned takes the keyword launch
    (Triton specialises it itself). Only for kernels whose integer arguments are fixed by the plan (``direct=True``: a
    :class:`Launch`'s; Triton specialises integers on their value too). ``binary``: the compiled kernel
    of the last keyword launch."""

    __slots__ = ("jit", "const", "warps", "binary", "names", "tail", "pointers", "runner")

    def __init__(self, jit, const: dict, warps: int, arguments=(), direct: bool = False):
        """``arguments``: the names of the runtime arguments every launch passes; with ``const``
        they must be exactly the kernel's parameters (a ValueError names the difference)."""
        given = set(arguments) | set(const)
        order = _parameter_names(jit)
        if given != set(order):
            raise ValueError(f"the launch of {getattr(jit, '__name__', jit)} passes {sorted(given - set(order))} "
                             f"that it does not take and misses {sorted(set(order) - given)}")
        self.jit, self.const, self.warps, self.binary = jit, const, warps, None
        self.runner: tuple | None = None  # (grid, the compiled kernel's launcher for that grid): one store
        # the direct launch passes the runtime arguments in order, then the constexprs: only where the
        # kernel declares its constexprs last (every rollbuf kernel does; a test keeps it so)
        k = len(order) - len(const)
        direct = direct and set(order[k:]) == set(const)
        self.names = tuple(order[:k]) if direct else None
        self.tail = tuple(const[n] for n in order[k:]) if direct else ()
        # the arguments holding pointers whose alignment the compiled kernel assumes: rollbuf's kernels
        # name a pointer p_* and pass the others in the tuples fields, outputs and carries
        self.pointers = tuple(n for n in order[:k] if n.startswith("p_") or n in _TUPLES) if direct else ()

    def __call__(self, grid: int, arguments: dict, device: int | None):
        if device is None:  # the interpreter
            with _INTERPRET_LOCK:
                self.jit[(grid,)](**arguments, **self.const, num_warps=self.warps)
            return
        names = self.names if DIRECT else None
        aligned = names is not None and _aligned(arguments, self.pointers)
        runner = self.runner
        if aligned and runner is not None and runner[0] == grid and names is not None:
            runner[1](*[arguments[n] for n in names], *self.tail)
            return
        self.binary = binary = self.jit[(grid,)](**arguments, **self.const, num_warps=self.warps)
        if aligned and hasattr(binary, "run") and hasattr(binary, "__getitem__"):
            self.runner = (grid, binary[(grid, 1, 1)])


#: launch a plan's compiled kernel directly after its first keyword launch (:class:`Kernel`); False:
#: every launch by keyword (A/B measurements, benchmarks/host_path.py)
DIRECT = True


_TUPLES = ("fields", "outputs", "carries")  # the kernels' arguments that are tuples of pointers


def _aligned(arguments: dict, pointers: tuple) -> bool:
    """Every pointer argument and every pointer in a tuple of them (fields, outputs, carries, scratch:
    PyTorch's allocator aligns them, another allocator may not) at a 16-byte aligned address."""
    for n in pointers:
        t = arguments[n]
        if type(t) is tuple:
            if not all(x is None or x.data_ptr() % 16 == 0 for x in t):
                return False
        elif t is not None and t.data_ptr() % 16:
            return False
    return True


def _nan_fill(outs):
    for o in outs:
        o.fill_(float("nan"))


class Launch:
    """The launch of one call signature (see the module docstring). ``launch(p)`` runs it on the
    Problem ``p``, whose tensors must have the signature the launch was built for."""

    def __init__(self, p: Problem, force: tuple = ()):
        self.force = force
        fc = dict(force)
        fam = FAMILIES[p.family]
        self.family, self.fam = p.family, fam
        self.poison = bool(fc.pop("poison", False))
        env_only = fc.pop("layout", None) == "env"
        f = p.fields
        main = p.main
        self.N, self.T = N, T = main.shape[0], main.shape[1]
        self.feat = feat = tuple(p.feature_shape)
        self.F = F = math.prod(feat)
        self.R = N * F
        self.device = main.device
        self.dev_index = None if main.device.type != "cuda" else (main.device.index or 0)
        self.outputs = tuple(p.outputs)
        self.out_names = tuple(o for o in p.outputs if o != "final")
        unknown = [o for o in self.out_names if o not in fam.outputs]
        if unknown:
            raise ValueError(f"the {p.family} kernel has no output {unknown[0]!r} (it writes {fam.outputs})")
        self.forward_final = p.family in (Family.FORWARD, Family.AFFINE)  # the carry out is returned as an output
        self.want_carry = self.forward_final or p.family == Family.TD_LAMBDA_ADJOINT or p.want_carry
        self.carry_shape = (N, *feat) if not fam.backward else ((N, 2) if fam.pair else (N,))
        self.compute_dtype, self.out_dtype = p.compute_dtype, p.out_dtype
        self.empty = N == 0 or T == 0 or F == 0
        if self.empty:
            return

        # -- layout: one pair of strides for the fields, one for the outputs --------------------
        # read on the main field itself (a reshape to [N, T, F] is a copy where its feature dims cannot
        # merge): the outputs are time-major where it is, as output_buffers (the custom op's fake) says
        tm = time_major(main) and not env_only
        if F > 1 or env_only or not _distinct(main):  # read dense: feature rows, forced env-major calls,
            # and a main field whose steps overlap (an expanded gradient): the others cannot match it
            s_n, s_t = (1, N) if tm else (T, 1)
        else:
            s_n, s_t = main.stride(0), main.stride(1)
        self.s_n, self.s_t = s_n, s_t
        self.s_on, self.s_ot = (1, N) if tm else (T, 1)
        self.out_tm = tm
        conv: list[tuple[int, str, str]] = []  # (slot, field name, how): made to match the call's layout
        for i, name in enumerate(fam.fields):
            t = None if name is None else f.get(name)
            if name is None or t is None:
                continue
            if name == "bootstrap_values" and t.dim() == 1:
                continue  # the window-end column: read as the carry in (or expanded below)
            if name == "x" and F > 1:
                if not _same_layout(t, s_n, s_t, F):  # x itself: the tensor the kernel reads
                    conv.append((i, name, "x"))
            elif not _same_layout(t, s_n, s_t, 1):
                conv.append((i, name, "field"))

        # -- the carry in ---------------------------------------------------------------------------
        bv = f.get("bootstrap_values") if fam.backward else None
        self.column = False  # the [N] bootstrap column goes in as the carry
        truncated = f.get("truncated") is not None
        if p.carry is not None:
            carry_in = STATE
        elif not fam.backward or p.window_end == "terminal" or p.no_bootstrap or bv is None:
            carry_in = ZERO
        elif bv.dim() == 1 and not truncated:
            carry_in, self.column = END_COLUMN, True
        else:
            carry_in = END_STEP
        if bv is not None and (p.no_bootstrap or (bv.dim() == 1 and not truncated and not self.column)):
            # nothing reads it: Monte Carlo returns, or a [N] column with no truncation under a carry
            # or a terminal window end
            conv.append((fam.fields.index("bootstrap_values"), "bootstrap_values", "drop"))
        elif bv is not None and bv.dim() == 1 and truncated:
            # a truncated window-end step reads it per step (whatever the carry in): expand it
            conv.append((fam.fields.index("bootstrap_values"), "bootstrap_values", "expand"))
        self.conv = tuple(conv)
        self.carry_in = carry_in
        # the field read in each slot of the kernel's fields tuple (the [N] column goes in as the carry)
        self.slot_names = tuple(None if (self.column and name == "bootstrap_values") or name is None
                                or f.get(name) is None else name for name in fam.fields)
        # a field laid out as the outputs are (dtype, shape, strides): they are allocated like it
        # (torch.empty_like costs about half of torch.empty with a shape, dtype and device)
        if tm:
            s = torch.empty((T, N, *feat), device="meta").transpose(0, 1).stride()
        else:
            s = torch.empty((N, T, *feat), device="meta").stride()
        converted = {i for i, _, _ in conv}
        self.like = next((i for i, name in enumerate(fam.fields)
                          if name is not None and i not in converted
                          for t in (f.get(name),)
                          if t is not None and t.dtype == self.out_dtype and tuple(t.shape) == (N, T, *feat)
                          and t.stride() == s), None)
        # the kernel's outputs tuple: one slot per output it can write (the forward families' two outputs
        # name one slot); each asked-for output's slot, the others None
        slots = tuple(dict.fromkeys(fam.out_params))
        self.out_slots = ((0,) if self.forward_final
                          else tuple(slots.index(fam.out_params[fam.outputs.index(o)]) for o in self.out_names))
        self.n_slots = len(slots)
        # the sizes and strides: the same for every call of this signature
        self.sizes = (self.R, T, F if p.family == Family.FORWARD else 1, s_n, s_t, self.s_on, self.s_ot, 0)

        # -- strategy, grid, constexprs -------------------------------------------------------------
        from triton.language import float32, float64

        acc = float64 if p.compute_dtype == torch.float64 else float32
        # a call with a mask, with more outputs than were timed, or with a forced chunk length keeps the
        # table (max_chunk reaches strategy() merged with the family's; it skips the rule for the others)
        whole = fam.whole_rows
        if whole is None or f.get("mask") is not None or len(self.out_names) > whole.most_outputs or "max_chunk" in fc:
            whole = None
        backward_scan = fam.backward or (p.family == Family.AFFINE and p.reverse)
        time_contiguous = T == 1 or s_t == 1
        flip = fc.pop("flip", None)  # lane order only matters to a backward scan
        quads = fc.pop("quads", None)
        if not backward_scan:
            flip = quads = False
        # TD(λ) without a mask scans its returns themselves (td_lambda/triton.py)
        scan_output = p.family == Family.TD_LAMBDA and f.get("mask") is None
        # the rule's chunk lengths only for the calls it was timed on: fp32, no mask, no truncations
        plain = (f.get("mask") is None and p.compute_dtype == torch.float32 and p.out_dtype == torch.float32
                 and all(t.dtype == torch.float32 for t in f.values() if t is not None and t.is_floating_point()))
        timed = plain and f.get("truncated") is None
        flip_chunks = fam.flip_chunks if timed else ()
        # the family's split rows only for the calls they were timed on (fp32, no mask) with no tiling forced
        own = ((fam.split_rows or fam.split_row) and plain and flip is None and quads is None
               and not fc.keys() & {"block_t", "split", "block_n", "presolve", "num_warps", "max_chunk", "poll"})
        fc["max_chunk"] = fc.get("max_chunk") or fam.max_chunk
        step_bytes = self.step_bytes(f)
        st = strategy(self.R, T, time_contiguous, sms=device_sms(self.device), long_rows=fam.long_rows,
                      whole_rows=whole, flip_chunks=flip_chunks, fill_per_sm=fam.fill_per_sm,
                      masked=f.get("mask") is not None and not fam.pair, step_bytes=step_bytes,
                      reverse_scan=backward_scan, flip=flip, quads=quads, **fc)
        if own:  # the family's own program for split rows (an entry for some outputs only for those calls)
            def this_call(e: SplitRows | None) -> SplitRows | None:
                return e if e is None or not e.outputs or set(e.outputs) & set(self.out_names) else None

            st = split_rule(st, self.R, T, time_contiguous, (this_call(fam.split_rows), this_call(fam.split_row)),
                            fc.get("shift_load"), step_bytes * T, device_l2(self.device))
        if quads is None and fam.quads:  # the family's chunks in quads where the rule says
            st = in_quads(st, T, time_contiguous, scan_output, fc.get("shift_load"),
                          p.family == Family.TD_LAMBDA and "advantages" in self.out_names)
        self.strategy = st
        tiles = -(-self.R // st.block_n)
        self.grid = tiles * st.num_seg if st.split else tiles
        self.scalars = fam.scalars
        jit = fam.kernel()
        # the names every launch passes at run time (with CFG: the kernel's parameters)
        names = ("fields", "outputs", "carries", "sizes", *self.scalars)
        from rollbuf.kernels.core import Config

        reverse = p.family == Family.AFFINE and p.reverse

        def const(pass_):
            return dict(CFG=Config(PASS=pass_, CARRY_IN=carry_in, ACC=acc, BLOCK_N=st.block_n, BLOCK_T=st.block_t,
                                   SHIFT_LOAD=st.shift_load, FLIP=st.flip, REVERSE=reverse,
                                   QUADS=st.quads, POLL=st.poll if pass_ == LOOKBACK else 0,
                                   ASM=self.device.type == "cuda" and st.poll > 0 and not _interpreted()))

        self.pair_maps = pair_maps = fam.pair and f.get("mask") is not None  # V-trace: pair maps with a mask only
        W = 7 if pair_maps else 3
        self.slot_values = W * st.block_n * self.grid if st.split else 0
        self.slot_values += self.slot_values % 2  # the look-back's int64 words 8-byte aligned
        if not st.split:  # whole rows: one chunk each (no loop) or walked chunk by chunk
            self.passes: tuple[Kernel, ...] = (Kernel(jit, const(ONE_CHUNK if st.block_t >= T else WALK),
                                                      st.num_warps, names, True),)
            self.scratch_words = 0
        elif not st.presolve:
            self.passes = (Kernel(jit, const(LOOKBACK), st.num_warps, names, True),)
            self.scratch_words = 2 * self.grid  # one int64 word per chunk (flag and state)
        elif st.presolve == 2:  # two passes: each output chunk composes the aggregates before it (forced only)
            self.passes = (Kernel(jit, const(AGGREGATES), st.num_warps, names, True),
                           Kernel(jit, const(RESOLVING), st.num_warps, names, True))
            self.scratch_words = 0
        else:
            from rollbuf.kernels.resolve import resolve_kernel

            bn = st.block_n
            br = st.resolve_block_r or max(1, min(_pow2(st.num_seg - 1), (2048 if pair_maps else 4096) // bn))
            self.passes = (Kernel(jit, const(AGGREGATES), st.num_warps, names, True),
                           Kernel(resolve_kernel, dict(BLOCK_N=bn, BLOCK_R=br, PAIR=pair_maps),
                                  max(1, min(8, br * bn // 256)), ("p_ws", "NUM_SEG"), True),
                           Kernel(jit, const(OUTPUTS), st.num_warps, names, True))
            self.scratch_words = 0
        itemsize = 8 if acc is float64 else 4
        self.scratch_len = self.slot_values + -(-self.scratch_words * 4 // itemsize)

    def step_bytes(self, f) -> int:
        """The bytes one step of a row reads and writes: the per-step fields the kernel reads (``f``: the
        problem's fields; bootstrap values aside: read where a step is truncated) and the outputs."""
        read = sum(t.element_size() for name in self.slot_names if name is not None and name != "bootstrap_values"
                   for t in (f[name],) if t is not None and t.dim() >= 2)
        return read + len(self.out_names) * self.out_dtype.itemsize

    # -- per call --------------------------------------------------------------------------------

    def fields(self, p: Problem) -> tuple:
        """The kernel's ``fields`` tuple for ``p``: its tensors, those in another layout made to match."""
        f = p.fields
        ts = [None if name is None else f.get(name) for name in self.slot_names]
        for i, _name, how in self.conv:
            t = ts[i]
            assert t is not None  # a converted slot holds a field of the call (Launch.__init__)
            if how == "drop":
                ts[i] = None
            elif how == "expand":
                ts[i] = _match(t[:, None].expand(self.N, self.T), self.s_n, self.s_t)
            elif how == "x":
                ts[i] = _match(t, self.s_n, self.s_t, self.F)
            else:
                ts[i] = _match(t, self.s_n, self.s_t)
        return tuple(ts)

    def __call__(self, p: Problem):
        """Run on ``p``: ``(outputs, carry out)`` (see :func:`run`)."""
        if self.empty:
            return self._empty(p)
        arguments, outs, co, ws = self.prepare(*self.inputs(p))
        self.launch(arguments, ws)
        if self.forward_final:
            return (*outs, co), None
        return tuple(outs), co

    def plannable(self, p: Problem) -> bool:
        """Whether :meth:`run` serves the calls of this launch's signature with their tensors as they
        are (nothing to empty, convert or make contiguous first)."""
        if self.empty or self.conv:
            return False
        if self.carry_in == STATE:
            return p.carry is not None and p.carry.is_contiguous()
        bv = p.fields.get("bootstrap_values")
        return not self.column or (bv is not None and bv.is_contiguous())

    def run(self, get, carry, params):
        """Run on the tensors ``get(name)`` (and ``carry``) of a call with this launch's signature, whose
        fields need no conversion (:meth:`plannable`); ``params``: the call's parameters by name (the
        family's ``Row.scalars`` are read from it, 1.0 where absent). Returns what ``launch(p)`` returns."""
        fields = tuple([None if n is None else get(n) for n in self.slot_names])
        ci = carry if self.carry_in == STATE else get("bootstrap_values") if self.column else None
        arguments, outs, co, ws = self.prepare(fields, ci, ())
        for n in self.scalars:  # straight from the call's parameters into the launch's keywords
            arguments[n] = float(params.get(n, 1.0))
        self.launch(arguments, ws)
        if self.forward_final:
            return (*outs, co), None
        return tuple(outs), co

    def inputs(self, p: Problem) -> tuple:
        """``(fields, carry in, scalars)`` of ``p`` as the kernel reads them (scalars by parameter name)."""
        ci = p.carry if self.carry_in == STATE else p.fields.get("bootstrap_values") if self.column else None
        if ci is not None and not ci.is_contiguous():
            ci = ci.contiguous()
        return self.fields(p), ci, {s: float(getattr(p, s)) for s in self.scalars}

    def prepare(self, fields: tuple, carry_in, scalars):
        """``(arguments, outputs, carry out, scratch)`` of one call: the buffers allocated (the
        scratch's flag words zeroed on the stream), the kernel's runtime arguments by name
        (``scalars``: a mapping of the family's scalars, or ``()`` where the caller adds them)."""
        dev = self.device
        like = None if self.like is None else fields[self.like]
        if like is not None and type(like) is torch.Tensor:  # a subclass would pass on its type
            outs = [torch.empty_like(like) for _ in self.out_names]
        elif self.out_tm:
            shape = (self.T, self.N, *self.feat)
            outs = [torch.empty(shape, dtype=self.out_dtype, device=dev).transpose(0, 1) for _ in self.out_names]
        else:
            shape = (self.N, self.T, *self.feat)
            outs = [torch.empty(shape, dtype=self.out_dtype, device=dev) for _ in self.out_names]
        if self.poison:
            _nan_fill(outs)
        co = torch.empty(self.carry_shape, dtype=self.compute_dtype, device=dev) if self.want_carry else None
        ws = None
        if self.scratch_len:
            ws = torch.empty(self.scratch_len, dtype=self.compute_dtype, device=dev)
            if self.scratch_words:
                ws[self.slot_values:].zero_()
        slots: list[torch.Tensor | None] = [None] * self.n_slots
        for i, o in zip(self.out_slots, outs, strict=True):
            slots[i] = o
        arguments = dict(scalars, fields=fields, outputs=tuple(slots), carries=(carry_in, co, ws), sizes=self.sizes)
        return arguments, outs, co, ws

    def launch(self, arguments: dict, ws, grid: int | None = None):
        """Run the launch's kernels on ``arguments`` (``grid``: a number of programs other than the whole)."""
        grid = self.grid if grid is None else grid
        if self.dev_index is not None and self.dev_index != torch.cuda.current_device():
            with torch.cuda.device(self.dev_index):
                return self.launch(arguments, ws, grid)
        dev = self.dev_index
        if len(self.passes) < 3:
            for k in self.passes:
                k(grid, arguments, dev)
        else:  # the three passes: chunk aggregates, their scan over the scratch, the outputs
            self.passes[0](grid, arguments, dev)
            self.passes[1](self.grid // self.strategy.num_seg, dict(p_ws=ws, NUM_SEG=self.strategy.num_seg), dev)
            self.passes[2](grid, arguments, dev)

    def _empty(self, p: Problem):
        """No element to scan: empty outputs, and the carry passes through (the window-end value
        of a backward estimator when it has one)."""
        N, T, feat, dev = self.N, self.T, self.feat, self.device
        outs = [torch.empty((N, T, *feat), dtype=self.out_dtype, device=dev) for _ in self.out_names]
        if p.carry is not None:
            init = p.carry.to(self.compute_dtype)
        else:
            init = torch.zeros(self.carry_shape, dtype=self.compute_dtype, device=dev)
            bv = p.fields.get("bootstrap_values")
            if (self.fam.backward and bv is not None and bv.dim() == 1 and p.window_end != "terminal"
                    and not p.no_bootstrap):
                if self.fam.pair:
                    init[:, 1] = bv
                else:
                    init.copy_(bv)
        if self.forward_final:
            return tuple(outs) + (init,), None
        return tuple(outs), (init if self.want_carry else None)


# ---- the cache ------------------------------------------------------------------------------------

_NAMES = {family: tuple(n for n in fam.fields if n is not None) for family, fam in FAMILIES.items()}


def signature(p: Problem, force: tuple = ()) -> tuple:
    """What a :class:`Launch` depends on: family, outputs, every field's dtype, shape and strides, the
    carry's, the device, the dtypes and the flags of the call; not the scalar parameters (they are
    arguments of every launch), nor the tensors' alignment (the launch goes through Triton's JIT,
    which specialises on it by itself)."""
    f = p.fields
    key = [p.family, p.outputs, p.main.device, p.compute_dtype, p.out_dtype, p.window_end, p.no_bootstrap,
           p.want_carry, p.reverse, p.feature_shape, force]
    for t in (p.carry, *map(f.get, _NAMES[p.family])):
        if t is None:
            key.append(None)
        else:
            key += (t.dtype, t.shape, t.stride())
    return tuple(key)


def launch_for(p: Problem) -> Launch:
    """The :class:`Launch` of ``p``'s signature, kept in the one plan cache (:data:`rollbuf.cache.PLANS`,
    under ``("launch", signature)``): built, and so validated, once."""
    key = ("launch", signature(p, FORCE.get()))
    hit = cache.PLANS.get(key)
    if hit is None:
        hit = cache.remember(key, Launch(p, FORCE.get()))
    return hit


def run(p: Problem):
    """Run ``p`` on its family's kernel. Returns ``(outputs, carry)``: the outputs in ``p.outputs``
    order (the forward estimators' and the affine scan's ``final`` among them, carry ``None``), the
    carry out ``[N]`` (``[N, 2]`` for V-trace) when ``p.want_carry``, else ``None``."""
    return launch_for(p)(p)
