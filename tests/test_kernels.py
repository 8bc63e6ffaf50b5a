"""The fused Triton kernels against the float64 reference.

On a CPU machine these run under Triton's interpreter (``TRITON_INTERPRET=1``, set in conftest.py)
at small odd shapes, with the chunk length forced down so that rows span several chunks; on a CUDA
machine they run compiled, at full size. Outputs are pre-filled with NaN, so an element the kernel
does not write fails. Strategies are forced with :func:`rollbuf.kernels.forced`.
"""

from __future__ import annotations

import contextlib
import os
import zlib

import attrs
import pytest
import torch

import rollbuf.kernels as K
import rollbuf.kernels.host as H
from rollbuf import cache
from rollbuf import functional as F
from rollbuf.problem import Family

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
NAN = float("nan")


# By default a covering slice of each test's parametrisation runs (every value once; the core
# matrices every pair of values); the other cases with -m exhaustive (tests/conftest.py)
pytestmark = pytest.mark.covering(1)

BLOCK_T = None if CUDA else 16  # several chunks per row even at T = 37


@pytest.fixture(autouse=True)
def _poison_and_chunk(request):
    with K.forced(poison=True, block_t=BLOCK_T):
        yield


@pytest.fixture(params=[(False, False, False), (False, True, False), (True, False, False), (True, True, False),
                        (True, False, True), (True, True, True), (True, False, 2), (True, True, 2)],
                ids=["walk-gather", "walk-reload", "split-gather", "split-reload", "presolve-gather",
                     "presolve-reload", "resolving-gather", "resolving-reload"])
def split(request):
    """Rows walked in chunks by one program, or split across programs (one pass chained by the
    decoupled look-back; three passes with the chunk carries resolved in between, two chunks per
    block of the middle pass so that it loops; or two, the outputs' pass composing the aggregates
    before its chunk itself, in blocks of two 16-step chunks so that it loops); the exclusive state
    from an in-register shift, or from re-loading the neighbouring step. (Rows of one chunk take the
    loop-free pass.)"""
    sp, sl, pre = request.param
    with K.forced(split=sp, shift_load=sl, presolve=pre, resolve_block_r=2 if pre is True else None):
        yield request.param[:2]


def make(N, T, mix, *, dtype=torch.float32, seed=0, device=DEV, flag_dtype=torch.bool):
    """A random rollout with the boundaries of ``mix``; every slot that must not be read holds NaN."""
    g = torch.Generator().manual_seed(seed)

    def randn(scale=1.0):
        return (torch.randn(N, T, generator=g, dtype=torch.float64) * scale)

    def flags(p):
        return torch.rand(N, T, generator=g) < p

    k = flags(0.1) if "term" in mix else None
    tr = flags(0.1) if "trunc" in mix else None
    m = flags(0.7) if "mask" in mix else None
    r, v, q = randn(), randn(), randn()
    lp = randn(0.5)
    tlp = lp + randn(0.3)
    bv = randn()
    live = torch.ones(N, T, dtype=torch.bool) if m is None else m
    idx = torch.arange(T)
    last = torch.where(live, idx, -1).amax(-1) if T else torch.zeros(N, dtype=torch.long)
    read = (idx == last.unsqueeze(-1)) & live
    if tr is not None:
        read |= tr & live & (torch.zeros_like(tr) if k is None else ~k)
    bv = torch.where(read, bv, NAN)
    if m is not None:  # garbage where masked: NaN data, random flags
        r, v, q, lp, tlp = (torch.where(m, x, NAN) for x in (r, v, q, lp, tlp))

    def cast(x):
        return x.to(dtype).to(device)

    def flag(x):
        return None if x is None else x.to(flag_dtype).to(device)

    return dict(rewards=cast(r), values=cast(v), terminated=flag(k), truncated=flag(tr),
                bootstrap_values=cast(bv), mask=None if m is None else m.to(device),
                log_probs=cast(lp), target_log_probs=cast(tlp), q_values=cast(q))


def call(name, f, backend, **kw):
    """One estimator on the fields ``f``; a tuple of output tensors (and the carry if asked)."""
    if kw.pop("return_carry", False):
        res, carry = _call(name, f, backend, return_carry=True, **kw)
        return (tuple(res) if isinstance(res, tuple) else (res,)), carry
    res = _call(name, f, backend, **kw)
    return tuple(res) if isinstance(res, tuple) else (res,)


def _call(name, f, backend, **kw):
    base = {k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")}
    if name == "gae":
        return F.gae(0.97, 0.9, **base, backend=backend, **kw)
    if name == "lambda_returns":
        return F.lambda_returns(0.97, 0.8, **base, backend=backend, **kw)
    if name == "discounted_returns":
        return F.discounted_returns(0.95, **base, backend=backend, **kw)
    if name == "monte_carlo":
        mc = {k: base[k] for k in ("rewards", "terminated", "truncated", "mask")}
        return F.discounted_returns(0.95, bootstrap=False, **mc, backend=backend, **kw)
    if name == "vtrace":
        return F.vtrace(f["target_log_probs"], 0.97, 1.0, 0.9, 1.2, 0.95, log_probs=f["log_probs"],
                        **base, backend=backend, **kw)
    if name == "retrace":
        return F.retrace(f["q_values"], f["target_log_probs"], 0.97, 0.9, 1.1, log_probs=f["log_probs"],
                         **base, backend=backend, **kw)
    flags = {k: base[k] for k in ("terminated", "truncated", "mask")}
    if all(v is None for v in flags.values()):
        flags["terminated"] = torch.zeros_like(f["rewards"], dtype=torch.bool)
    if name == "eligibility_traces":
        return F.eligibility_traces(f["rewards"], 0.97, 0.9, **flags, backend=backend, **kw)
    assert name == "episodic_sums"
    return F.episodic_sums(rewards=f["rewards"], **flags, backend=backend, **kw)


ESTIMATORS = ["gae", "lambda_returns", "discounted_returns", "monte_carlo", "vtrace", "retrace",
              "eligibility_traces", "episodic_sums"]
MIXES = ["none", "term", "term+trunc", "mask", "term+trunc+mask"]
SHAPES = [(3, 1), (2, 13), (2, 37), (2, 65)] if not CUDA else [(3, 1), (64, 1000), (4, 4097)]  # 13: one chunk


def time_major(f):
    """The fields of ``f`` as ``[N, T]`` views of ``[T, N]`` buffers (as CleanRL and SB3 hold them)."""
    return {k: (None if v is None else v.mT.contiguous().mT) for k, v in f.items()}


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    assert a.shape == b.shape, (a.shape, b.shape)
    assert not torch.isnan(a).any(), "NaN in the kernel's output (an element not written, or a leak)"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def assert_ref(outs, ref, tol):
    for o, e in zip(outs, ref):
        err = rel_err(o, e)
        assert err < tol, f"relative L2 error {err:.3g} >= {tol}"


@pytest.mark.covering
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s[0]}-T{s[1]}")
@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("name", ESTIMATORS)
def test_matches_reference(name, mix, shape, split):
    f = make(*shape, mix, seed=zlib.crc32(f"{name}-{mix}-{shape}".encode()))
    assert_ref(call(name, f, "triton"), call(name, f, "reference"), 1e-5)


@pytest.mark.parametrize("T", [5, 7, 8])
@pytest.mark.parametrize("mix", ["term", "term+trunc"])
@pytest.mark.parametrize("name", ["eligibility_traces", "episodic_sums", "gae"])
def test_rows_of_five_to_eight_steps(name, mix, T, monkeypatch):
    """Rows of 5-8 steps in the table's tiles: a forward scan in tiles of 64 rows, a backward one in
    tiles of 32 (the warps are the GPU's concern: test_kernel_launch); the last tile partly past the
    rows (off the GPU the table is told of one SM, so that 257 rows fill it); against the reference."""
    N = 257 if not CUDA else 40001
    monkeypatch.setattr(H, "CPU_SMS", 1)
    cache.PLANS.clear()
    f = make(N, T, mix, seed=zlib.crc32(f"short-{name}-{mix}-{T}".encode()))
    try:
        with K.forced(block_t=None), _launches() as seen:  # the table's chunk (this file forces 16 off the GPU)
            got = call(name, f, "triton")
    finally:
        cache.PLANS.clear()
    forward = name != "gae"
    assert seen and all((la.strategy.block_n, la.strategy.block_t) == ((64, 8) if forward else (32, 8))
                        for la in seen), [la.strategy for la in seen]
    assert_ref(got, call(name, f, "reference"), 1e-5)


FLIP_PASSES = {"one-chunk": dict(block_t=64), "one-chunk-reload": dict(block_t=64, shift_load=True),
               "walk-gather": dict(block_t=16, split=False, shift_load=False),
               "walk-reload": dict(block_t=16, split=False, shift_load=True),
               "lookback-gather": dict(block_t=16, split=True, shift_load=False),
               "lookback-reload": dict(block_t=16, split=True, shift_load=True),
               "presolve-gather": dict(block_t=16, split=True, shift_load=False, presolve=True, resolve_block_r=2),
               "presolve-reload": dict(block_t=16, split=True, shift_load=True, presolve=True, resolve_block_r=2),
               "resolving-gather": dict(block_t=16, split=True, shift_load=False, presolve=2),
               "resolving-reload": dict(block_t=16, split=True, shift_load=True, presolve=2)}


