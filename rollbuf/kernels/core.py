"""What every family's kernel shares: loads, one chunk's scan, the carry past the window, the
decoupled look-back, and the driver that walks a row or takes one chunk of it.

A family kernel (``td_lambda/triton.py``, ``vtrace/triton.py``, ...) is a small entry that gathers
its pointers and scalars into a :data:`Fam` (``fam.fields``, ``fam.outputs``, ``fam.scalars``, each a
named tuple of the family's own) and hands it to :func:`drive` with its :data:`Scan` (three device
functions of its own and the shape of its state) and the launch's :data:`Config`:

* ``LOAD(fam, geo, o, ok, end, ACC)``: every per-step value the family reads at the steps ``o``
  (``ok``: inside the row), as a named tuple ``x`` of the family's: each field loaded once, 0 at
  padded lanes and masked steps (``end``: the :data:`State` past the window, for a next-step value
  read past the last step);
* ``STEP(fam, x, ACC)``: the scan elements (a :data:`Map` or :data:`PairMap`) of those steps, built by
  the family's function in :mod:`rollbuf.boundary.coefficients`; the identity at padded lanes and
  masked steps;
* ``EMIT(fam, geo, o, ok, x, z, ACC)``: writes the outputs of the steps ``o`` from their values ``x``
  and the *exclusive* state ``z.u, z.v`` (the state one step further along the scan: ``Z_{t+1}``
  backward, ``F_{t−1}`` forward; the inclusive one for a family whose ``Scan.INCLUSIVE`` says so),
  0 at masked steps; ``z.c`` is the state carried into the chunk (``[BLOCK_N, 1]``). Returns the
  *inclusive* state at ``o`` (what the step hands on), which the driver stores as the row's carry out
  where asked.

``LOAD`` runs again at the output's steps for ``EMIT`` (second reads hit the cache; in the one-chunk
pass the compiler merges them with the scan's: docs/kernel-choices.md, 'The shared scan (core.py)').

``fam.fields``: the family's ``[N, T]`` tensors by name; the driver and :func:`boundary` read
``p_k``, ``p_tr``, ``p_bv`` and ``p_m`` (terminated, truncated, bootstrap_values, mask: every family
that reads the window end or the flags names them); ``None`` = absent (a compile-time constant:
absent fields cost nothing). :data:`Geo`: the program's rows and the rows' environment and feature
index (``[BLOCK_N, 1]``), the feature count (1 except for the forward estimators' ``x``), the one pair
of strides every ``[N, T]`` field of the call is read with, and the outputs' pair (a feature field or
output at ``F·(n·s + t·s) + f``).

Scan elements: :data:`Map` ``(a, b)`` for the scalar families (the map ``y → a + b·y``),
:data:`PairMap` ``(p, q, s, a, w)`` for V-trace's pair state (``(u, V) → (a + p·u + q·V, w + s·V)``).

Triton (3.6, 3.7) compiles a named tuple as a tuple whose fields it reads by name, in the interpreter
and compiled alike: a bundle costs no instruction, and a loop-carried one keeps its type. Three rules
of the compiler's: a bundle holding constexprs (:data:`Scan`, :data:`Config`: the device functions
too) is built in the call that passes it, as a local variable's constexprs become tensors (a local
holding a function does not compile); a parameter bound to one keeps them constexprs; and no field is
named ``values`` or ``type``, which Triton's tuple holds as attributes of its own (``fields.values``
would compile to the list of its values; the interpreter would read the field).
"""

from collections import namedtuple

import triton
import triton.language as tl

from rollbuf.boundary import coefficients as C


def jit_boundary(fn, **names):
    """Compile a boundary function as a Triton device function (same source, same code object).

    The boundary module does not import Triton (the torch backend must work without it), so the
    function is rebound to globals that also hold ``tl``, as the Triton interpreter requires, and
    ``names``: the Triton primitives it is written over (V-trace's ``clip``).
    """
    return triton.jit(C.rebind(fn, tl=tl, triton=triton, **names))


compose = jit_boundary(C.compose)
compose_pair = jit_boundary(C.compose_pair)

# ---- the bundles (named tuples, built inside the kernels) ---------------------------------------
# a family's pointers and scalars: named tuples of its own (V-trace adds READBACK to its Fam)
Fam = namedtuple("Fam", "fields outputs scalars")
# the family's scan: its device functions (LOAD, STEP, EMIT: above); PAIR: pair maps (five components)
# or scalar ones; CARRY2: a pair (u, V) carried in and out per row ([N, 2]) or one value; INCLUSIVE:
# EMIT reads the inclusive state (the family scans its output itself); REVERSE: backward in time
Scan = namedtuple("Scan", "LOAD STEP EMIT PAIR CARRY2 INCLUSIVE REVERSE")
# the launch's configuration: the entry kernel's one constexpr parameter ``CFG`` (host.Launch builds
# it; REVERSE: the affine scan's direction, which the other families fix themselves; QUADS: a backward
# scan's chunks held in quads of 4 steps, latest quad first, scanned without Triton's reverse scan)
# POLL: the look-back of one-row programs reads the words of POLL chunks before its own at once (0: one
# at a time); ASM: the window's words by plain acquire loads (inline PTX, CUDA only) instead of atomic reads
Config = namedtuple("Config", "PASS CARRY_IN ACC BLOCK_N BLOCK_T SHIFT_LOAD FLIP REVERSE QUADS POLL ASM",
                    defaults=(False, False, 0, False))
# the entry kernel's ``sizes``: R rows (N·F) of T steps, F features (1 but for the forward estimators'
# x), the fields' pair of strides (s_n, s_t) and the outputs' (s_on, s_ot), the index of the launch's
# first program (p0: 0 but in tests that run one program of a launch by itself, under the interpreter
# only: a launch's compiled kernel is kept per plan, not per p0)
Sizes = namedtuple("Sizes", "R T F s_n s_t s_on s_ot p0")
# the entry kernel's ``carries``: the carry in and out per row, the split rows' scratch; None = absent
Carries = namedtuple("Carries", "p_ci p_co p_ws")
# a program's rows: indices and which are < R ([BLOCK_N]), env and feature index ([BLOCK_N, 1]),
# feature count, strides, steps per row
Geo = namedtuple("Geo", "rows row_ok n f F s_n s_t s_on s_ot T")
Map = namedtuple("Map", "a b")  # y → a + b·y
PairMap = namedtuple("PairMap", "p q s a w")  # (u, V) → (a + p·u + q·V, w + s·V)
State = namedtuple("State", "u v")  # the scan's state: u (V for a pair), v (u itself for scalar maps)
Z = namedtuple("Z", "u v c")  # the state EMIT reads ([BLOCK_N, BLOCK_T]), the carry into the chunk ([BLOCK_N, 1])

# CARRY_IN: the state past the window's end (backward) or before its start (forward)
ZERO = tl.constexpr(0)  # 0 (terminal window end; forward scans without `initial`)
STATE = tl.constexpr(1)  # an explicit state per row in p_ci: a chained `carry` or `initial`
END_COLUMN = tl.constexpr(2)  # V(s_T) from the [N] column in p_ci, 0 where the window-end step terminated
END_STEP = tl.constexpr(3)  # V(s_T) read from per-step bootstrap_values at the window-end step
# PASS: what one program does
WALK = tl.constexpr(0)  # whole rows, chunk after chunk, the carry in registers
LOOKBACK = tl.constexpr(1)  # one chunk of a row; the carry from the chunks before it (decoupled look-back)
AGGREGATES = tl.constexpr(2)  # three passes, 1st: one chunk's aggregate map into the scratch
OUTPUTS = tl.constexpr(3)  # three passes, 3rd: one chunk's outputs from its resolved carry
RESOLVING = tl.constexpr(5)  # two passes, 2nd: one chunk's carry from the 1st pass's aggregates, then its outputs
ONE_CHUNK = tl.constexpr(4)  # whole rows of at most BLOCK_T steps: one chunk, no loop


