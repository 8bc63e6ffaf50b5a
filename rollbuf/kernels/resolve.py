"""The middle pass of a three-pass split (``PASS = AGGREGATES``, this, ``PASS = OUTPUTS``)."""

import triton
import triton.language as tl

from rollbuf.kernels import core


@triton.jit
def resolve_kernel(p_ws, NUM_SEG, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, PAIR: tl.constexpr):
    """In each row tile, every chunk's inclusive state, from the first chunk's (stored by the first
    pass with the row's carry in) and the later chunks' aggregate maps: a scan over the chunks in
    scan order, ``BLOCK_R`` of them at a time, the state carried between blocks. Slot
    ``tile · NUM_SEG + rank`` holds ``W · BLOCK_N`` values (``W = 3``, or 7 for a pair):
    the map's components, then the inclusive state."""
    W: tl.constexpr = 3 + 4 * PAIR  # slot width: map components + state
    tile = tl.program_id(0).to(tl.int64)
    o_b = tl.arange(0, BLOCK_N)[None, :]
    base = p_ws + tile * NUM_SEG * (W * BLOCK_N)
    if PAIR:
        cu = tl.load(base + 5 * BLOCK_N + o_b)  # [1, BLOCK_N]
        cv = tl.load(base + 6 * BLOCK_N + o_b)
    else:
        cu = tl.load(base + 2 * BLOCK_N + o_b)
        cv = cu
    ranks = tl.arange(0, BLOCK_R)[:, None]
    last = ranks == BLOCK_R - 1
    for r0 in range(1, NUM_SEG, BLOCK_R):
        rr = r0 + ranks
        ok = (rr < NUM_SEG) & (o_b >= 0)
        p = base + rr * (W * BLOCK_N) + o_b
        if PAIR:  # identity past the last chunk: (1, 0, 1, 0, 0)
            m = tl.associative_scan((tl.load(p, mask=ok, other=1.0), tl.load(p + BLOCK_N, mask=ok, other=0.0),
                                     tl.load(p + 2 * BLOCK_N, mask=ok, other=1.0),
                                     tl.load(p + 3 * BLOCK_N, mask=ok, other=0.0),
                                     tl.load(p + 4 * BLOCK_N, mask=ok, other=0.0)), 0, core.combine_pair_lanes)
            su, sv = core.apply(core.PairMap(*m), cu, cv, True)
            tl.store(p + 5 * BLOCK_N, su, mask=ok)
            tl.store(p + 6 * BLOCK_N, sv, mask=ok)
        else:  # identity: (0, 1)
            m = tl.associative_scan((tl.load(p, mask=ok, other=0.0), tl.load(p + BLOCK_N, mask=ok, other=1.0)), 0,
                                    core.combine_lanes)
            su, sv = core.apply(core.Map(*m), cu, cv, False)
            tl.store(p + 2 * BLOCK_N, su, mask=ok)
        # padded chunks are the identity: the state at the block's last lane is the carry
        cu = tl.sum(tl.where(last, su, 0.0), axis=0)[None, :]
        cv = tl.sum(tl.where(last, sv, 0.0), axis=0)[None, :]