@pytest.mark.parametrize("order", ["flip", "quads"])
@pytest.mark.parametrize("layout", ["env", "time"])
@pytest.mark.parametrize("pass_", list(FLIP_PASSES))
@pytest.mark.parametrize("mix", ["none", "term+trunc", "term+trunc+mask"])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_lane_orders_match_reference(name, mix, pass_, layout, order):
    """Backward scans with each chunk held in reverse (``flip``: lane j at the chunk's step
    BLOCK_T−1−j, the scan in lane order) or in quads (``quads``: 4 steps a quad, the latest quad
    first, scanned without Triton's reverse scan) in every pass, env- and time-major, against the
    reference; the forward estimators ignore the choice (their strategy says so)."""
    T = 37 if pass_.startswith("one-chunk") or not CUDA else 1000
    f = make(3, T, mix, seed=zlib.crc32(f"flip-{name}-{mix}".encode()))
    if layout == "time":
        f = time_major(f)
    with K.forced(**{order: True}, **FLIP_PASSES[pass_]), _launches() as seen:
        got = call(name, f, "triton")
    forward = name in ("eligibility_traces", "episodic_sums")
    assert seen and all(getattr(la.strategy, order) is not forward for la in seen), [la.strategy for la in seen]
    want = FLIP_PASSES[pass_]
    if "split" in want and T > 16:  # the pass asked for ran (a row of one chunk is never split)
        assert all(la.strategy.split is want["split"] and la.strategy.presolve == want.get("presolve", False)
                   for la in seen), [la.strategy for la in seen]
    assert_ref(got, call(name, f, "reference"), 1e-5)


@pytest.mark.parametrize("warps", [1, 2])
@pytest.mark.parametrize("order", ["lanes", "quads"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("mix", ["none", "term+trunc", "term+trunc+mask"])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_lookback_window(name, mix, dtype, order, warps):
    """The look-back that reads the words of a window of chunks at once (``poll``: one chunk a thread,
    32 per warp; on the GPU by plain acquire loads, under the interpreter by atomic reads) in every
    estimator, mix, dtype and lane order, against the reference, the outputs NaN-filled before the
    launch. Under the interpreter the programs run in index order, so each window finds the state of
    the chunk just before its own: the window's composing, moving back and waiting are driven by
    tests/test_lookback_order.py (programs one by one); on the GPU, 188 chunks a row race."""
    T = 601 if not CUDA else 3001  # 38 and 188 chunks of 16 steps: windows of 32 and 64 chunks
    f = make(2, T, mix, dtype=getattr(torch, dtype), seed=zlib.crc32(f"window-{name}-{mix}-{dtype}".encode()))
    with K.forced(block_t=16, split=True, presolve=False, poll=True, num_warps=warps, quads=order == "quads",
                  poison=True), _launches() as seen:
        got = call(name, f, "triton")
    assert seen and all(la.strategy.split and la.strategy.poll == 32 * warps for la in seen), \
        [la.strategy for la in seen]
    tol = 1e-12 if dtype == "float64" else 2e-2 if dtype == "bfloat16" else 1e-5
    assert_ref(got, call(name, f, "reference"), tol)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_lookback_window_of_one_warp(name):
    """The window of one warp's 32 words in a program of 4 warps (``poll=32``: on the GPU the words
    replicated over the warps, the reductions within one), every estimator with a mask, against the
    reference, the outputs NaN-filled."""
    T = 601 if not CUDA else 3001
    f = make(2, T, "term+trunc+mask", seed=zlib.crc32(f"warp-window-{name}".encode()))
    with K.forced(block_t=16, split=True, presolve=False, poll=32, num_warps=4, poison=True), _launches() as seen:
        got = call(name, f, "triton")
    assert seen and all(la.strategy.split and la.strategy.poll == 32 and la.strategy.num_warps == 4 for la in seen), \
        [la.strategy for la in seen]
    assert_ref(got, call(name, f, "reference"), 1e-5)


@pytest.mark.parametrize("force", [dict(block_t=1024), dict(block_t=256, split=True),
                                   dict(block_t=256, split=True, presolve=True)],
                         ids=["one-chunk", "lookback", "presolve"])
@pytest.mark.parametrize("order", ["lanes", "flip", "quads"])
def test_vtrace_read_back_in_either_lane_order(order, force):
    """V-trace without a mask over chunks longer than 128 steps reads its own targets back for
    ``vs_{t+1}``: within the chunk, and past its edge from the carry, in either lane order (in quads
    it does not: the scan gives ``u_{t+1}``)."""
    f = make(2, 601, "term+trunc", seed=5)
    with K.forced(flip=order == "flip", quads=order == "quads", **force):
        got = call("vtrace", f, "triton")
    assert_ref(got, call("vtrace", f, "reference"), 1e-5)


@pytest.mark.parametrize("name,T", [("vtrace", 1030), ("vtrace", 2100), ("advantages", 2100), ("gae", 2100),
                                    ("discounted_returns", 2100), ("eligibility_traces", 2100),
                                    ("episodic_sums", 2100), ("retrace", 1030)])
@pytest.mark.parametrize("mix", ["term+trunc", "term+trunc+mask"])
def test_rows_held_whole(name, T, mix):
    """Rows of 1024-4096 steps (V-trace), 2049-4096 (the TD(λ) family where the table would split
    them, one output or GAE's two; the traces) or 1025-2048 (Retrace, with 16 warps), without a mask:
    one program holds a row whole in one chunk (its row's ``whole_rows``); with a mask,
    the table's chunks. NaN-poisoned outputs, against the reference."""
    f = make(3, T, mix, seed=zlib.crc32(f"whole-{name}-{T}-{mix}".encode()))
    with K.forced(block_t=None), _launches() as seen:
        if name == "advantages":
            base = {k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")}
            got = (F.advantages(0.97, 0.9, **base, backend="triton"),)
        else:
            got = call(name, f, "triton")
    st = seen[-1].strategy
    held = (st.block_n, st.block_t, st.split, st.num_seg) == (1, 1 << (T - 1).bit_length(), False, 1)
    if name == "retrace":  # the table's own program (one row, one 2048-step chunk), with 16 warps
        assert held and st.num_warps == (8 if "mask" in mix else 16), st
    elif "mask" in mix:
        assert not held and st.block_t <= 2048, st
    else:
        assert held, st
        assert st.num_warps == (8 if name in ("eligibility_traces", "episodic_sums") or T <= 1024 else 16), st
    want = call("gae", f, "reference")[:1] if name == "advantages" else call(name, f, "reference")
    assert_ref(got, want, 1e-5)


def test_rows_held_whole_only_where_measured():
    """The rule's edges, on the table itself: TD(λ) rows held whole only where the table would split
    them (few rows), not time-major rows, not past 4096 steps, not when a tiling choice is forced."""
    rule = {family: row.whole_rows for family, row in K.FAMILIES.items()}
    lam, vt = rule[Family.TD_LAMBDA], rule[Family.VTRACE]
    held = H.strategy(128, 4096, True, max_chunk=None, whole_rows=lam)
    assert (held.block_n, held.block_t, held.split, held.num_warps) == (1, 4096, False, 16)
    many = H.strategy(4096, 4096, True, whole_rows=lam)  # walked by the table: kept
    assert (many.block_t, many.split) == (H.WALK_CHUNK, False)
    assert H.strategy(128, 2048, True, whole_rows=lam).num_warps == H.strategy(128, 2048, True).num_warps
    assert H.strategy(128, 2048, False, whole_rows=vt) == H.strategy(128, 2048, False)  # time-major
    assert H.strategy(128, 8192, True, max_chunk=1024, whole_rows=vt).block_t == 1024
    assert H.strategy(128, 1000, True, max_chunk=1024, whole_rows=vt).block_t == 1024  # below 1024: the table
    for forced in ({"block_t": 512}, {"split": True}, {"block_n": 2}, {"presolve": True}):
        st = H.strategy(128, 4096, True, whole_rows=lam, **forced)
        assert st.block_t != 4096, (forced, st)
    # Retrace: the table's program for rows of 1025-2048 steps, with 16 warps; not at 1024 steps or
    # fewer, not for walked or split rows, not time-major
    rt = rule[Family.RETRACE]
    for R, T in ((2048, 2048), (512, 2048), (8192, 2048), (128, 1025)):
        table, st = H.strategy(R, T, True), H.strategy(R, T, True, whole_rows=rt)
        assert attrs.evolve(table, num_warps=16) == st and table.num_warps == 8, (R, T, table, st)
    for R, T, tc in ((2048, 1024, True), (8192, 4096, True), (128, 4096, True), (2048, 2048, False)):
        assert H.strategy(R, T, tc, whole_rows=rt) == H.strategy(R, T, tc), (R, T, tc)


def test_flip_rule_edges():
    """Chunks are flipped by default only for one row per program in one chunk of a length the family
    lists (512 steps for TD(λ) and V-trace, where it was timed to win); not for tiles of several rows,
    walked, split or held-whole rows, time-major rows, other lengths, or when forced off."""
    c = K.FAMILIES[Family.TD_LAMBDA].flip_chunks
    lam_rows = K.FAMILIES[Family.TD_LAMBDA].whole_rows
    assert c == (512,) and K.FAMILIES[Family.VTRACE].flip_chunks == (512,)
    assert not K.FAMILIES[Family.RETRACE].flip_chunks
    assert H.strategy(128, 512, True, flip_chunks=c).flip and H.strategy(2048, 300, True, flip_chunks=c).flip
    for st in (H.strategy(128, 512, True), H.strategy(4096, 128, True, flip_chunks=c),
               H.strategy(128, 1024, True, flip_chunks=c), H.strategy(128, 4096, True, flip_chunks=c),
               H.strategy(8192, 2048, True, flip_chunks=c), H.strategy(128, 512, False, flip_chunks=c),
               H.strategy(128, 512, True, flip=False, flip_chunks=c), H.strategy(1, 1 << 20, True, flip_chunks=c),
               H.strategy(128, 4096, True, whole_rows=lam_rows, flip_chunks=c)):
        assert not st.flip, st
    assert H.strategy(4096, 128, True, flip=True).flip


@pytest.mark.parametrize("name,mix,dtype,flipped", [
    ("gae", "term", torch.float32, True), ("vtrace", "none", torch.float32, True),
    ("gae", "term+trunc", torch.float32, False), ("gae", "mask", torch.float32, False),
    ("vtrace", "term+trunc+mask", torch.float32, False), ("retrace", "term", torch.float32, False),
    ("gae", "term", torch.bfloat16, False), ("gae", "term", torch.float64, False),
    ("eligibility_traces", "term", torch.float32, False)])
def test_calls_flip_by_the_rule(name, mix, dtype, flipped):
    """A call takes the rule (TD(λ) and V-trace, fp32, without truncations or a mask, rows of
    257-512 steps one per program), and matches the reference either way; forced, every backward
    call flips and still matches."""
    f = make(2, 500, mix, seed=9, dtype=dtype)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    want = call(name, f, "reference")
    with K.forced(block_t=None), _launches() as seen:
        got = call(name, f, "triton")
    assert seen and all(la.strategy.flip is flipped for la in seen), [la.strategy for la in seen]
    assert_ref(got, want, tol)
    with K.forced(block_t=None, flip=True), _launches() as seen:
        got = call(name, f, "triton")
    assert all(la.strategy.flip is (name != "eligibility_traces") for la in seen)
    assert_ref(got, want, tol)


def test_bf16_inputs_with_fp32_outputs_are_not_flipped():
    """The rule looks at every floating input's dtype too: bf16 rewards and values written out in
    fp32, or fp32 fields with bf16 window-end values, were never timed flipped."""
    f = make(2, 500, "term", seed=9, dtype=torch.bfloat16)
    with K.forced(block_t=None), _launches() as seen:
        got = call("gae", f, "triton", out_dtype=torch.float32)
    assert seen and not any(la.strategy.flip for la in seen) and got[0].dtype == torch.float32
    assert_ref(got, call("gae", f, "reference"), 2e-2)
    f = make(2, 500, "term", seed=9)  # fp32, but bf16 window-end values
    f["bootstrap_values"] = f["bootstrap_values"].to(torch.bfloat16)
    with K.forced(block_t=None), _launches() as seen:
        got = call("gae", f, "triton")
    assert seen and not any(la.strategy.flip for la in seen) and got[0].dtype == torch.float32
    assert_ref(got, call("gae", f, "reference"), 1e-5)


@pytest.mark.covering
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.bfloat16, 2e-2), (torch.float16, 5e-3)],
                         ids=["fp64", "bf16", "fp16"])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_dtypes(name, dtype, tol):
    f = make(2, 45, "term+trunc+mask", dtype=dtype, seed=7)
    outs = call(name, f, "triton")
    per_step = outs[:1] if name in ("eligibility_traces", "episodic_sums") else outs
    assert all(o.dtype == dtype for o in per_step)
    if len(per_step) < len(outs):  # `final` is a carry: kept in the accumulation dtype
        assert outs[1].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    ref = call(name, f, "reference")  # the same rounded inputs, computed in float64
    assert_ref(outs, ref, tol)