@triton.jit
def load(ptr, off, ok, live, HAS_M: tl.constexpr, ACC: tl.constexpr):
    """A field at ``off`` as ``ACC``, 0 where not ``live``. With a mask the load itself is under
    ``ok`` alone (a mask that depends on loaded data keeps the compiler from vectorising the load)
    and masked steps are dropped by a select, so garbage there (NaN, Inf) never reaches the
    arithmetic. Faster than loads under the mask (docs/kernel-choices.md, 'The shared scan
    (core.py)')."""
    if HAS_M:
        return tl.where(live, tl.load(ptr + off, mask=ok, other=0).to(ACC), 0.0)
    else:
        return tl.load(ptr + off, mask=ok, other=0).to(ACC)


@triton.jit
def out_value(x, ptr):
    """``x`` as the element type of ``ptr``, for a store. Into bf16 or fp16 through fp32: a float64
    value (``ACC`` float64 with 16-bit outputs) is rounded as PyTorch's own cast rounds it (float64
    to float, then to the 16-bit type), and Triton's interpreter casts float64 to bf16 wrongly
    (it converts the value to the integer that bf16's bits are held in). An fp32 ``x`` goes
    straight to the 16-bit type, the first cast being none."""
    if ptr.dtype.element_ty == tl.bfloat16 or ptr.dtype.element_ty == tl.float16:
        return x.to(tl.float32).to(ptr.dtype.element_ty)
    else:
        return x.to(ptr.dtype.element_ty)


@triton.jit
def masked(x, live, p_m):
    """An output ``x``, 0 at masked steps; without a mask (``p_m`` ``None``) ``x`` itself: lanes outside
    the row are not stored, so there is nothing to select."""
    if p_m is None:
        return x
    else:
        return tl.where(live, x, 0.0)


@triton.jit
def load_flag(ptr, off, ok, live, ACC: tl.constexpr):
    """A 0/1 flag (bool, uint8 or float storage) at ``off``; 0 where not ``live`` (``None``: where not
    ``ok``, which the load itself gives); ``ptr`` ``None``: 0. A select of 1 or 0, not a conversion of
    the predicate (which compiles to a select and an integer-to-float conversion)."""
    if ptr is None:
        return tl.zeros(off.shape, ACC)
    else:
        f = tl.load(ptr + off, mask=ok, other=0) != 0
        if live is not None:
            f = f & live
        return tl.where(f, 1.0, 0.0).to(ACC)


@triton.jit
def offsets(geo, o):
    """Offsets of the steps ``o`` in every ``[N, T]`` field of the call."""
    return geo.n * geo.s_n + o * geo.s_t


@triton.jit
def out_offsets(geo, o):
    """Offsets of the steps ``o`` in every ``[N, T]`` output of the call."""
    return geo.n * geo.s_on + o * geo.s_ot


@triton.jit
def next_value(p_v, geo, o, ok, end_v, ACC: tl.constexpr):
    """``V`` at the step after each of ``o`` in time, read from ``p_v``; past the window's last step,
    ``end_v`` (the state past the window, ``[BLOCK_N, 1]``). Only without a mask is the next step
    the next one in memory."""
    v = tl.load(p_v + offsets(geo, o + 1), mask=ok & (o + 1 < geo.T), other=0).to(ACC)
    return tl.where(o + 1 >= geo.T, end_v, v)


@triton.jit
def boundary(fields, off, ok, ACC: tl.constexpr):
    """``(k, tr, boot, live)`` at ``off``: terminated and truncated as 0/1, the bootstrap value where
    a live, truncated, non-terminated step reads it (0 elsewhere: never loaded; 0 everywhere without a
    truncated or a bootstrap-values field, where a family passes ``None`` to the boundary functions
    instead: ``γ(1−k)·0·0`` is not folded by the compiler, as ``x·0`` is not 0 for NaN or Inf; a
    jit function cannot return ``None``, so the families substitute it where they unpack), and ``live`` =
    inside the row and not masked."""
    p_k, p_tr, p_bv, p_m = fields.p_k, fields.p_tr, fields.p_bv, fields.p_m
    live = ok if p_m is None else ok & (tl.load(p_m + off, mask=ok, other=0) != 0)
    k = load_flag(p_k, off, ok, None if p_m is None else live, ACC)
    tr = load_flag(p_tr, off, ok, None if p_m is None else live, ACC)
    if p_bv is None:
        boot = tl.zeros(off.shape, ACC)
    else:
        read = live & (tr != 0) & (k == 0)
        boot = tl.load(p_bv + off, mask=read, other=0).to(ACC)
    return k, tr, boot, live


# ---- maps ------------------------------------------------------------------------------------


@triton.jit
def combine_lanes(a1, b1, a2, b2):
    # the element met later in scan order is the outer map (both directions)
    return compose(a2, b2, a1, b1)


@triton.jit
def combine_pair_lanes(p1, q1, s1, a1, w1, p2, q2, s2, a2, w2):
    return compose_pair(p2, q2, s2, a2, w2, p1, q1, s1, a1, w1)


@triton.jit
def identity_where(e, live, PAIR: tl.constexpr):
    """The map ``e`` (a tuple of its components, in :data:`Map` or :data:`PairMap` order) where
    ``live``, the identity elsewhere, as a :data:`Map` or :data:`PairMap` (broadcast to ``live``'s
    shape by the select itself: an explicit ``+ 0`` per component costs an add per element that the
    compiler keeps, ``−0 + 0`` being ``+0``)."""
    if PAIR:
        p, q, s, a, w = e
        return PairMap(tl.where(live, p, 1.0), tl.where(live, q, 0.0), tl.where(live, s, 1.0),
                       tl.where(live, a, 0.0), tl.where(live, w, 0.0))
    else:
        a, b = e
        return Map(tl.where(live, a, 0.0), tl.where(live, b, 1.0))


@triton.jit
def apply(e, cu, cv, PAIR: tl.constexpr):
    """The state after the map ``e`` applied to ``(cu, cv)`` (``cv`` unused by scalar maps)."""
    if PAIR:
        return e.a + e.p * cu + e.q * cv, e.w + e.s * cv
    else:
        return e.a + e.b * cu, cv + tl.zeros_like(e.a)


@triton.jit
def _compose(o, i, PAIR: tl.constexpr):
    """``o ∘ i`` (apply ``i`` first)."""
    if PAIR:
        return PairMap(*compose_pair(o.p, o.q, o.s, o.a, o.w, i.p, i.q, i.s, i.a, i.w))
    else:
        return Map(*compose(o.a, o.b, i.a, i.b))


@triton.jit
def _identity(BLOCK_N: tl.constexpr, PAIR: tl.constexpr, ACC: tl.constexpr):
    one = tl.full([BLOCK_N], 1.0, ACC)
    zero = tl.zeros([BLOCK_N], ACC)
    if PAIR:
        return PairMap(one, zero, one, zero, zero)
    else:
        return Map(zero, one)


@triton.jit
def _edge(x, lanes, EDGE: tl.constexpr):
    return tl.sum(tl.where(lanes == EDGE, x, 0.0), axis=1)


@triton.jit
def _edge_map(e, lanes, EDGE: tl.constexpr, PAIR: tl.constexpr):
    if PAIR:
        return PairMap(_edge(e.p, lanes, EDGE), _edge(e.q, lanes, EDGE), _edge(e.s, lanes, EDGE),
                       _edge(e.a, lanes, EDGE), _edge(e.w, lanes, EDGE))
    else:
        return Map(_edge(e.a, lanes, EDGE), _edge(e.b, lanes, EDGE))


