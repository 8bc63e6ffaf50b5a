"""Split rows' programs run in adversarial orders: the decoupled look-back's every branch.

A launch of split rows runs one program per chunk; each publishes its chunk's aggregate map (flag 1),
looks back over the chunks before it in scan order, composing the aggregates of those that have not
published their inclusive state yet and waiting on any that published nothing (flag 0), until one
that did (flag 2). Triton's interpreter runs a launch's programs one after another, in index order,
so in a plain launch every predecessor has finished (flag 2) and neither the composing nor the
waiting branch runs. This harness runs one launch's programs one at a time (a launch of one program
whose index is set by ``sizes.p0``), against a scratch seeded with what other programs of the same
launch would have published, in reverse and shuffled orders, and with a predecessor that publishes
only while the program waits on it (a second thread). Seeded states that must not be read are NaN,
so a branch taken wrongly shows up; every order's outputs equal the plain launch's and the
reference.
"""

from __future__ import annotations

import random
import threading
import time
import zlib

import pytest
import torch

import rollbuf.kernels as K
from rollbuf.problem import Problem
from test_kernels import assert_ref, call, make

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(CUDA, reason="drives the interpreter's programs one by one (CPU)")

N, T, BLOCK_T = 3, 37, 8  # 3 row tiles x 5 chunks = 15 programs