@pytest.mark.covering
@pytest.mark.parametrize("flag_dtype", [torch.uint8, torch.float32], ids=["uint8", "float"])
@pytest.mark.parametrize("name", ["gae", "vtrace", "episodic_sums"])
def test_flag_dtypes(name, flag_dtype):
    f = make(2, 33, "term+trunc", flag_dtype=flag_dtype, seed=3)
    assert_ref(call(name, f, "triton"), call(name, f, "reference"), 1e-5)


@pytest.mark.parametrize("block_n", [None, 4])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_time_major_views_are_read_in_place(name, split, block_n):
    """CleanRL/SB3 buffers are [T, N]; their transposed views go in without a copy, and the outputs
    come back time-major too ([T, N] buffers seen as [N, T]), in every strategy, with row tiles."""
    f = make(5, 29, "term+trunc+mask", seed=11)
    tm = time_major(f)  # [N, T] views of [T, N]
    assert not tm["rewards"].is_contiguous()
    with K.forced(block_n=block_n), _launches() as seen:
        got = call(name, tm, "triton")
    assert seen and all(la.conv == () and (la.s_n, la.s_t) == (1, 5) for la in seen), [la.conv for la in seen]
    assert_ref(got, call(name, f, "reference"), 1e-5)
    for o in got:
        if o.dim() == 2 and o.shape[1] == 29:
            assert o.stride() == (1, 5), (name, o.stride())


@pytest.mark.parametrize("T", [37, 300])
@pytest.mark.parametrize("name", ["gae", "vtrace", "retrace", "eligibility_traces"])
def test_time_major_default_strategy(name, T):
    """The time-major strategy table itself (no override): 16 x T tiles up to 128 steps, 32-row x
    128-step tiles split across programs beyond."""
    st = K.strategy(5, T, False)
    assert st.split == (T > 128) and st.block_n == (32 if T > 128 else 16)
    f = make(5, T, "term+trunc+mask", seed=T)
    tm = time_major(f)
    with K.forced(block_t=None):
        got = call(name, tm, "triton")
    assert_ref(got, call(name, f, "reference"), 1e-5)


def test_split_rows_pass_choice():
    """The strategy table's choice for rows split across programs (no override): a single row in
    three passes, several rows chained by the look-back; ``PRESOLVE`` forces either."""
    assert K.strategy(1, 1 << 20).split and K.strategy(1, 1 << 20).presolve
    assert K.strategy(2, 1 << 20).split and not K.strategy(2, 1 << 20).presolve
    assert not K.strategy(1, 1 << 20, presolve=False).presolve
    assert K.strategy(64, 1 << 20, presolve=True).presolve
    assert not K.strategy(4096, 128).split and not K.strategy(4096, 128).presolve


@pytest.mark.parametrize("R", [1, 3])
@pytest.mark.parametrize("name", ["vtrace", "retrace"])
def test_family_split_rows(name, R, monkeypatch):
    """A family's own program for rows split across programs (its row's ``split_rows`` and
    ``split_row``: V-trace's several rows, Retrace's several rows and one row), fp32 without a mask:
    taken by the table (several rows from ``SPLIT_ROWS_FROM``, lowered here to 3 rows) with its chunk,
    warps and look-back window, in quads, against the reference with NaN-poisoned outputs, every
    boundary but the mask; below ``SPLIT_ROWS_FROM`` rows, with a mask, bf16 inputs or a forced tiling,
    lane order or quads, the table's program."""
    row = K.FAMILIES[Family.VTRACE if name == "vtrace" else Family.RETRACE]
    own = row.split_row if R == 1 else row.split_rows
    T = 4133  # past V-trace's rows held whole (4096): 5 chunks of 1024 steps, the last of 37
    f = make(R, T, "term+trunc", seed=zlib.crc32(f"family-split-{name}-{R}".encode()))
    table = H.strategy(R, T, True, long_rows=row.long_rows, max_chunk=row.max_chunk)
    if R > 1:  # fewer rows than SPLIT_ROWS_FROM: the table's
        cache.clear()
        with K.forced(block_t=None), _launches() as seen:
            call(name, f, "triton")
        assert (seen[-1].strategy.block_t, seen[-1].strategy.poll) == (table.block_t, 0), seen[-1].strategy
        monkeypatch.setattr(H, "SPLIT_ROWS_FROM", R)
    cache.clear()
    with K.forced(block_t=None), _launches() as seen:
        got = call(name, f, "triton")
    st = seen[-1].strategy
    if own is None:  # V-trace's one row: the three passes
        assert st.split and st.presolve and not st.poll, st
    else:
        assert (st.block_n, st.block_t, st.split, st.num_seg, st.num_warps, st.presolve, st.poll) == (
            1, own.chunk, True, 5, own.warps, False, own.window), st
        assert st.quads and not st.shift_load, st  # as timed
    assert_ref(got, call(name, f, "reference"), 1e-5)
    masked = make(R, T, "term+trunc+mask", seed=1)
    half = {k: v.to(torch.bfloat16) if v is not None and v.is_floating_point() else v for k, v in f.items()}
    for fields, force in ((masked, {}), (half, {}), (f, {"num_warps": 2}), (f, {"poll": False}),
                          (f, {"quads": False}), (f, {"quads": True})):
        with K.forced(block_t=None, **force), _launches() as seen:
            call(name, fields, "triton")
        st = seen[-1].strategy
        assert (st.block_t, st.poll, st.presolve) == (table.block_t, 0, table.presolve), (force, st)
        assert st.num_warps == force.get("num_warps", table.num_warps), (force, st)