@triton.jit
def _shift(x, c, lanes, REVERSE: tl.constexpr, BLOCK_T: tl.constexpr):
    """The state one step further along the scan: lane t takes lane t+1 (``REVERSE``: the scan runs
    against lane order) or t−1 (in lane order) of ``x``; the lane at the chunk's far edge takes the
    carry ``c`` ([BLOCK_N, 1])."""
    if REVERSE:
        idx = tl.minimum(lanes + 1, BLOCK_T - 1)
        far = lanes == BLOCK_T - 1
    else:
        idx = tl.maximum(lanes - 1, 0)
        far = lanes == 0
    idx = idx + tl.zeros_like(x).to(tl.int32)
    return tl.where(far, c, tl.gather(x, idx, 1))


# ---- the scratch of split rows -----------------------------------------------------------------
# Slot ``tile·NUM_SEG + rank`` holds W·BLOCK_N values: the chunk's aggregate map (2 components, or
# 5 for a pair), then its inclusive state (1 or 2). After the slots, from an even number of values
# on: one int64 word per slot, its flag in the high half (0 = nothing yet, 1 = aggregate published,
# 2 = inclusive state published) and, for a float32 state of one row, the state in the low half
# (:func:`_look_back`). The caller allocates it per call and zeroes the words on the stream.


@triton.jit
def _store_map(base, g, o_b, BLOCK_N: tl.constexpr, PAIR: tl.constexpr):
    if PAIR:
        tl.store(base + o_b, g.p)
        tl.store(base + BLOCK_N + o_b, g.q)
        tl.store(base + 2 * BLOCK_N + o_b, g.s)
        tl.store(base + 3 * BLOCK_N + o_b, g.a)
        tl.store(base + 4 * BLOCK_N + o_b, g.w)
    else:
        tl.store(base + o_b, g.a)
        tl.store(base + BLOCK_N + o_b, g.b)


@triton.jit
def _load_map(base, o_b, BLOCK_N: tl.constexpr, PAIR: tl.constexpr):
    if PAIR:
        return PairMap(tl.load(base + o_b, volatile=True), tl.load(base + BLOCK_N + o_b, volatile=True),
                       tl.load(base + 2 * BLOCK_N + o_b, volatile=True),
                       tl.load(base + 3 * BLOCK_N + o_b, volatile=True),
                       tl.load(base + 4 * BLOCK_N + o_b, volatile=True))
    else:
        return Map(tl.load(base + o_b, volatile=True), tl.load(base + BLOCK_N + o_b, volatile=True))


@triton.jit
def _store_state(base, u, v, o_b, BLOCK_N: tl.constexpr, PAIR: tl.constexpr):
    if PAIR:
        tl.store(base + 5 * BLOCK_N + o_b, u)
        tl.store(base + 6 * BLOCK_N + o_b, v)
    else:
        tl.store(base + 2 * BLOCK_N + o_b, u)


@triton.jit
def _load_state(base, o_b, BLOCK_N: tl.constexpr, PAIR: tl.constexpr):
    if PAIR:
        return tl.load(base + 5 * BLOCK_N + o_b, volatile=True), tl.load(base + 6 * BLOCK_N + o_b, volatile=True)
    else:
        u = tl.load(base + 2 * BLOCK_N + o_b, volatile=True)
        return u, u


@triton.jit
def _last(c, last):
    """``c`` where ``last``, axis 0 reduced (``[BLOCK_R, BLOCK_N]`` to ``[BLOCK_N]``; a window's ``[POLL]``
    to a scalar): the composition of a block's maps, its last element's scan result."""
    return tl.sum(tl.where(last, c, 0.0), axis=0)


@triton.jit
def _composed(p, stride, ok, last, PAIR: tl.constexpr, VOLATILE: tl.constexpr):
    """The aggregate maps stored at ``p`` (component ``j`` at ``p + j·stride``; the identity where not
    ``ok``) composed along axis 0, later elements outer: the composition at the element where ``last``
    (the axis' last), with axis 0 reduced. ``VOLATILE``: loads another program may still be publishing."""
    if PAIR:  # identity: (1, 0, 1, 0, 0)
        m = tl.associative_scan((tl.load(p, mask=ok, other=1.0, volatile=VOLATILE),
                                 tl.load(p + stride, mask=ok, other=0.0, volatile=VOLATILE),
                                 tl.load(p + 2 * stride, mask=ok, other=1.0, volatile=VOLATILE),
                                 tl.load(p + 3 * stride, mask=ok, other=0.0, volatile=VOLATILE),
                                 tl.load(p + 4 * stride, mask=ok, other=0.0, volatile=VOLATILE)), 0,
                                combine_pair_lanes)
        return PairMap(_last(m[0], last), _last(m[1], last), _last(m[2], last), _last(m[3], last), _last(m[4], last))
    else:  # identity: (0, 1)
        m = tl.associative_scan((tl.load(p, mask=ok, other=0.0, volatile=VOLATILE),
                                 tl.load(p + stride, mask=ok, other=1.0, volatile=VOLATILE)), 0, combine_lanes)
        return Map(_last(m[0], last), _last(m[1], last))


@triton.jit
def _resolved(p_ws, tile, rank, NUM_SEG, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, PAIR: tl.constexpr):
    """The inclusive state of chunk ``rank − 1`` of row tile ``tile`` from the first pass's scratch (the first
    chunk's state, the later chunks' aggregate maps): the maps of chunks ``1 … rank − 1`` composed in scan
    order, ``BLOCK_R`` at a time, applied to the first chunk's state; the middle pass's work for one chunk,
    read from L2 (``RESOLVING``, the forced choice ``presolve=2``; timed slower than the three passes:
    docs/kernel-choices.md, 'Long rows split').
    ``BLOCK_R``: 256 chunks (over ``BLOCK_N`` rows) with the longest chunks, ``BLOCK_T / 8`` with shorter ones
    (so that the tests' 16-step chunks loop over blocks of two)."""
    W: tl.constexpr = 3 + 4 * PAIR  # slot width: map components + state
    if BLOCK_T >= 2048:
        BLOCK_R: tl.constexpr = 256 // BLOCK_N
    elif BLOCK_T >= 16:
        BLOCK_R: tl.constexpr = BLOCK_T // 8
    else:
        BLOCK_R: tl.constexpr = 2
    base = p_ws + tile * NUM_SEG * (W * BLOCK_N)
    o_b = tl.arange(0, BLOCK_N)
    cu, cv = _load_state(base, o_b, BLOCK_N, PAIR)
    ranks = tl.arange(0, BLOCK_R)[:, None]
    last = ranks == BLOCK_R - 1
    for r0 in range(1, rank, BLOCK_R):
        rr = r0 + ranks
        ok = (rr < rank) & (o_b[None, :] >= 0)
        cu, cv = apply(_composed(base + rr * (W * BLOCK_N) + o_b[None, :], BLOCK_N, ok, last, PAIR, False), cu, cv,
                       PAIR)
    return cu, cv


@triton.jit
def _acquire(p, ASM: tl.constexpr):
    """The int64 words at ``p`` read with acquire semantics at the GPU's scope: a plain load
    (``ld.acquire``, inline PTX) under ``ASM``, else an atomic add of 0 (Triton's interpreter runs no PTX)."""
    if ASM:
        return tl.inline_asm_elementwise("ld.acquire.gpu.global.b64 $0, [$1];", "=l,l", [p], dtype=tl.int64,
                                         is_pure=False, pack=1)
    else:
        return tl.atomic_add(p, 0, sem="acquire")