def _problem(name, f):
    base = {k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")}
    if name == "gae":
        return Problem(family="lambda", outputs=("advantages", "returns"), fields=base, gamma=0.97, lam=0.9,
                       want_carry=True)
    if name == "vtrace":
        return Problem(family="vtrace", outputs=("vs", "pg_advantages"),
                       fields=dict(base, log_probs=f["log_probs"], target_log_probs=f["target_log_probs"]),
                       gamma=0.97, rho_bar=1.0, c_bar=0.9, pg_rho_bar=1.2, lam=0.95, want_carry=True)
    assert name == "eligibility_traces"
    return Problem(family="trace", outputs=("traces", "final"), decay=0.97 * 0.9,
                   fields={"x": f["rewards"], "terminated": f["terminated"], "truncated": f["truncated"],
                           "mask": f["mask"]})


class Harness:
    """One look-back launch of ``p``: its plain result, its scratch after a plain run, and programs
    run one by one on a seeded scratch."""

    def __init__(self, p, block_n=1):
        self.p = p
        with K.forced(block_t=BLOCK_T, split=True, presolve=False, block_n=block_n):
            self.la = K.launch_for(p)
        st = self.la.strategy
        assert st.split and not st.presolve and st.num_seg == 5
        self.tiles = -(-self.la.R // st.block_n)
        self.W = 7 if self.la.pair_maps else 3
        self.maps = self.W - (2 if self.la.pair_maps else 1)  # map components per slot
        self.slot = self.W * st.block_n
        args, outs, co, ws = self.la.prepare(*self.la.inputs(p))
        self.la.launch(args, ws)  # plain: every program in index order
        self.plain, self.plain_carry, self.published = [o.clone() for o in outs], co, ws.clone()
        # a float32 state of one row travels in its flag's word (the low half), any other in the slot
        self.in_word = not self.la.pair_maps and self.la.compute_dtype == torch.float32 and st.block_n == 1
        assert bool((self.words(self.published) & 0xFFFFFFFF).ne(0).any()) == self.in_word

    def words(self, ws):
        """The look-back's int64 words, one per slot: the flag in the high half, a float32 state of
        one row in the low half (rollbuf.kernels.core._look_back)."""
        return ws[self.la.slot_values:].view(torch.int64)

    def flag(self, ws, slot):
        return int(self.words(ws)[slot]) >> 32

    def seed(self, ws, slot, flag):
        """Slot ``slot`` as if its program had published up to ``flag`` (1: its aggregate only, its
        state NaN, in its slot and in its word's low half; 2: both; a state that travels in the word
        leaves NaN in the slot, which the program never wrote)."""
        a = slot * self.slot
        n = self.maps * self.la.strategy.block_n
        ws[a:a + self.slot] = float("nan")
        nan_bits = 0x7FC00000  # float32 NaN, where a word's state would be
        if flag >= 1:
            ws[a:a + n] = self.published[a:a + n]
        if flag == 2:
            if not self.in_word:
                ws[a + n:a + self.slot] = self.published[a + n:a + self.slot]
            self.words(ws)[slot] = self.words(self.published)[slot]
        else:
            self.words(ws)[slot] = (flag << 32) | nan_bits

    def vid(self, tile, rank):
        return rank * self.tiles + tile

    def run(self, ws, args, vid):
        """Program ``vid`` of the launch, by itself (``sizes.p0``: the index of the launch's first program)."""
        self.la.launch(dict(args, sizes=(*args["sizes"][:-1], vid)), ws, grid=1)

    def check(self, outs, co):
        for a, b in zip(outs, self.plain):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        if co is not None:
            torch.testing.assert_close(co, self.plain_carry, rtol=1e-6, atol=1e-6)


NAMES = ["gae", "vtrace", "eligibility_traces"]


def _setup(name, mix="term+trunc+mask", dtype=torch.float32, block_n=1):
    f = make(N, T, mix, dtype=dtype, seed=zlib.crc32(f"order-{name}-{mix}".encode()))
    h = Harness(_problem(name, f), block_n)
    assert_ref(h.plain, call(name, f, "reference")[:len(h.plain)], 1e-5)
    return h


@pytest.mark.parametrize("mix", ["term+trunc+mask", "term+trunc"], ids=["mask", "no-mask"])
@pytest.mark.parametrize("name", NAMES)
def test_reverse_order_composes_aggregates(name, mix):
    """Programs in reverse index order; every chunk before them has published its aggregate only
    (its state NaN), the first chunk of each row its state: every program composes all the
    aggregates back to its row's first chunk. With and without a mask (TD(λ) and V-trace scan
    other states without one)."""
    h = _setup(name, mix)
    args, outs, co, ws = h.la.prepare(*h.la.inputs(h.p))
    for tile in range(h.tiles):
        for rank in range(5):
            h.seed(ws, tile * 5 + rank, 2 if rank == 0 else 1)
    for vid in reversed(range(h.la.grid)):
        h.run(ws, args, vid)
    h.check(outs, co)


@pytest.mark.parametrize("dtype,block_n", [(torch.float32, 1), (torch.float64, 1), (torch.float32, 2)],
                         ids=["fp32", "fp64", "fp32-tiles-of-2"])
@pytest.mark.parametrize("name", NAMES)
def test_shuffled_order_mixes_composed_and_found_states(name, dtype, block_n):
    """Programs in a shuffled order over a scratch where each chunk has published its aggregate or
    its state at random: chains of every length, found at every depth."""
    h = _setup(name, dtype=dtype, block_n=block_n)
    rng = random.Random(zlib.crc32(name.encode()))
    for _trial in range(2):
        args, outs, co, ws = h.la.prepare(*h.la.inputs(h.p))
        for tile in range(h.tiles):
            for rank in range(5):
                h.seed(ws, tile * 5 + rank, 2 if rank == 0 else rng.choice((1, 2)))
        order = list(range(h.la.grid))
        rng.shuffle(order)
        for vid in order:
            h.run(ws, args, vid)
        h.check(outs, co)


@pytest.mark.parametrize("name", NAMES)
def test_program_waits_on_an_unpublished_predecessor(name):
    """A program whose predecessor has published nothing (flag 0) waits for it: a second thread
    publishes that chunk only once the program has published its own aggregate;
    the program then finishes with the plain launch's outputs. The last chunk in scan order of row
    tile 1 waits on the chunk before it, which the thread publishes as an aggregate first and its
    state a moment later, so the program also composes while waiting."""
    h = _setup(name)
    args, outs, _, ws = h.la.prepare(*h.la.inputs(h.p))
    tile, rank = 1, 4
    for t in range(h.tiles):
        for r in range(5):
            if (t, r) not in ((tile, 4), (tile, 3), (tile, 2)):
                h.seed(ws, t * 5 + r, 2 if r < 2 else 1)
    vid = h.vid(tile, rank)
    waited = {}

    def publisher():
        deadline = time.monotonic() + 120
        while h.flag(ws, tile * 5 + rank) != 1:  # the program published its aggregate
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)
        waited["before"] = h.flag(ws, tile * 5 + rank)  # still 1: it is waiting
        h.seed(ws, tile * 5 + 3, 1)  # the predecessor's aggregate first ...
        time.sleep(0.3)
        h.seed(ws, tile * 5 + 2, 2)  # ... then the state of the one before it

    th = threading.Thread(target=publisher, daemon=True)
    th.start()
    h.run(ws, args, vid)
    th.join(timeout=120)
    assert waited.get("before") == 1
    assert h.flag(ws, tile * 5 + rank) == 2
    # only that program ran: its chunk equals the plain launch's
    lo, hi = (0, 8) if h.la.fam.backward else (32, 37)
    for a, b in zip(outs, h.plain):
        torch.testing.assert_close(a[tile, lo:hi], b[tile, lo:hi], rtol=1e-6, atol=1e-6)


# ---- the window (forced poll=True): the words of 32·num_warps chunks read at once --------------------

NSEG_W, BT_W = 75, 8  # 75 chunks a row: windows of 32 and 64 chunks move back
T_W = NSEG_W * BT_W - 3


class WindowHarness(Harness):
    """:class:`Harness` over a launch whose look-back reads a window of ``32 · warps`` words at once."""

    def __init__(self, p, warps):
        self.p = p
        with K.forced(block_t=BT_W, split=True, presolve=False, poll=True, num_warps=warps):
            self.la = K.launch_for(p)
        st = self.la.strategy
        assert st.split and st.poll == 32 * warps and st.num_seg == NSEG_W, st
        self.tiles = -(-self.la.R // st.block_n)
        self.W = 7 if self.la.pair_maps else 3
        self.maps = self.W - (2 if self.la.pair_maps else 1)
        self.slot = self.W * st.block_n
        args, outs, co, ws = self.la.prepare(*self.la.inputs(p))
        self.la.launch(args, ws)
        self.plain, self.plain_carry, self.published = [o.clone() for o in outs], co, ws.clone()
        self.in_word = not self.la.pair_maps and self.la.compute_dtype == torch.float32


def _window(name, mix, dtype, warps):
    f = make(2, T_W, mix, dtype=dtype, seed=zlib.crc32(f"poll-{name}-{mix}".encode()))
    h = WindowHarness(_problem(name, f), warps)
    assert_ref(h.plain, call(name, f, "reference")[:len(h.plain)], 1e-5)
    return h


WINDOW_CASES = [("gae", "term+trunc+mask", torch.float32, 1), ("vtrace", "term+trunc+mask", torch.float64, 2),
                ("eligibility_traces", "term+trunc", torch.float64, 1)]


@pytest.mark.parametrize("name,mix,dtype,warps", WINDOW_CASES)
def test_window_composes_and_moves_back(name, mix, dtype, warps):
    """Reverse order: every predecessor but each row's first published only its aggregate, so each
    window composes all its aggregates and moves back, up to three windows (the state in the word:
    fp32 scalar maps; in the slot: fp64, V-trace's pair maps)."""
    h = _window(name, mix, dtype, warps)
    args, outs, co, ws = h.la.prepare(*h.la.inputs(h.p))
    for tile in range(h.tiles):
        for rank in range(NSEG_W):
            h.seed(ws, tile * NSEG_W + rank, 2 if rank == 0 else 1)
    for vid in reversed(range(h.la.grid)):
        h.run(ws, args, vid)
    h.check(outs, co)


@pytest.mark.parametrize("name,mix,dtype,warps", WINDOW_CASES)
def test_window_stops_at_the_latest_state(name, mix, dtype, warps):
    """Shuffled order over a scratch where a few chunks published their state: each window stops at
    the latest state in it and composes only the aggregates after it."""
    h = _window(name, mix, dtype, warps)
    rng = random.Random(zlib.crc32(name.encode()) + warps)
    args, outs, co, ws = h.la.prepare(*h.la.inputs(h.p))
    for tile in range(h.tiles):
        for rank in range(NSEG_W):
            h.seed(ws, tile * NSEG_W + rank, 2 if rank == 0 else (2 if rng.random() < 0.04 else 1))
    order = list(range(h.la.grid))
    rng.shuffle(order)
    for vid in order:
        h.run(ws, args, vid)
    h.check(outs, co)


def test_window_waits_on_unpublished_chunks():
    """The last chunk's window waits while chunks two windows back and in its own window published
    nothing, then composes them once another thread publishes them one by one."""
    h = _window("gae", "term+trunc+mask", torch.float32, 1)
    args, outs, _, ws = h.la.prepare(*h.la.inputs(h.p))
    tile, rank = 1, NSEG_W - 1
    gap = (40, 20, 3)  # nothing published at first
    for t in range(h.tiles):
        for r in range(NSEG_W):
            if (t, r) != (tile, rank) and not (t == tile and r in gap):
                h.seed(ws, t * NSEG_W + r, 2 if r == 0 else 1)

    def publisher():
        while h.flag(ws, tile * NSEG_W + rank) != 1:
            time.sleep(0.01)
        time.sleep(0.5)
        for r in gap:
            h.seed(ws, tile * NSEG_W + r, 1)
            time.sleep(0.5)

    th = threading.Thread(target=publisher, daemon=True)
    th.start()
    h.run(ws, args, h.vid(tile, rank))
    th.join(timeout=60)
    assert h.flag(ws, tile * NSEG_W + rank) == 2
    lo, hi = (0, BT_W) if h.la.fam.backward else ((NSEG_W - 1) * BT_W, T_W)
    for a, b in zip(outs, h.plain):
        torch.testing.assert_close(a[tile, lo:hi], b[tile, lo:hi], rtol=1e-6, atol=1e-6)