@pytest.mark.parametrize("name", ["gae", "advantages", "lambda_returns", "discounted_returns"])
def test_td_lambda_split_row(name, monkeypatch):
    """The TD(λ) family's one split row (its row's ``split_row``), fp32 without a mask, for calls writing
    advantages only: GAE and the advantages take the look-back in 2048-step chunks of 8 warps with a
    window of 256 words, in lane order, in place of the three passes; the returns alone keep the three
    passes; so do a mask, bf16 inputs and a forced tiling. Outputs NaN-poisoned, against the reference,
    every boundary but the mask."""
    row = K.FAMILIES[Family.TD_LAMBDA]
    T = 4133  # 3 chunks of 2048 steps, the last of 37
    f = make(1, T, "term+trunc", seed=zlib.crc32(f"td-split-row-{name}".encode()))
    table = H.strategy(1, T, True, long_rows=row.long_rows, max_chunk=row.max_chunk)
    assert table.split and table.presolve

    def run(fields, **force):
        cache.clear()
        with K.forced(block_t=None, poison=True, **force), _launches() as seen:
            if name == "advantages":
                base = {k: fields[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values",
                                               "mask")}
                got = (F.advantages(0.97, 0.9, **base, backend="triton"),)
            else:
                got = call(name, fields, "triton")
        return got, seen[-1].strategy

    got, st = run(f)
    if name in ("gae", "advantages"):
        own = row.split_row
        assert (st.block_n, st.block_t, st.split, st.num_seg, st.num_warps, st.presolve, st.poll) == (
            1, own.chunk, True, 3, own.warps, False, own.window), st
        assert not st.quads and not st.flip and st.shift_load, st  # lane order, as timed
    else:
        assert st.split and st.presolve and not st.poll, st
    want = (call("gae", f, "reference")[0],) if name == "advantages" else call(name, f, "reference")
    assert_ref(got, want, 1e-5)
    masked = make(1, T, "term+trunc+mask", seed=1)
    half = {k: v.to(torch.bfloat16) if v is not None and v.is_floating_point() else v for k, v in f.items()}
    for fields, force in ((masked, {}), (half, {}), (f, {"num_warps": 4}), (f, {"poll": False}),
                          (f, {"quads": False})):
        _, st = run(fields, **force)
        assert (st.block_t, st.poll, st.presolve) == (table.block_t, 0, table.presolve), (force, st)
    # a row whose bytes fall between L2 / L2_LOW_DIV and L2_HIGH_MUL · L2 keeps the three passes
    monkeypatch.setattr(H, "device_l2", lambda device: T * 14)  # GAE moves 18 bytes a step, the advantages 14
    got, st = run(f)
    assert st.split and st.presolve and not st.poll, st
    assert_ref(got, want, 1e-5)