@triton.jit
def _window_back(p_ws, p_word, tile, rank, NUM_SEG, m, PAIR: tl.constexpr, ACC: tl.constexpr, POLL: tl.constexpr,
                 ASM: tl.constexpr):
    """The carry into chunk ``rank`` of a one-row program (``BLOCK_N`` 1), ``POLL`` chunks at a time:
    read the words of chunks ``hi − POLL + 1 … hi`` at once (``hi``: the latest not yet composed; where
    ``POLL`` is the program's thread count, one word per thread, so that each is read once and every
    decision below comes from a reduction all threads share; with one warp's 32 words under more warps,
    each warp reads them and decides on its own copy, within the warp, no barrier: the carries agree,
    composed from the same published words); wait while any after the latest that
    published its inclusive state has published nothing; else compose their aggregates (a scan along
    the window, later chunks outer) into ``m`` and, if a state was found, apply ``m`` to it, or move
    the window back. Each thread reads the aggregate and state of the chunk whose word it read."""
    W: tl.constexpr = 3 + 4 * PAIR
    IN_WORD: tl.constexpr = not PAIR and tl.float32 == ACC
    low = tl.full((), 4294967295, tl.int64)
    k = tl.arange(0, POLL)
    hi = rank - 1
    cu = tl.zeros([1], ACC)
    cv = cu
    while hi >= 0:
        pr = hi - (POLL - 1) + k  # oldest first: the scan's later elements are the nearer chunks
        live = pr >= 0
        slot = tile * NUM_SEG + tl.maximum(pr, 0)
        w = _acquire(p_word + slot, ASM)
        f = tl.where(live, w >> 32, 2)  # before the row: never picked (chunk 0 publishes its state, never flag 1)
        k2 = tl.max(tl.where(f == 2, k, -1), axis=0)  # the latest with its inclusive state
        waiting = tl.max(tl.where((k > k2) & (f == 0), 1, 0), axis=0)
        if waiting == 0:
            agg = (k > k2) & live
            p_s = p_ws + slot * W
            m = _compose(m, _composed(p_s, 1, agg, k == POLL - 1, PAIR, True), PAIR)
            if k2 >= 0:
                at = k == k2
                if IN_WORD:
                    bits = tl.max(tl.where(at, w & low, 0), axis=0)
                    su = tl.zeros([1], ACC) + bits.to(tl.int32).to(tl.float32, bitcast=True)
                    sv = su
                elif PAIR:
                    su = _pick(tl.load(p_s + 5, mask=at, other=0.0, volatile=True), at)
                    sv = _pick(tl.load(p_s + 6, mask=at, other=0.0, volatile=True), at)
                else:
                    su = _pick(tl.load(p_s + 2, mask=at, other=0.0, volatile=True), at)
                    sv = su
                cu, cv = apply(m, su, sv, PAIR)
                hi = hi * 0 - 1  # found: stop
            else:
                hi -= POLL
    return cu, cv


@triton.jit
def _pick(x, at):
    """``x`` at the one lane where ``at`` (``[POLL]``), as ``[1]``."""
    return tl.zeros([1], x.dtype) + tl.sum(tl.where(at, x, 0.0), axis=0)


@triton.jit
def _look_back(p_ws, p_word, tile, rank, NUM_SEG, g, cu, cv, PAIR: tl.constexpr, cfg):
    """Publish this chunk's aggregate ``g`` (flag 1), then find the carry into it: walk back over
    the chunks before it in scan order, composing the aggregates of those that only published
    theirs (flag 1), waiting on any that published nothing yet (flag 0), until one that published
    its inclusive state (flag 2). Then publish this chunk's inclusive state (flag 2). Returns the
    carry. Rank 0 (the first chunk in scan order) keeps the row's carry ``(cu, cv)``.

    Each chunk's flag is the high half of an int64 word (``p_word``). A float32 state of one row
    (``IN_WORD``: one row per program, a scalar map) sits in the word's low half, published with its
    flag in one store: one load of the word tells the flag and the state, and no fence orders the
    state before the flag. Other states sit in the slot, stored before a flag published with release
    semantics and read after it. With ``cfg.POLL`` (one-row programs) the walk reads a window of words at
    once instead (:func:`_window_back`)."""
    BLOCK_N: tl.constexpr = cfg.BLOCK_N
    ACC: tl.constexpr = cfg.ACC
    W: tl.constexpr = 3 + 4 * PAIR  # slot width: map components + state
    IN_WORD: tl.constexpr = BLOCK_N == 1 and not PAIR and tl.float32 == ACC
    low = tl.full((), 4294967295, tl.int64)
    o_b = tl.arange(0, BLOCK_N)
    slot = tile * NUM_SEG + rank
    p_slot = p_ws + slot * (W * BLOCK_N)
    if rank > 0:
        _store_map(p_slot, g, o_b, BLOCK_N, PAIR)
        tl.debug_barrier()
        tl.atomic_xchg(p_word + slot, tl.full((), 1 << 32, tl.int64), sem="release")
        m = _identity(BLOCK_N, PAIR, ACC)  # the aggregates between the state found and this chunk
        if cfg.POLL > 0:
            tl.static_assert(BLOCK_N == 1, "the look-back's window is for one-row programs")
            cu, cv = _window_back(p_ws, p_word, tile, rank, NUM_SEG, m, PAIR, ACC, cfg.POLL, cfg.ASM)
        else:
            pr = rank - 1
            while pr >= 0:
                p_w = p_word + tile * NUM_SEG + pr
                w = tl.atomic_add(p_w, 0, sem="acquire")
                while (w >> 32) == 0:  # not started, or not published yet: wait (it started before this one)
                    w = tl.atomic_add(p_w, 0, sem="acquire")
                p_pr = p_ws + (tile * NUM_SEG + pr) * (W * BLOCK_N)
                if (w >> 32) == 2:
                    if IN_WORD:
                        su = tl.full([BLOCK_N], 0.0, tl.float32) + (w & low).to(tl.int32).to(tl.float32,
                                                                                           bitcast=True)
                        sv = su
                    else:
                        su, sv = _load_state(p_pr, o_b, BLOCK_N, PAIR)
                    cu, cv = apply(m, su, sv, PAIR)
                    pr = pr * 0 - 1  # found: stop
                else:
                    m = _compose(m, _load_map(p_pr, o_b, BLOCK_N, PAIR), PAIR)
                    pr -= 1
    iu, iv = apply(g, cu, cv, PAIR)
    if IN_WORD:
        bits = tl.sum(iu, axis=0).to(tl.int32, bitcast=True).to(tl.int64) & low
        tl.atomic_xchg(p_word + slot, bits | tl.full((), 2 << 32, tl.int64), sem="relaxed")
    else:
        _store_state(p_slot, iu, iv, o_b, BLOCK_N, PAIR)
        tl.debug_barrier()
        tl.atomic_xchg(p_word + slot, tl.full((), 2 << 32, tl.int64), sem="release")
    return cu, cv


# ---- the carry past the window ------------------------------------------------------------------