def test_split_row_not_where_the_row_sits_in_l2():
    """``split_rule``'s one-row entry: taken for rows of fewer than L2 / L2_LOW_DIV bytes or more than
    L2_HIGH_MUL · L2, not between (the three passes' second read from L2); several rows ignore it."""
    st = H.strategy(1, 1 << 20)
    assert st.split and st.presolve
    own = (None, K.FAMILIES[Family.RETRACE].split_row)
    l2 = 50 << 20
    for row_bytes, taken in ((l2 // 8 - 1, True), (l2 // 8, False), (l2, False), (2 * l2, False),
                             (2 * l2 + 1, True), (1 << 40, True)):
        got = H.split_rule(st, 1, 1 << 20, True, own, None, row_bytes, l2)
        assert (got.poll == own[1].window and not got.presolve) is taken, (row_bytes, got)
        assert (got == st) is not taken, (row_bytes, got)
    several = H.strategy(64, 1 << 18)
    assert H.split_rule(several, 64, 1 << 18, True, own, None, 1 << 40, l2) == several
    both = (K.FAMILIES[Family.RETRACE].split_rows, own[1])  # several rows: their entry whatever the bytes
    for row_bytes in (0, l2 // 8, l2, 1 << 40):
        got = H.split_rule(several, 64, 1 << 18, True, both, None, row_bytes, l2)
        assert (got.block_t, got.num_warps, got.poll) == (both[0].chunk, both[0].warps, both[0].window), got


@pytest.mark.parametrize("name", ["gae", "vtrace", "retrace", "eligibility_traces", "episodic_sums"])
def test_single_row_default_strategy(name):
    """One long row with the shipped choice (three passes), several chunks, every boundary kind,
    against the reference, the same again (the cached launches), and close to the look-back chain."""
    T = 65573 if CUDA else 301  # 33 chunks of 2048 steps / 19 of the interpreter's 16
    f = make(1, T, "term+trunc+mask", seed=zlib.crc32(f"one-row-{name}".encode()))
    assert K.strategy(1, T, True, block_t=BLOCK_T).presolve
    got = call(name, f, "triton")
    assert_ref(got, call(name, f, "reference"), 1e-5)
    for a, b in zip(got, call(name, f, "triton")):  # again: the cached launch, all three passes
        assert torch.equal(a, b)
    with K.forced(presolve=False):
        assert_ref(got, call(name, f, "triton"), 1e-6)


@contextlib.contextmanager
def _launches():
    """The :class:`rollbuf.kernels.Launch` objects run inside the block (a first call's
    ``Launch.__call__``, and on a GPU the later calls of its plan's ``Launch.run``)."""
    seen = []
    real, real_run = H.Launch.__call__, H.Launch.run

    def spy(self, p):
        seen.append(self)
        return real(self, p)

    def spy_run(self, get, carry, params):
        seen.append(self)
        return real_run(self, get, carry, params)

    H.Launch.__call__, H.Launch.run = spy, spy_run
    try:
        yield seen
    finally:
        H.Launch.__call__, H.Launch.run = real, real_run


@pytest.mark.parametrize("layout", ["env", "time", "strided", "padded", "mixed"])
@pytest.mark.parametrize("name", ["gae", "vtrace", "retrace", "eligibility_traces"])
def test_stride_kinds(name, layout, split):
    """Every field of a call is read with one pair of strides: env-major (time stride 1), time-major
    (row stride 1), every other step of a wider buffer, the first steps of a longer one (all read in
    place), and a mix of layouts (the fields unlike the main one copied into its layout first); each
    against the reference."""
    f = make(5, 29, "term+trunc+mask", seed=21)

    def wide(x):  # [N, T] view of every other column of an [N, 2T] buffer: time stride 2
        buf = torch.empty(x.shape[0], 2 * x.shape[1], dtype=x.dtype, device=x.device)
        buf[:, ::2] = x
        return buf[:, ::2]

    def padded(x):  # the first T columns of an [N, T + 11] buffer
        buf = torch.empty(x.shape[0], x.shape[1] + 11, dtype=x.dtype, device=x.device)
        buf[:, :x.shape[1]] = x
        return buf[:, :x.shape[1]]

    views = {}
    for i, (key, x) in enumerate(f.items()):
        if x is None:
            views[key] = None
        elif layout == "time" or (layout == "mixed" and i % 2):
            views[key] = x.mT.contiguous().mT
        elif layout == "strided":
            views[key] = wide(x)
        elif layout == "padded":
            views[key] = padded(x)
        else:
            views[key] = x
    pair = {"env": (29, 1), "time": (1, 5), "strided": (58, 2), "padded": (40, 1), "mixed": (29, 1)}[layout]
    with _launches() as seen:
        got = call(name, views, "triton")
    assert seen and all((la.s_n, la.s_t) == pair for la in seen), [(la.s_n, la.s_t) for la in seen]
    copied = {n for la in seen for _, n, _ in la.conv}
    if layout == "mixed":  # the time-major ones, made to match the env-major rewards (x) first
        main = "x" if name == "eligibility_traces" else "rewards"
        want = {k for i, (k, x) in enumerate(f.items()) if x is not None and i % 2}
        want = {k for k in want if k in K.FAMILIES[seen[0].family].fields} - {main}
        assert copied == want, (copied, want)
    else:
        assert not copied, copied
    assert_ref(got, call(name, f, "reference"), 1e-5)


def test_output_layout_override():
    f = make(5, 29, "term+trunc", seed=12)
    tm = time_major(f)
    with K.forced(layout="env"):
        got = call("gae", tm, "triton")
    assert got[0].is_contiguous()
    assert_ref(got, call("gae", f, "reference"), 1e-5)


def test_time_major_features():
    """x stored [T, N, F] and passed as its [N, T, F] view: traces come back in that layout."""
    f = make(3, 23, "term+trunc+mask", seed=13)
    x = torch.randn(23, 3, 4, device=DEV).transpose(0, 1)
    kw = dict(terminated=f["terminated"], truncated=f["truncated"], mask=f["mask"])
    got = F.eligibility_traces(x, 0.9, 0.7, **kw, backend="triton")
    ref = F.eligibility_traces(x.contiguous(), 0.9, 0.7, **kw, backend="reference")
    assert got.traces.stride() == x.stride()
    assert_ref(got, ref, 1e-5)


@pytest.mark.parametrize("name", ["gae", "vtrace", "retrace", "eligibility_traces"])
def test_out_dtype(name):
    f = make(2, 21, "term+trunc", seed=5)
    outs = call(name, f, "triton", out_dtype=torch.float64)
    assert outs[0].dtype == torch.float64
    if name != "eligibility_traces":  # `final` is a carry: float32 accumulation dtype
        assert all(o.dtype == torch.float64 for o in outs)
    assert_ref(outs, call(name, f, "reference"), 1e-5)


def test_trailing_feature_dims():
    f = make(2, 23, "term+trunc+mask", seed=9)
    x = torch.randn(2, 23, 3, 2, device=DEV)
    kw = dict(terminated=f["terminated"], truncated=f["truncated"], mask=f["mask"])
    init = torch.randn(2, 3, 2, device=DEV)
    got = F.eligibility_traces(x, 0.9, 0.7, init, **kw, backend="triton")
    ref = F.eligibility_traces(x, 0.9, 0.7, init, **kw, backend="reference")
    assert got.traces.shape == (2, 23, 3, 2) and got.final.shape == (2, 3, 2)
    assert_ref(got, ref, 1e-5)


@pytest.mark.parametrize("cut", [1, 16, 17, 30])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_chained_windows_equal_the_unsplit_row(name, cut, split):
    """Later window first (return_carry=True), then the earlier one with carry= (backward);
    forward estimators pass `final` on as `initial`."""
    f = make(3, 41, "term+trunc+mask", seed=cut)
    whole = call(name, f, "reference")

    def part(sl):
        return {k: (None if v is None else v[:, sl]) for k, v in f.items()}

    a, b = part(slice(0, cut)), part(slice(cut, None))
    if name in ("eligibility_traces", "episodic_sums"):
        first = call(name, a, "triton")
        second = call(name, b, "triton", initial=first[1]) if name == "episodic_sums" else None
        if name == "eligibility_traces":
            flags = {k: b[k] for k in ("terminated", "truncated", "mask")}
            second = tuple(F.eligibility_traces(b["rewards"], 0.97, 0.9, first[1], **flags, backend="triton"))
        assert_ref((torch.cat([first[0], second[0]], 1), second[1]), whole, 1e-5)
        return
    later, carry = call(name, b, "triton", return_carry=True)
    # the earlier window's end is not a boundary: only its truncated steps read bootstrap values
    keep = a["truncated"] & ~a["terminated"] & a["mask"]
    a["bootstrap_values"] = torch.where(keep, a["bootstrap_values"], NAN)
    earlier = call(name, a, "triton", carry=carry)
    joined = tuple(torch.cat([x, y], 1) for x, y in zip(earlier, later))
    assert_ref(joined, whole, 1e-5)


@pytest.mark.parametrize("T", [1, 2, 63, 64, 65, 127, 128, 129, 4097] + ([131072] if CUDA else []))
@pytest.mark.parametrize("reverse,order", [(True, None), (True, "flip"), (True, "quads"), (False, None)],
                         ids=["backward", "backward-flipped", "backward-quads", "forward"])
def test_affine_scan_is_exact_near_powers_of_two(T, reverse, order, split):
    """β far from 0 and 1 so that a misordered (non-commutative) combine shows up; backward also
    with each chunk held in reverse, and in quads."""
    g = torch.Generator().manual_seed(T)
    a = torch.randn(2, T, generator=g, dtype=torch.float64).to(DEV)
    b = (0.4 + 0.6 * torch.rand(2, T, generator=g, dtype=torch.float64)).to(DEV)
    init = torch.randn(2, generator=g, dtype=torch.float64).to(DEV)
    # the kernel's own chunk length: whole rows in one scan up to 1024
    with K.forced(block_t=None, flip=order == "flip", quads=order == "quads"), _launches() as seen:
        got = F.affine_scan(a, b, reverse, init, backend="triton")
    assert all(la.strategy.quads is (order == "quads" and la.strategy.block_t >= 4) for la in seen), seen
    ref = F.affine_scan(a.cpu(), b.cpu(), reverse, init.cpu(), backend="reference")
    assert rel_err(got, ref) < 1e-12


@pytest.mark.parametrize("order", ["flip", "quads"])
@pytest.mark.parametrize("pass_", list(FLIP_PASSES))
@pytest.mark.parametrize("cut", [16, 17])
@pytest.mark.parametrize("name", [n for n in ESTIMATORS if n not in ("eligibility_traces", "episodic_sums")])
def test_chained_windows_flipped(name, cut, pass_, order):
    """Chained windows (the later window's carry out, the earlier's carry in) with flipped chunks
    or chunks in quads in every pass equal the unsplit row."""
    with K.forced(**{order: True}, **FLIP_PASSES[pass_]):
        test_chained_windows_equal_the_unsplit_row(name, cut, None)


def test_empty_rollouts():
    for N, T in [(0, 5), (3, 0)]:
        f = make(N, T, "term+trunc", seed=1)
        adv, ret = call("gae", f, "triton")
        assert adv.shape == (N, T) and ret.shape == (N, T)
        traces, final = call("eligibility_traces", f, "triton")
        assert traces.shape == (N, T) and final.shape == (N,)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_full_size_rows_on_gpu(name, dtype, tol):
    """One row of 131072 steps and 8 rows of 65537, every boundary kind, the shipped strategy."""
    for shape in [(1, 131072), (8, 65537)]:
        f = make(*shape, "term+trunc+mask", dtype=dtype, seed=zlib.crc32(f"{name}-{shape}".encode()))
        assert_ref(call(name, f, "triton"), call(name, f, "reference"), tol)


@pytest.mark.gpu
def test_more_than_2_31_elements():
    """64-bit offsets: 2^31 + 2^14 elements in one call; the rows past the 2^31-th element are
    checked against the reference."""
    N, T = 2**17 + 1, 2**14
    g = torch.Generator(device="cuda").manual_seed(0)
    r = torch.randn(N, T, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(N, T, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.rand(N, T, device="cuda", generator=g) < 0.01
    bv = torch.randn(N, device="cuda", generator=g, dtype=torch.bfloat16)
    assert r.numel() > 2**31
    adv, ret = F.gae(0.99, 0.95, rewards=r, values=v, terminated=k, bootstrap_values=bv, backend="triton")
    rows = slice(N - 3, N)
    ref = F.gae(0.99, 0.95, rewards=r[rows].cpu(), values=v[rows].cpu(), terminated=k[rows].cpu(),
                bootstrap_values=bv[rows].cpu(), backend="reference")
    assert rel_err(adv[rows], ref.advantages) < 2e-2
    assert rel_err(ret[rows], ref.returns) < 2e-2


def test_launch_cache_bookkeeping(monkeypatch):
    """A launch is built once per layout and reused: another dtype or another shape is another key, so
    another plan and launch (a misaligned input is not: Triton specialises on alignment); a full cache
    starts over; forced choices are part
    of the key; every result equals the reference, and every kernel pass is launched on each call."""
    from rollbuf.kernels import host as H

    built, launched = [], []

    class Counting(H.Launch):
        def __init__(self, p, force=()):
            built.append(force)
            super().__init__(p, force)

    real_call = H.Kernel.__call__

    def counting(self, grid, args, device):
        launched.append(grid)
        return real_call(self, grid, args, device)

    monkeypatch.setattr(H, "Launch", Counting)
    monkeypatch.setattr(H.Kernel, "__call__", counting)
    f = make(3, 37, "term+trunc+mask", seed=9)
    ref = call("gae", f, "reference")
    cache.clear()

    def offset(x):  # same values, one element in: not 16-byte aligned
        y = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:].view(x.shape)
        return y.copy_(x)

    def check(fields, new, passes=1):
        b, n = len(built), len(launched)
        assert_ref(call("gae", fields, "triton"), ref, 1e-5)
        assert (len(built) - b, len(launched) - n) == (new, passes)

    check(f, 1)  # built, remembered
    check(f, 0)  # hit
    # alignment is not in the key: the plan's launch runs it (Triton specialises on alignment itself)
    check(dict(f, rewards=offset(f["rewards"])), 0)
    check(dict(f, terminated=f["terminated"].to(torch.uint8)), 1)  # dtype differs: miss
    check(f, 0)
    assert len(cache.PLANS) == 4  # two plans, and the launch each was made with
    monkeypatch.setattr(cache, "MAX", 4)
    check(dict(f, values=f["values"].double()), 1)  # a new layout past the bound: the cache starts over
    assert len(cache.PLANS) == 2
    check(f, 1)  # built anew
    monkeypatch.setattr(cache, "MAX", 4096)
    with K.forced(split=True, presolve=True):  # three passes: two family launches and the resolve kernel
        check(f, 1, 3)
        check(f, 0, 3)
        with K.forced(resolve_block_r=1):  # another launch
            check(f, 1, 3)
            check(f, 0, 3)
        with K.forced(presolve=2):  # two passes: the aggregates, the outputs resolving their carries
            check(f, 1, 2)
            check(f, 0, 2)


def test_signature_is_cheap_and_complete():
    """The launch cache's key: everything the kernel specialises on, not the scalar parameters."""
    f = make(3, 37, "term+trunc", seed=2)
    with _launches() as seen:
        call("gae", f, "triton")
        F.gae(0.5, 0.25, **{k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values")},
              backend="triton")  # other γ, λ: the same launch
        call("gae", dict(f, rewards=f["rewards"][:2], values=f["values"][:2], terminated=f["terminated"][:2],
                         truncated=f["truncated"][:2], bootstrap_values=f["bootstrap_values"][:2]), "triton")
    assert seen[0] is seen[1] and seen[2] is not seen[0]


@pytest.mark.gpu
def test_direct_launch_respecializes():
    """A cached launch is reused only for calls Triton would specialise the same way: calls of one
    shape whose inputs differ in 16-byte alignment (views at an odd element offset), dtype, strides
    (time-major) or flag dtype each give the reference result, in an order that hits the cache
    between them, and equal a freshly built launch exactly."""
    N, T = 64, 300
    base = make(N, T, "term+trunc+mask", seed=5)

    def views(kind):
        f = {}
        for key, x in base.items():
            if not isinstance(x, torch.Tensor) or x.dim() != 2:
                f[key] = x
                continue
            if kind == "offset":  # one element in: not 16-byte aligned, same strides
                y = torch.empty(N * T + 1, dtype=x.dtype, device=x.device)[1:].view(N, T)
                f[key] = y.copy_(x)
            elif kind == "time-major":
                f[key] = x.t().contiguous().t()
            elif kind == "bf16" and x.is_floating_point():
                f[key] = x.to(torch.bfloat16)
            elif kind == "uint8 flags" and x.dtype == torch.bool:
                f[key] = x.to(torch.uint8)
            else:
                f[key] = x.clone()
        return f

    kinds = ["aligned", "offset", "aligned", "time-major", "offset", "bf16", "uint8 flags", "aligned"]
    for name in ("gae", "vtrace", "retrace"):
        for kind in kinds:
            f = views(kind)
            tol = 2e-2 if kind == "bf16" else 2e-5
            got = call(name, f, "triton")
            assert_ref(got, call(name, f, "reference"), tol)
            saved = dict(cache.PLANS)
            cache.clear()
            try:
                jit = call(name, f, "triton")  # a new launch: through Triton's JIT
            finally:
                cache.clear()
                cache.PLANS.update(saved)
            for a, b in zip(got, jit):
                assert torch.equal(a, b), (name, kind)


@pytest.mark.covering
@pytest.mark.parametrize("outputs", ["gae", "returns", "adv-only"])
@pytest.mark.parametrize("mix", ["none", "term+trunc", "term+trunc+mask"])
@pytest.mark.parametrize("T", [1, 37, 70])
def test_lambda_adjoint_kernel(split, mix, T, outputs):
    """The TD(λ) family's fused backward (family ``lambda_adjoint``, forward in time) against the
    same adjoint computed in float64 torch, every strategy, with a carry-out gradient; outputs are
    NaN-poisoned, so an unwritten element fails."""
    from rollbuf.backends import autograd as AG
    from rollbuf.problem import Problem

    N = 3
    g = torch.Generator().manual_seed(zlib.crc32(f"{mix}-{T}-{outputs}".encode()))
    f = make(N, T, mix, seed=T)
    g_ret = torch.randn(N, T, generator=g, dtype=torch.float64)
    g_adv = torch.randn(N, T, generator=g, dtype=torch.float64)
    w0 = torch.randn(N, generator=g, dtype=torch.float64)
    fields = {"rewards": f["rewards"].to(DEV), "values": f["values"].to(DEV), "terminated": f["terminated"],
              "truncated": f["truncated"], "mask": f["mask"], "bootstrap_values": None}
    fields = {k: (v.to(DEV) if v is not None else None) for k, v in fields.items()}
    two = outputs != "returns"
    outs = ("advantages", "returns") if two else ("returns",)
    grads = {"gae": (g_adv, g_ret, w0), "returns": (g_ret, w0), "adv-only": (g_adv, None, w0)}[outputs]
    res = {}
    for fused, dt in ((False, torch.float64), (True, torch.float32)):
        p = Problem(family="lambda", outputs=outs, fields=fields, gamma=0.9, lam=0.8, compute_dtype=dt,
                    out_dtype=dt, want_carry=True)
        gs = tuple(None if x is None else x.to(DEV, dt) for x in grads)
        res[fused] = _adjoint(AG, p, gs, fused)
    for a, b in zip(res[False], res[True]):
        assert not torch.isnan(b).any()
        torch.testing.assert_close(b.double().cpu(), a.double().cpu(), rtol=1e-5, atol=1e-5)


def _adjoint(AG, p, gs, fused):
    """(r̄, V̄) of the TD(λ) adjoint with inputs that require grad (the function reads requires_grad)."""
    r = p.fields["rewards"].detach().requires_grad_()
    v = p.fields["values"].detach().requires_grad_()
    return AG.adjoint(p, ("rewards", "values"), (r, v), gs, fused=fused)[:2]


@pytest.mark.parametrize("name", ["gae", "lambda_returns", "discounted_returns", "vtrace", "retrace"])
def test_window_end_after_long_padding(name, split):
    """The window end of a masked row is its last unmasked step, found by the kernel reading the mask
    backward from the row's end: rows whose padding spans several chunks (16-step chunks here), a
    row with no unmasked step, a row whose last unmasked step terminated, one that ends truncated,
    and a row unmasked to the end; [N, T] and [N] bootstrap values."""
    T = 83
    f = make(5, T, "term+trunc+mask", seed=31)
    m = f["mask"].cpu().clone()  # built on the CPU, moved to the device below
    m[0, 20:] = False  # four chunks of padding after step 19
    m[1, :] = False  # nothing unmasked
    m[2, 50:] = False
    m[3, 5:] = False
    m[4, :] = True
    k, tr = f["terminated"].cpu().clone(), f["truncated"].cpu().clone()
    last = [19, None, 49, 4, T - 1]
    for n, j in enumerate(last):
        if j is not None:
            m[n, j] = True
    k[2, 49], tr[2, 49] = True, False  # the window end terminated: V(s_T) never read
    k[3, 4], tr[3, 4] = False, True  # the window end truncated: its own bootstrap value
    k[0, 19], tr[0, 19] = False, False
    k[4, T - 1], tr[4, T - 1] = False, False
    g = torch.Generator().manual_seed(5)
    for key in ("rewards", "values", "q_values", "log_probs", "target_log_probs"):  # newly unmasked steps
        x = f[key].cpu()
        f[key] = torch.where(m & torch.isnan(x), 0.3 * torch.randn(5, T, generator=g).to(x.dtype), x).to(DEV)
    bv = torch.full((5, T), NAN, dtype=f["rewards"].dtype)
    for n, j in enumerate(last):
        if j is not None and not k[n, j]:
            bv[n, j] = torch.randn((), generator=g)
    bv = torch.where(tr & m & ~k, torch.randn(5, T, generator=g).to(bv.dtype), bv)
    bv[1, T - 1] = 0.5  # a fully masked row passes V(s_T) of its last column through
    f = dict(f, mask=m.to(DEV), terminated=k.to(DEV), truncated=tr.to(DEV), bootstrap_values=bv.to(DEV))
    assert_ref(call(name, f, "triton"), call(name, f, "reference"), 1e-5)
    # [N] bootstrap values (the window end only): no interior truncation allowed with them
    f1 = dict(f, truncated=None,
              bootstrap_values=torch.tensor([1.5, 0.5, 0.0, -2.0, 0.75], dtype=bv.dtype).to(DEV))
    assert_ref(call(name, f1, "triton"), call(name, f1, "reference"), 1e-5)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_vtrace_pg_is_not_rounded_through_stored_targets(out_dtype):
    """Values of size 1000 and policy-gradient advantages of size 1, written in bf16/fp16: pg must
    carry only its own rounding, not that of the stored targets vs (of V's size), and an fp16 target
    that overflows must not turn a terminated step's pg into NaN."""
    g = torch.Generator().manual_seed(11)
    N, T = 3, 37
    v = 1000 + torch.randn(N, T, generator=g)
    r = torch.randn(N, T, generator=g)
    k = torch.zeros(N, T, dtype=torch.bool)
    k[:, 20] = True
    if out_dtype == torch.float16:
        v[0, 21] = 70000.0  # vs overflows fp16 there; pg at the terminated step 20 does not read it
    lp = torch.randn(N, T, generator=g) * 0.1
    kw = dict(log_probs=lp.to(DEV), rewards=r.to(DEV), values=v.to(DEV), terminated=k.to(DEV),
              bootstrap_values=(1000 + torch.randn(N, generator=g)).to(DEV), out_dtype=out_dtype)
    tlp = (lp + torch.randn(N, T, generator=g) * 0.1).to(DEV)
    got = F.vtrace(tlp, 0.99, **kw, backend="triton").pg_advantages.float().cpu()
    want = F.vtrace(tlp.cpu().double(), 0.99, **{k_: (x.cpu().double() if isinstance(x, torch.Tensor)
                                                     and x.is_floating_point() else x.cpu() if
                                                     isinstance(x, torch.Tensor) else None)
                                                  for k_, x in kw.items() if k_ != "out_dtype"},
                    backend="reference").pg_advantages
    assert torch.isfinite(got[:, 20]).all()
    fin = torch.isfinite(got) & torch.isfinite(want)
    assert ((got - want).abs()[fin] <= 0.02 * want.abs()[fin] + 0.02).all()


@pytest.mark.parametrize("T,force", [(200, dict(block_t=256)), (700, dict(block_t=256, split=True, presolve=False)),
                                     (700, dict(block_t=256, split=True, presolve=True, resolve_block_r=2)),
                                     (700, dict(block_t=256, split=False))],
                         ids=["one-chunk", "lookback", "three-pass", "walk"])
@pytest.mark.parametrize("mix", ["term", "term+trunc"])
def test_vtrace_reading_its_targets_back(T, force, mix):
    """V-trace without a mask in chunks longer than 128 steps reads vs_{t+1} back from its stored
    targets (except walked rows): one chunk, split rows (look-back, three passes), walked rows,
    against the reference, with a chained carry and the carry out."""
    f = make(2, T, mix, seed=T)
    f["mask"] = None
    carry = torch.randn(2, 2, dtype=torch.float64)
    kw = dict(log_probs=f["log_probs"], rewards=f["rewards"], values=f["values"], terminated=f["terminated"],
              truncated=f["truncated"], bootstrap_values=f["bootstrap_values"])
    with K.forced(**force):
        got, c = F.vtrace(f["target_log_probs"], 0.97, lam=0.9, carry=carry.to(DEV).float(), return_carry=True,
                          **kw, backend="triton")
    cpu = {k: (None if v is None else v.cpu()) for k, v in kw.items()}
    cpu = {k: (v.double() if v is not None and v.is_floating_point() else v) for k, v in cpu.items()}
    want, wc = F.vtrace(f["target_log_probs"].cpu().double(), 0.97, lam=0.9, carry=carry, return_carry=True,
                        **cpu, backend="torch")  # float64 (the reference loop takes no carry)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu().double(), b.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c.cpu().double(), wc.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gae", "lambda_returns", "discounted_returns", "vtrace", "retrace"])
@pytest.mark.parametrize("chain", ["terminal", "carry"])
def test_a_window_end_column_with_truncations_under_a_terminal_end_or_a_carry(name, chain, split):
    """A [N] bootstrap column with truncations at the window end, under window_end="terminal" or a
    carry in: the truncated last step reads the column (expanded to the call's layout), whatever
    the carry in is. Against the reference (terminal) or the torch backend (carry)."""
    from rollbuf.testing import assert_matches_reference, estimator_call, make_rollout

    f = make_rollout(5, 37, seed=12, device=DEV)
    end = torch.arange(5, device=DEV) % 2 == 0
    f["truncated"] = torch.zeros_like(f["truncated"])
    f["truncated"][:, -1] = end & ~f["terminated"][:, -1]
    f["bootstrap_values"] = torch.randn(5, device=DEV)
    prm = {"gamma": 0.97}
    if name in ("gae", "lambda_returns", "retrace"):
        prm["lam"] = 0.9
    if chain == "terminal":
        prm["window_end"] = "terminal"
        out = estimator_call(name, f, backend="triton", **prm)()
        assert_matches_reference(name, out, f, **prm)
    else:
        prm["carry"] = torch.randn((5, 2) if name == "vtrace" else (5,), device=DEV)
        out = estimator_call(name, f, backend="triton", **prm)()
        want = estimator_call(name, f, backend="torch", **prm)()
        for a, b in zip(out if isinstance(out, tuple) else (out,), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ---- feature dims that cannot merge into one stride; float64 calls with 16-bit outputs -----------
# (the triton backend against the reference, and the torch and numba backends beside it)

BACKENDS = ["triton", "torch", "numba"]


def _on(backend, x):
    """``x`` where ``backend`` runs: the numba backend takes CPU tensors only."""
    if x is None or not torch.is_tensor(x):
        return x
    return x.cpu() if backend == "numba" else x.to(DEV)


def _features(layout, N, T, seed, device):
    """A float32 ``x`` of 2 feature dims in ``layout`` on ``device``, ``[N, T, *feat]`` (``[2, N // 2,
    T, *feat]``: batch dims flattened); every one but ``time-major-merged`` has feature dims that
    cannot merge into one stride, so that a reshape to ``[N, T, F]`` is a copy. The same values for
    the same ``seed`` on every device."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):  # drawn on the CPU and viewed on the device (a strided view copied there turns dense)
        return torch.randn(*shape, generator=g, dtype=torch.float64).float().to(device)

    return {
        "transposed": lambda: r(N, T, 3, 2).transpose(-1, -2),  # [N, T, 2, 3], features column-major
        "sliced": lambda: r(N, T, 3, 5)[..., 1:4],  # [N, T, 3, 3], feature rows 5 apart
        "every-other": lambda: r(N, T, 4, 3)[:, :, ::2],  # [N, T, 2, 3], feature rows 6 apart
        "expanded": lambda: r(N, T, 1, 3).expand(N, T, 2, 3),  # a feature dim of stride 0
        "time-major": lambda: r(T, N, 3, 2).permute(1, 0, 3, 2),  # a [T, N, 3, 2] buffer, features transposed
        "time-major-sliced": lambda: r(T, N, 2, 5)[..., :3].transpose(0, 1),  # [N, T, 2, 3] of [T, N, 2, 5]
        "batched": lambda: r(2, N // 2, T, 3, 2).transpose(-1, -2),  # [2, N/2, T, 2, 3]
        "time-major-merged": lambda: r(T, N, 2, 3).transpose(0, 1),  # mergeable: read in place
    }[layout]()


def _traces(name, x, flags, initial, backend, **kw):
    if name == "eligibility_traces":
        return F.eligibility_traces(x, 0.97, 0.9, initial, **flags, backend=backend, **kw)
    return F.episodic_sums(x, initial, **flags, backend=backend, **kw)


LAYOUTS = ["transposed", "sliced", "every-other", "expanded", "time-major", "time-major-sliced", "batched",
           "time-major-merged"]


@pytest.mark.parametrize("initial", [False, True], ids=["zero", "initial"])
@pytest.mark.parametrize("mix", ["term+trunc", "term+trunc+mask"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["eligibility_traces", "episodic_sums"])
def test_features_that_cannot_merge(name, layout, mix, initial):
    """``x`` with feature dims that cannot merge into one stride (transposed, sliced, expanded,
    time-major, under batch dims): each step's features come back in their own order, against the
    reference on a contiguous copy, ``final`` too, with or without a (non-contiguous) ``initial``;
    on every backend, the triton one also through a repeated call and a bound one (after a write
    into ``x``), its outputs in the layout the custom op's fake implementation gives."""
    T = 13  # one chunk: tiles of several rows (the layout is read on the host)
    seed = zlib.crc32(f"feat-{name}-{layout}-{mix}-{initial}".encode())
    g = torch.Generator().manual_seed(seed + 1)
    x = _features(layout, 4, T, seed, "cpu")
    B, feat = x.shape[:-3], x.shape[-2:]
    try:
        x.view(*x.shape[:-2], -1)
        merges = True
    except RuntimeError:  # "view size is not compatible with input tensor's size and stride"
        merges = False
    assert merges == (layout == "time-major-merged")
    f = make(4, T, mix, seed=zlib.crc32(f"{layout}-{mix}".encode()), device="cpu")
    flags = {k: (None if f[k] is None else f[k].reshape(*B, T)) for k in ("terminated", "truncated", "mask")}
    init = torch.randn(*B, feat[1], feat[0], generator=g, dtype=torch.float64).float().transpose(-1, -2) \
        if initial else None
    ref = _traces(name, x.contiguous(), flags, None if init is None else init.contiguous(), "reference")
    for backend in BACKENDS:
        xb = _features(layout, 4, T, seed, "cpu" if backend == "numba" else DEV)
        assert xb.stride() == x.stride()
        got = _traces(name, xb, {k: _on(backend, v) for k, v in flags.items()}, _on(backend, init), backend)
        assert got[0].shape == x.shape and got.final.shape == (*B, *feat)
        assert_ref(got, ref, 1e-5)
    xb, ib = _features(layout, 4, T, seed, DEV), _on("triton", init)
    fb = {k: _on("triton", v) for k, v in flags.items()}
    got = _traces(name, xb, fb, ib, "triton")
    if not B[:-1]:  # [N, T, *feat]: strided as the fake implementation of rollbuf::scan says
        assert got[0].stride() == H.output_buffers(xb, tuple(feat), got[0].dtype, 1)[0].stride()
    again = _traces(name, xb, fb, ib, "triton")  # the repeated call's path
    assert all(torch.equal(a, b) for a, b in zip(again, got))
    args = dict(x=xb, initial=ib, **fb)
    if name == "eligibility_traces":
        args.update(gamma=0.97, lam=0.9)
    def public():  # the public call on the same tensors
        return getattr(F, name)(**args, backend="triton")

    assert all(torch.equal(a, b) for a, b in zip(public(), got))
    if layout != "expanded":  # (no in-place write into a tensor with overlapping elements)
        xb.mul_(-2)  # written in place: the next call reads the new contents
        want = _traces(name, xb.contiguous().cpu(), flags, None if init is None else init.contiguous(), "reference")
        assert_ref(public(), want, 1e-5)


def test_features_that_cannot_merge_reproducer():
    """The audit's reproducer: ``[0, 2, 1, 3, 4, 8, 6, 10]``, not the memory order ``[0, 1, 2, 3, 4, 6, 8, 10]``."""
    x = torch.arange(8.0, device=DEV).reshape(1, 2, 2, 2).transpose(-1, -2)
    res = F.episodic_sums(x, terminated=torch.zeros(1, 2, dtype=torch.bool, device=DEV), backend="triton")
    assert res.sums.flatten().tolist() == [0, 2, 1, 3, 4, 8, 6, 10]
    assert res.final.flatten().tolist() == [4, 8, 6, 10]


# every estimator in float64; those with values also with bf16 rewards (computed in float64, as the
# float64 values make it)
WIDE = [(name, "fp64") for name in ESTIMATORS] + [
    (name, "mixed") for name in ("gae", "lambda_returns", "discounted_returns", "vtrace", "retrace")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype,tol", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3)], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mix", ["term+trunc", "term+trunc+mask"])
@pytest.mark.parametrize("name,inputs", WIDE, ids=[f"{n}-{i}" for n, i in WIDE])
def test_float64_calls_with_16_bit_outputs(name, inputs, mix, out_dtype, tol, backend):
    """A call computed in float64 that writes bf16 or fp16 (``out_dtype``): each output is the
    float64 result rounded as PyTorch rounds it (the same call with float64 outputs, cast), close to
    the reference; ``final`` (a carry) stays float64. On every backend."""
    f = make(3, 37, mix, dtype=torch.float64, seed=zlib.crc32(f"wide-{name}-{mix}".encode()), device="cpu")
    if inputs == "mixed":
        f["rewards"] = f["rewards"].to(torch.bfloat16)
    fb = {k: _on(backend, v) for k, v in f.items()}
    got = call(name, fb, backend, out_dtype=out_dtype)
    wide = call(name, fb, backend)  # float64 outputs
    forward = name in ("eligibility_traces", "episodic_sums")
    per_step = got[:1] if forward else got
    assert all(o.dtype == out_dtype for o in per_step)
    assert all(o.dtype == torch.float64 for o in wide)
    if forward:
        assert got[1].dtype == torch.float64 and torch.equal(got[1], wide[1])
    for o, w in zip(per_step, wide):
        assert_written(o, w, backend)
    assert_ref(got, call(name, f, "reference", out_dtype=out_dtype), tol)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def assert_written(o, w, backend="triton"):
    """``o`` (bf16 or fp16) is the float64 ``w`` rounded as PyTorch rounds it (to float32, then to
    nearest). Triton's interpreter (3.6) rounds float32 to bf16 toward zero (its cast drops the low
    bits; the GPU's rounds to nearest): there, each bf16 element may also be that."""
    want = w.to(o.dtype)
    hit = o == want
    if backend == "triton" and INTERPRETED and o.dtype == torch.bfloat16:
        toward_zero = (w.float().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)  # exact
        hit |= o == toward_zero
    assert hit.all(), (o[~hit], w[~hit])


def test_float64_to_bf16_reproducer():
    """The audit's reproducer: Monte-Carlo returns of ``[1, 2, 3]`` at γ = 0.5 in float64, written bf16."""
    r = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64, device=DEV)
    got = F.discounted_returns(0.5, rewards=r, bootstrap=False, out_dtype=torch.bfloat16, backend="triton")
    assert got.dtype == torch.bfloat16 and got.flatten().tolist() == [2.75, 3.5, 3.0]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("family", ["affine", "affine-reverse", "lambda_adjoint"])
def test_float64_kernels_with_16_bit_outputs(family, out_dtype, split):
    """The affine scan's and the TD(λ) adjoint's kernels (which the public functions run with outputs
    in the accumulation dtype) computing in float64 and writing bf16 or fp16: the float64 outputs
    rounded as PyTorch rounds them, the carry out float64; every strategy."""
    from rollbuf.problem import Family, Problem

    N, T = 3, 37
    g = torch.Generator().manual_seed(zlib.crc32(f"{family}-{out_dtype}".encode()))
    f = make(N, T, "term+trunc+mask", dtype=torch.float64, seed=31)
    c0 = torch.randn(N, generator=g, dtype=torch.float64).to(DEV)
    if family == "lambda_adjoint":
        fields = {"grad_returns": f["rewards"], "grad_advantages": f["values"], "terminated": f["terminated"],
                  "truncated": f["truncated"], "mask": f["mask"]}
        kw = dict(family=Family.TD_LAMBDA_ADJOINT, outputs=("rewards", "values"), gamma=0.97, lam=0.9)
    else:
        beta = 0.9 * torch.rand(N, T, generator=g, dtype=torch.float64)
        fields = {"alpha": f["rewards"].nan_to_num(), "beta": beta.to(DEV)}
        kw = dict(family=Family.AFFINE, outputs=("y", "final"), reverse=family == "affine-reverse")
    res = {}
    for dt in (out_dtype, torch.float64):
        p = Problem(fields=fields, carry=c0, compute_dtype=torch.float64, out_dtype=dt, **kw)
        res[dt] = K.run(p)
    (outs, carry), (wide, wide_carry) = res[out_dtype], res[torch.float64]
    for o, w in zip(outs, wide):
        if o.dim() == 1:  # the affine scan's final: a carry
            assert o.dtype == torch.float64 and torch.equal(o, w)
        else:
            assert o.dtype == out_dtype
            assert_written(o, w)
    if carry is not None:
        assert carry.dtype == torch.float64 and torch.equal(carry, wide_carry)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_float64_to_16_bits_rounds_through_float32(out_dtype, backend):
    """Values just past a tie of the 16-bit type (``1 + u/2 + ε`` and ``1 + 5u/2 + ε``, ``u`` its ulp
    at 1, ``ε`` below float32's precision): rounded directly they would go up; through float32, as
    PyTorch's cast rounds them, they are the tie and go to the even neighbour, down. Monte-Carlo
    returns at γ = 0 are the rewards themselves."""
    half = 2.0 ** -8 if out_dtype == torch.bfloat16 else 2.0 ** -11  # half an ulp at 1
    base = torch.tensor([1 + half + half ** 4, 1 + 5 * half + half ** 4], dtype=torch.float64)
    assert base.to(out_dtype).tolist() == [1.0, 1 + 4 * half]  # PyTorch's rounding: down to even
    r = torch.stack([base, -base, 4 * base]).reshape(1, -1)
    got = F.discounted_returns(0.0, rewards=_on(backend, r), bootstrap=False, out_dtype=out_dtype, backend=backend)
    assert got.dtype == out_dtype
    assert_written(got.cpu(), r, backend)


@pytest.mark.skipif(not CUDA, reason="the look-back's chains race only on a GPU (the interpreter: one at a time)")
@pytest.mark.parametrize("name,mix,dtype,layout,poll", [
    ("gae", "term+trunc", torch.float32, "env", False),  # a float32 state in the flag's word
    ("gae", "term+trunc", torch.float64, "env", False),  # float64: the state in the slot, a release flag
    ("vtrace", "term+trunc+mask", torch.float32, "env", False),  # pair maps: the pair state in the slot
    ("gae", "term+trunc", torch.float32, "time", False),  # tiles of 32 rows x 128 steps: the slot
    ("gae", "term+trunc", torch.float32, "env", True),  # the window of words, the state in the word
    ("gae", "term+trunc", torch.float64, "env", True),  # the window, the state in the slot
    ("vtrace", "term+trunc+mask", torch.float32, "env", True),  # the window over pair maps
    ("gae", "term+trunc", torch.float32, "env", 32),  # one warp's 32 words (2 warps)
], ids=["fp32-word", "fp64-slot", "vtrace-pair-slot", "time-major-tiles", "fp32-word-window", "fp64-slot-window",
        "vtrace-pair-window", "fp32-word-warp-window"])
def test_look_back_under_load_matches_three_passes(name, mix, dtype, layout, poll):
    """Thousands of chunks chained by the look-back at once (16 rows x 256 chunks; time-major, two
    tiles of 32 rows x 1024 chunks of 128 steps; with ``poll``, the window of words over one row of 4096
    chunks), three calls in a row, each against the three passes on the same inputs: every output
    within 1e-5 (float64: 1e-12) of the largest magnitude. On a GPU the chains really race:
    predecessors publish while their successors poll."""
    N, T = (64, 1024 * 128) if layout == "time" else (1, 4096 * 256) if poll else (16, 256 * 256)
    window = "-window" if poll is True else f"-window{poll}" if poll else ""  # the cases without it keep their inputs
    f = make(N, T, mix, dtype=dtype, seed=zlib.crc32(f"race-{name}-{layout}-{dtype}{window}".encode()))
    if layout == "time":
        f = time_major(f)
    force = {} if layout == "time" else dict(block_t=256, split=True, poll=poll)
    with K.forced(presolve=True, **force):
        ref = call(name, f, "triton")
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for _ in range(3):
        with K.forced(presolve=False, **force), _launches() as seen:
            got = call(name, f, "triton")
        assert seen and all(la.strategy.split and not la.strategy.presolve and bool(la.strategy.poll) == bool(poll)
                            for la in seen), [la.strategy for la in seen]
        assert seen[0].grid >= 2048, seen[0].grid
        for o, r in zip(got, ref):
            assert not torch.isnan(o).any() or torch.isnan(r).any()
            a, b = o.double().nan_to_num(), r.double().nan_to_num()
            err = float((a - b).abs().max() / b.abs().max().clamp(min=1))
            assert err <= tol, (err, tol)