@triton.jit
def carry_in(fields, p_ci, geo, first, PAIR: tl.constexpr, CARRY_IN: tl.constexpr, ACC: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """The state past the window, per row ``[BLOCK_N]`` of ``geo.rows`` (see ``CARRY_IN``; ``PAIR``: the
    state is V-trace's pair ``(u, V)``, ``[N, 2]`` in memory); ``first``: this program holds the first
    chunk in scan order (only that one reads the mask back for the window end).

    The window end is the row's last column, or with a mask its last unmasked step, found by reading
    the mask backward from the row's end one chunk at a time (1 byte per step, usually one chunk); a
    row with no unmasked step passes V(s_T) of its last column through. V(s_T) is 0 where that
    step terminated (it is never read)."""
    rows, row_ok, T, s_n, s_t = geo.rows, geo.row_ok, geo.T, geo.s_n, geo.s_t
    cu = tl.zeros([BLOCK_N], ACC)
    cv = tl.zeros([BLOCK_N], ACC)
    nn = rows // geo.F
    if CARRY_IN == STATE:
        if PAIR:
            cu = tl.load(p_ci + rows * 2, mask=row_ok, other=0).to(ACC)
            cv = tl.load(p_ci + rows * 2 + 1, mask=row_ok, other=0).to(ACC)
        else:
            cu = tl.load(p_ci + rows, mask=row_ok, other=0).to(ACC)
    if CARRY_IN == END_COLUMN or CARRY_IN == END_STEP:
        p_k, p_bv, p_m = fields.p_k, fields.p_bv, fields.p_m
        j_end = tl.zeros([BLOCK_N], tl.int64) + (T - 1)
        live_end = row_ok
        if p_m is not None:
            lanes = tl.arange(0, BLOCK_T)[None, :]
            last = tl.full([BLOCK_N], -1, tl.int64)
            c = (tl.zeros([], tl.int64) + T - 1) // BLOCK_T
            c = tl.where(first, c, -1)
            todo = tl.sum(row_ok.to(tl.int32), axis=0)
            while (c >= 0) & (todo > 0):
                o_c = c * BLOCK_T + lanes
                ok_c = row_ok[:, None] & (o_c < T)
                live_c = tl.load(p_m + nn[:, None] * s_n + o_c * s_t, mask=ok_c, other=0) != 0
                here = tl.max(tl.where(live_c, o_c, -1), axis=1).to(tl.int64)
                last = tl.where(last < 0, here, last)
                todo = tl.sum(((last < 0) & row_ok).to(tl.int32), axis=0)
                c -= 1
            live_end = row_ok & (last >= 0)
            j_end = tl.where(live_end, last, j_end)
        k_end = tl.zeros([BLOCK_N], tl.int1)
        if p_k is not None:
            k_end = (tl.load(p_k + nn * s_n + j_end * s_t, mask=row_ok, other=0) != 0) & live_end
        # loaded alongside the flag, not under it (one memory round trip, not two in a row); a
        # terminated window end's value (NaN, say) is dropped by the select
        if CARRY_IN == END_STEP:
            b_end = tl.load(p_bv + nn * s_n + j_end * s_t, mask=row_ok, other=0).to(ACC)
        else:
            b_end = tl.load(p_ci + nn, mask=row_ok, other=0).to(ACC)
        b_end = tl.where(k_end, 0.0, b_end)
        if PAIR:
            cv = b_end
        else:
            cu = b_end
    return cu, cv


# ---- one chunk ----------------------------------------------------------------------------------


@triton.jit
def steps(start, lanes, REVERSE: tl.constexpr, FLIP: tl.constexpr, BLOCK_T: tl.constexpr,
          QUADS: tl.constexpr = False):
    """The steps a chunk's lanes hold: ``start + lane``, or with ``FLIP`` (backward scans) the chunk in
    reverse, lane ``j`` at ``start + BLOCK_T − 1 − j``, so that the backward scan runs in lane order;
    with ``QUADS`` (backward scans) in quads of 4 steps, the latest quad first and each quad's steps in
    time order: lane ``4q + r`` at ``start + BLOCK_T − 4 − 4q + r`` (a thread's 4 lanes are 4
    consecutive steps: vectorised loads; :func:`_quad_scan`)."""
    if REVERSE and QUADS:
        return start + (BLOCK_T - 4) - (lanes // 4) * 4 + lanes % 4
    elif REVERSE and FLIP:
        return start + (BLOCK_T - 1) - lanes
    else:
        return start + lanes


@triton.jit
def _scan_steps(start, lanes, geo, REVERSE: tl.constexpr, FLIP: tl.constexpr, BLOCK_T: tl.constexpr,
                D: tl.constexpr, QUADS: tl.constexpr):
    """``(o, ok)``: the steps whose maps a chunk starting at ``start`` scans (its own, or with
    ``D = ±1`` each lane's neighbour along the scan) and which of them are inside the row."""
    o = steps(start, lanes, REVERSE, FLIP, BLOCK_T, QUADS) + D
    ok = geo.row_ok[:, None] & (o < geo.T)
    if D < 0:  # the neighbour before the row's first step
        ok = ok & (o >= 0)
    return o, ok


@triton.jit
def _fold(e, at, cu, cv, PAIR: tl.constexpr):
    """The maps ``e`` with the carry ``(cu, cv)`` ([BLOCK_N]) applied to the one at ``at`` (the chunk's
    first lane in scan order: a step past the row's end there is the identity and hands the carry on,
    as does a masked step), so that the scan's inclusive maps hold the states themselves in their
    additive components: no map is applied after the scan, and the multiplicative components are dead
    after it (the compiler drops them, Triton's flips of a reverse scan included). The first map's
    multiplicative components stay: no composite's additive component reads them."""
    if PAIR:
        return PairMap(e.p, e.q, e.s, tl.where(at, e.a + e.p * cu[:, None] + e.q * cv[:, None], e.a),
                       tl.where(at, e.w + e.s * cv[:, None], e.w))
    else:
        return Map(tl.where(at, e.a + e.b * cu[:, None], e.a), e.b)


@triton.jit
def _quarters(x, BLOCK_N: tl.constexpr, NQ: tl.constexpr):
    """``x`` (``[BLOCK_N, 4·NQ]``, lanes ``4q + r``) as its four ``[BLOCK_N, NQ]`` quarters ``r = 0 … 3``:
    a split of each thread's own 4 lanes, no data moved between threads."""
    y01, y23 = tl.split(tl.permute(tl.reshape(x, (BLOCK_N, NQ, 2, 2)), (0, 1, 3, 2)))
    x0, x1 = tl.split(y01)
    x2, x3 = tl.split(y23)
    return x0, x1, x2, x3


@triton.jit
def _whole(x0, x1, x2, x3, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """:func:`_quarters` undone: lane ``4q + r`` from ``x_r[q]``."""
    return tl.reshape(tl.permute(tl.join(tl.join(x0, x1), tl.join(x2, x3)), (0, 1, 3, 2)), (BLOCK_N, BLOCK_T))


@triton.jit
def _quarter_maps(e, PAIR: tl.constexpr, BLOCK_N: tl.constexpr, NQ: tl.constexpr):
    """The maps ``e`` as four maps of ``[BLOCK_N, NQ]`` (:func:`_quarters` of each component)."""
    if PAIR:
        p0, p1, p2, p3 = _quarters(e.p, BLOCK_N, NQ)
        q0, q1, q2, q3 = _quarters(e.q, BLOCK_N, NQ)
        s0, s1, s2, s3 = _quarters(e.s, BLOCK_N, NQ)
        a0, a1, a2, a3 = _quarters(e.a, BLOCK_N, NQ)
        w0, w1, w2, w3 = _quarters(e.w, BLOCK_N, NQ)
        return (PairMap(p0, q0, s0, a0, w0), PairMap(p1, q1, s1, a1, w1), PairMap(p2, q2, s2, a2, w2),
                PairMap(p3, q3, s3, a3, w3))
    else:
        a0, a1, a2, a3 = _quarters(e.a, BLOCK_N, NQ)
        b0, b1, b2, b3 = _quarters(e.b, BLOCK_N, NQ)
        return Map(a0, b0), Map(a1, b1), Map(a2, b2), Map(a3, b3)


@triton.jit
def _whole_map(m0, m1, m2, m3, PAIR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """Four maps of ``[BLOCK_N, NQ]`` as one of ``[BLOCK_N, BLOCK_T]`` (:func:`_whole` of each component)."""
    if PAIR:
        return PairMap(_whole(m0.p, m1.p, m2.p, m3.p, BLOCK_N, BLOCK_T),
                       _whole(m0.q, m1.q, m2.q, m3.q, BLOCK_N, BLOCK_T),
                       _whole(m0.s, m1.s, m2.s, m3.s, BLOCK_N, BLOCK_T),
                       _whole(m0.a, m1.a, m2.a, m3.a, BLOCK_N, BLOCK_T),
                       _whole(m0.w, m1.w, m2.w, m3.w, BLOCK_N, BLOCK_T))
    else:
        return Map(_whole(m0.a, m1.a, m2.a, m3.a, BLOCK_N, BLOCK_T), _whole(m0.b, m1.b, m2.b, m3.b, BLOCK_N, BLOCK_T))


@triton.jit
def combine_quads(a1, b1, c1, d1, a2, b2, c2, d2):
    # (A, B) pairs of maps, A = (a, b), B = (c, d): (A₂ ∘ A₁, B₂ ∘ A₁). Scanned from (map, identity)
    # elements, B comes out as the composition of the maps before each element: the exclusive scan
    # within the inclusive one, with no value moved between lanes afterwards
    a, b = compose(a2, b2, a1, b1)
    c, d = compose(c2, d2, a1, b1)
    return a, b, c, d


@triton.jit
def combine_pair_quads(p1, q1, s1, a1, w1, pb1, qb1, sb1, ab1, wb1, p2, q2, s2, a2, w2, pb2, qb2, sb2, ab2, wb2):
    p, q, s, a, w = compose_pair(p2, q2, s2, a2, w2, p1, q1, s1, a1, w1)
    pb, qb, sb, ab, wb = compose_pair(pb2, qb2, sb2, ab2, wb2, p1, q1, s1, a1, w1)
    return p, q, s, a, w, pb, qb, sb, ab, wb


@triton.jit
def _quads(e, PAIR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """The maps ``e`` of a chunk held in quads (:func:`steps`, ``QUADS``) as each quad's suffixes
    ``s0, s1, s2, e3`` (``[BLOCK_N, NQ]`` each: ``s_r`` takes the state past the quad, in time, to the
    quad's step ``r``; ``s0`` is the quad's map), composed in registers from the thread's own 4 lanes,
    and the quads' indices ``q`` in the same layout (an index tensor of the quads' shape built
    otherwise, an arange, would take another layout, and every quarter would be moved between threads
    to meet it)."""
    NQ: tl.constexpr = BLOCK_T // 4
    e0, e1, e2, e3 = _quarter_maps(e, PAIR, BLOCK_N, NQ)
    s2 = _compose(e2, e3, PAIR)
    s1 = _compose(e1, s2, PAIR)
    s0 = _compose(e0, s1, PAIR)
    q, _, _, _ = _quarters(tl.arange(0, BLOCK_T)[None, :] // 4 + tl.zeros_like(e.a).to(tl.int32), BLOCK_N, NQ)
    return s0, s1, s2, e3, q


@triton.jit
def _past(g, cu0, cv0, one, zero, PAIR: tl.constexpr):
    """The maps past each quad, in time: the second maps of a forward scan over the quads of the
    pairs (the quad's map ``g``, the map past the first quad: the shift by the carry ``(cu0, cv0)``
    there, whose additive components are the carry, the identity elsewhere; ``one``, ``zero``: 1 and 0
    in the quads' layout and the maps' dtype)."""
    if PAIR:
        m = tl.associative_scan((g.p, g.q, g.s, g.a, g.w, one, zero, one, cu0, cv0), 1, combine_pair_quads)
        return PairMap(m[5], m[6], m[7], m[8], m[9])
    else:
        m = tl.associative_scan((g.a, g.b, cu0, one), 1, combine_quads)
        return Map(m[2], m[3])


@triton.jit
def _quad_scan(e, cu, cv, PAIR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """A backward scan of the maps ``e`` of a chunk held in quads (:func:`steps`, ``QUADS``) from the
    carry ``(cu, cv)``, without Triton's reverse scan: the quads' suffixes (:func:`_quads`), then one
    forward scan over the quads (latest first: scan order) that gives, beside each quad's inclusive
    map, the map past it in time (:func:`combine_quads`; past the first, the shift by the carry).
    Returns the inclusive and the exclusive maps (``[BLOCK_N, BLOCK_T]``), whose additive components
    are the states (the carry folded in, as :func:`_fold` does); from a zero carry they are each lane's
    maps from the chunk's edge, the multiplicative components whole (the look-back applies its carry
    to them)."""
    s0, s1, s2, e3, q = _quads(e, PAIR, BLOCK_N, BLOCK_T)
    first = q == 0
    g = _fold(s0, first, cu, cv, PAIR)
    # the map past the first quad, built from `first` so that every element of the scan is in the
    # quarters' layout, and in the maps' dtype (float64 accumulation: the scan's elements share one type)
    one = tl.where(first, 1.0, 1.0).to(s0.a.dtype)
    zero = tl.where(first, 0.0, 0.0).to(s0.a.dtype)
    cu0 = tl.where(first, cu[:, None], 0.0)
    x = _past(g, cu0, tl.where(first, cv[:, None], 0.0), one, zero, PAIR)
    i0 = _compose(s0, x, PAIR)
    i1 = _compose(s1, x, PAIR)
    i2 = _compose(s2, x, PAIR)
    i3 = _compose(e3, x, PAIR)
    return _whole_map(i0, i1, i2, i3, PAIR, BLOCK_N, BLOCK_T), _whole_map(i1, i2, i3, x, PAIR, BLOCK_N, BLOCK_T)


@triton.jit
def _quad_total(e, PAIR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """The composition of a chunk's maps ``e`` held in quads (``[BLOCK_N]``): a forward scan over the
    quads' maps, its last element: the first of the three passes over split rows, which writes the
    chunks' aggregates only."""
    s0, _, _, _, q = _quads(e, PAIR, BLOCK_N, BLOCK_T)
    if PAIR:
        return _edge_map(PairMap(*tl.associative_scan(s0, 1, combine_pair_lanes)), q, BLOCK_T // 4 - 1, PAIR)
    else:
        return _edge_map(Map(*tl.associative_scan(s0, 1, combine_lanes)), q, BLOCK_T // 4 - 1, PAIR)


@triton.jit
def _scan(fam, x, at, cu, cv, scan, SCAN_REV: tl.constexpr, FOLD: tl.constexpr, ACC: tl.constexpr,
          QUADS: tl.constexpr = False, BLOCK_N: tl.constexpr = 1, BLOCK_T: tl.constexpr = 1):
    """Inclusive scan over the chunk (axis 1) of the maps (``scan.STEP``) of the steps whose values are
    ``x``, in lane order or (``SCAN_REV``) against it; ``FOLD``: the carry ``(cu, cv)`` folded into the
    map at ``at`` first (:func:`_fold`), so that the scan gives the states. Returns the inclusive maps
    and the exclusive ones: with ``QUADS`` (a backward chunk held in quads, :func:`_quad_scan`) both
    come out of the scan (without ``FOLD``: scanned from a zero carry, so that each lane holds its map
    from the chunk's edge, the multiplicative components included); otherwise the inclusive ones twice
    (:func:`_finish` shifts them)."""
    e = scan.STEP(fam, x, ACC)
    if QUADS:
        if FOLD:
            i, ex = _quad_scan(e, cu, cv, scan.PAIR, BLOCK_N, BLOCK_T)
        else:  # from no carry: the maps themselves (the look-back applies its carry after)
            i, ex = _quad_scan(e, tl.zeros_like(cu), tl.zeros_like(cv), scan.PAIR, BLOCK_N, BLOCK_T)
    else:
        if FOLD:
            e = _fold(e, at, cu, cv, scan.PAIR)
        if scan.PAIR:
            i = PairMap(*tl.associative_scan(e, 1, combine_pair_lanes, reverse=SCAN_REV))
        else:
            i = Map(*tl.associative_scan(e, 1, combine_lanes, reverse=SCAN_REV))
        ex = i
    return i, ex


@triton.jit
def _finish(fam, geo, e, ex, cu, cv, end, start, p_co, scan, cfg, FOLD: tl.constexpr):
    """A chunk's scan ``e`` applied to the carry into it; the state ``EMIT`` reads at every lane (the
    inclusive one if the family's scan is its output; else the exclusive one: the scan of the
    neighbours' maps itself with ``SHIFT_LOAD``, or the inclusive one shifted by a lane in
    registers); the outputs written from the steps' fields (``LOAD``); the row's carry out stored
    by the chunk that holds its edge step. Returns the inclusive state (what the next chunk in scan
    order starts from). ``FOLD``: the carry was folded into the scan (:func:`_fold`): ``e`` holds the
    states already. ``ex``: the exclusive maps (``cfg.QUADS``: the scan gives them; else unread)."""
    PAIR: tl.constexpr = scan.PAIR
    CARRY2: tl.constexpr = scan.CARRY2
    INCLUSIVE: tl.constexpr = scan.INCLUSIVE
    REVERSE: tl.constexpr = scan.REVERSE
    FLIP: tl.constexpr = cfg.FLIP
    SHIFT_LOAD: tl.constexpr = cfg.SHIFT_LOAD
    BLOCK_T: tl.constexpr = cfg.BLOCK_T
    QUADS: tl.constexpr = cfg.QUADS and REVERSE
    rows, row_ok = geo.rows, geo.row_ok
    lanes = tl.arange(0, BLOCK_T)[None, :]
    o = steps(start, lanes, REVERSE, FLIP, BLOCK_T, QUADS)
    ok = row_ok[:, None] & (o < geo.T)
    if FOLD:
        if PAIR:
            iu = e.a
            iv = e.w
        else:
            iu = e.a
            iv = cv[:, None] + tl.zeros_like(e.a)
    else:
        iu, iv = apply(e, cu[:, None], cv[:, None], PAIR)
    if INCLUSIVE or SHIFT_LOAD:
        zu = iu
        zv = iv
    elif QUADS:  # the scan gave the exclusive states (FOLD), or the exclusive maps
        if FOLD:
            zu = ex.a
            zv = ex.w if PAIR else zu
        else:
            zu, zv = apply(ex, cu[:, None], cv[:, None], PAIR)
            if not PAIR:
                zv = zu
    else:
        zu = _shift(iu, cu[:, None], lanes, REVERSE and not FLIP, BLOCK_T)
        zv = _shift(iv, cv[:, None], lanes, REVERSE and not FLIP, BLOCK_T) if PAIR else zu
    x = scan.LOAD(fam, geo, o, ok, end, cfg.ACC)
    ou, ov = scan.EMIT(fam, geo, o, ok, x, Z(zu, zv, cu[:, None]), cfg.ACC)
    if p_co is not None:
        if not SHIFT_LOAD and not INCLUSIVE and PAIR == CARRY2:  # the scan is the carried state already
            ou = iu
            ov = iv
        edge = o == 0 if REVERSE else o == geo.T - 1
        # stored by the one lane of each row that holds its edge step: no reduction across the chunk
        at = edge & row_ok[:, None]
        r = rows[:, None] + 0 * lanes
        if CARRY2:
            tl.store(p_co + r * 2, out_value(ou, p_co), mask=at)
            tl.store(p_co + r * 2 + 1, out_value(ov, p_co), mask=at)
        else:
            tl.store(p_co + r, out_value(ou, p_co), mask=at)
    return iu, iv


# ---- the driver ---------------------------------------------------------------------------------


@triton.jit
def _program(R, T, p0, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, PASS: tl.constexpr):
    """``(tile, rank)`` of this program: its row tile and, for split rows, its chunk's rank in scan
    order (0 = first); ``p0``: the index of the launch's first program of split rows (0 but where a
    test runs one program of a launch by itself). Consecutive programs take different row tiles at
    the same rank, so that the programs in flight advance many rows' chains at once.

    A program of the look-back waits only on programs of a lower index, which the GPU starts first
    (an assumption: NVIDIA's GPUs start a grid's programs in index order, CUDA does not promise it),
    so the chain cannot deadlock; no ticket is taken (a counter that every program increments before
    its first load cost 8-11 µs at 2^24 elements on an H100: docs/kernel-choices.md, 'Long rows
    split: look-back or three passes'). The last of three passes takes the chunks in the reverse
    order of the first, so that it starts on those the first read last, while they are still in L2."""
    if PASS == WALK or PASS == ONE_CHUNK:  # whole rows: p0 unread (the walked kernels' code stays as it was)
        tile = tl.program_id(0).to(tl.int64)
        return tile, tile * 0
    else:
        tiles = tl.cdiv(R, BLOCK_N)
        vid = tl.program_id(0).to(tl.int64) + p0
        if PASS == OUTPUTS:
            vid = tiles * tl.cdiv(T, BLOCK_T) - 1 - vid
        return vid % tiles, vid // tiles


@triton.jit
def drive(fam, sizes, carries, scan, cfg):
    """One program of a family kernel: ``sizes.R`` rows (``R = N·F``) of ``sizes.T`` steps, the fields'
    pair of strides and the outputs' (:data:`Sizes`); ``carries``: the carry in and out, the scratch
    (:data:`Carries`); ``scan``: the family's :data:`Scan`; ``cfg``: the launch's :data:`Config`.

    ``cfg.PASS``: ``ONE_CHUNK``: the program owns ``BLOCK_N`` whole rows of at most ``BLOCK_T`` steps,
    one chunk, straight-line code. ``WALK``: the program owns ``BLOCK_N`` whole rows and walks them in
    ``BLOCK_T``-step chunks (backward in time for the backward estimators), the carry in registers. ``LOOKBACK``:
    it owns one chunk of ``BLOCK_N`` rows and gets the carry into it by the decoupled look-back.
    ``AGGREGATES`` / ``OUTPUTS``: the first and last of three passes over split rows (the middle
    one, :func:`rollbuf.kernels.resolve.resolve_kernel`, turns the aggregates into every chunk's
    carry): no atomics, no waiting.

    ``cfg.SHIFT_LOAD``: scan the neighbouring step's maps (``t + 1`` backward, ``t − 1`` forward; the
    scan *is* the exclusive state); otherwise scan the steps' own maps and shift by a lane.

    ``cfg.FLIP`` (backward scans only): each chunk is held in reverse, lane j at step
    ``start + BLOCK_T − 1 − j`` (:func:`steps`), and the backward scan runs in lane order, so that
    Triton does not reverse every element across the warp; the chunk's edge lane, the lane shift and
    the aggregate follow the scan's direction in lanes (``SCAN_REV``), the row's edges stay in time.

    ``cfg.QUADS`` (backward scans only): each chunk is held in quads of 4 steps, the latest quad
    first and each quad's steps in time order (:func:`steps`: a thread's 4 lanes are 4 consecutive
    steps, loaded as one vector), and scanned without Triton's reverse scan: the quads' suffixes in
    registers and one forward scan over the quads that gives the exclusive state beside the
    inclusive one (:func:`_quad_scan`; no lane shift, no re-load). The carry is folded in where it is
    known before the scan; the look-back scans its chunk from no carry and applies the carry found to
    the maps held; the three passes' first composes the quads' maps alone (:func:`_quad_total`).

    ``scan.PAIR``, ``scan.CARRY2``, ``scan.INCLUSIVE``: the scan's maps are pair maps (five components)
    or scalar ones; the carry in and out is a pair per row (V-trace's ``(u, V)``) or one value;
    ``EMIT`` reads the inclusive state (the family scans its output itself) or the exclusive one.
    ``LOAD`` also gets ``end``, the :data:`State` past the window (``[BLOCK_N, 1]`` each)."""
    PAIR: tl.constexpr = scan.PAIR
    CARRY2: tl.constexpr = scan.CARRY2
    INCLUSIVE: tl.constexpr = scan.INCLUSIVE
    REVERSE: tl.constexpr = scan.REVERSE
    PASS: tl.constexpr = cfg.PASS
    ACC: tl.constexpr = cfg.ACC
    BLOCK_N: tl.constexpr = cfg.BLOCK_N
    BLOCK_T: tl.constexpr = cfg.BLOCK_T
    FLIP: tl.constexpr = cfg.FLIP
    QUADS: tl.constexpr = cfg.QUADS and REVERSE
    R, T, F = sizes.R, sizes.T, sizes.F
    p_ci, p_co, p_ws = carries.p_ci, carries.p_co, carries.p_ws
    tile, rank = _program(R, T, sizes.p0, BLOCK_N, BLOCK_T, PASS)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    row_ok = rows < R
    geo = Geo(rows, row_ok, (rows // F)[:, None], (rows % F)[:, None], F, sizes.s_n, sizes.s_t, sizes.s_on,
              sizes.s_ot, T)
    SCAN_REV: tl.constexpr = REVERSE and not FLIP and not QUADS  # the scan runs against lane order
    if QUADS:  # the chunk's first lane in scan order (unread: the quad scan folds the carry itself), its last
        FIRST: tl.constexpr = 3
        EDGE: tl.constexpr = BLOCK_T - 4
    elif SCAN_REV:  # the chunk's first and last lane in scan order
        FIRST: tl.constexpr = BLOCK_T - 1
        EDGE: tl.constexpr = 0
    else:
        FIRST: tl.constexpr = 0
        EDGE: tl.constexpr = BLOCK_T - 1
    if cfg.SHIFT_LOAD and not INCLUSIVE:
        if REVERSE:
            D: tl.constexpr = 1
        else:
            D: tl.constexpr = -1
    else:
        D: tl.constexpr = 0
    lanes = tl.arange(0, BLOCK_T)[None, :]
    NUM_SEG = tl.cdiv(T, BLOCK_T)
    cu, cv = carry_in(fam.fields, p_ci, geo, rank == 0, CARRY2, cfg.CARRY_IN, ACC, BLOCK_N, BLOCK_T)
    end = State(cu[:, None], cv[:, None])
    if PASS == ONE_CHUNK:
        o_s, ok_s = _scan_steps(0, lanes, geo, REVERSE, FLIP, BLOCK_T, D, QUADS)
        x = scan.LOAD(fam, geo, o_s, ok_s, end, ACC)
        e, ex = _scan(fam, x, lanes == FIRST, cu, cv, scan, SCAN_REV, True, ACC, QUADS, BLOCK_N, BLOCK_T)
        _finish(fam, geo, e, ex, cu, cv, end, 0, p_co, scan, cfg, True)
    elif PASS == WALK:
        for i in range(0, NUM_SEG):
            start = (NUM_SEG - 1 - i) * BLOCK_T if REVERSE else i * BLOCK_T
            o_s, ok_s = _scan_steps(start, lanes, geo, REVERSE, FLIP, BLOCK_T, D, QUADS)
            x = scan.LOAD(fam, geo, o_s, ok_s, end, ACC)
            e, ex = _scan(fam, x, lanes == FIRST, cu, cv, scan, SCAN_REV, True, ACC, QUADS, BLOCK_N, BLOCK_T)
            iu, iv = _finish(fam, geo, e, ex, cu, cv, end, start, p_co, scan, cfg, True)
            if i + 1 < NUM_SEG:  # the state at the chunk's edge carries into the next chunk
                cu = _edge(iu, lanes, EDGE)
                if PAIR:
                    cv = _edge(iv, lanes, EDGE)
    else:
        start = (NUM_SEG - 1 - rank) * BLOCK_T if REVERSE else rank * BLOCK_T
        W: tl.constexpr = 3 + 4 * PAIR  # slot width: map components + state
        o_b = tl.arange(0, BLOCK_N)
        slot = tile * NUM_SEG + rank
        p_slot = p_ws + slot * (W * BLOCK_N)
        o_s, ok_s = _scan_steps(start, lanes, geo, REVERSE, FLIP, BLOCK_T, D, QUADS)
        # the look-back scans its chunk before the carry is found and holds the maps through it; in
        # quads, the passes whose carry is read from the scratch load and scan the chunk once it is
        # known, and the aggregates' pass composes the quads' maps alone
        HOLD: tl.constexpr = not QUADS or PASS == LOOKBACK
        if HOLD or PASS == AGGREGATES:
            x = scan.LOAD(fam, geo, o_s, ok_s, end, ACC)
        if HOLD:
            e, ex = _scan(fam, x, lanes, cu, cv, scan, SCAN_REV, False, ACC, QUADS, BLOCK_N, BLOCK_T)
        if PASS == OUTPUTS:  # the carry resolved by the earlier passes: the predecessor's inclusive state
            if rank > 0:
                cu, cv = _load_state(p_ws + (slot - 1) * (W * BLOCK_N), o_b, BLOCK_N, PAIR)
        elif PASS == RESOLVING:  # the predecessor's inclusive state, from the aggregates of the first pass
            if rank > 0:
                cu, cv = _resolved(p_ws, tile, rank, NUM_SEG, BLOCK_N, BLOCK_T, PAIR)
        else:
            # this chunk's aggregate map
            g = _edge_map(e, lanes, EDGE, PAIR) if HOLD else _quad_total(scan.STEP(fam, x, ACC), PAIR, BLOCK_N,
                                                                          BLOCK_T)
            if PASS == AGGREGATES:
                if rank > 0:
                    _store_map(p_slot, g, o_b, BLOCK_N, PAIR)
                else:
                    iu0, iv0 = apply(g, cu, cv, PAIR)
                    _store_state(p_slot, iu0, iv0, o_b, BLOCK_N, PAIR)
            else:
                # the words after the slots, at an even number of values (8-byte aligned)
                p_word = (p_ws + (tl.cdiv(R, BLOCK_N) * NUM_SEG * (W * BLOCK_N) + 1) // 2 * 2).to(
                    tl.pointer_type(tl.int64))
                cu, cv = _look_back(p_ws, p_word, tile, rank, NUM_SEG, g, cu, cv, PAIR, cfg)
        if PASS != AGGREGATES:
            if not HOLD:  # the states scanned from the carry read, the steps loaded after it (loaded before
                # it and held, the three passes' last pass took 8-10% longer for V-trace and Retrace)
                x = scan.LOAD(fam, geo, o_s, ok_s, end, ACC)
                e, ex = _scan(fam, x, lanes, cu, cv, scan, False, True, ACC, QUADS, BLOCK_N, BLOCK_T)
            _finish(fam, geo, e, ex, cu, cv, end, start, p_co, scan, cfg, not HOLD)
