"""The launch around the family kernels: outputs asked for, the launch cached under a call's
signature and launched by keyword, the strategy from the device, and calls that must not share
anything (threads, streams, CUDA graphs, another device)."""

from __future__ import annotations

import threading
import zlib

import pytest
import torch

import rollbuf.kernels as K
from rollbuf import cache
from rollbuf import functional as F
from rollbuf.problem import Family, Problem
from test_kernels import DEV, _launches, assert_ref, call, make

CUDA = torch.cuda.is_available()


def _gae_problem(f, outputs, **kw):
    fields = {k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")}
    return Problem(family="lambda", outputs=outputs, fields=fields, gamma=0.97, lam=0.9, **kw)


@pytest.mark.parametrize("outputs", [("advantages",), ("returns",), ("advantages", "returns"),
                                     ("returns", "advantages")], ids="-".join)
@pytest.mark.parametrize("mode", ["tile", "lookback", "three-pass"])
def test_outputs_asked_for(outputs, mode):
    """The TD(λ) kernel writes the outputs the Problem names, in its order, and nothing else."""
    f = make(3, 37, "term+trunc+mask", seed=zlib.crc32("-".join(outputs).encode()))
    ref = dict(zip(("advantages", "returns"), call("gae", f, "reference")))
    force = {"tile": {}, "lookback": dict(split=True, presolve=False), "three-pass": dict(split=True, presolve=True)}
    with K.forced(poison=True, block_t=None if CUDA else 16, **force[mode]):
        outs, carry = K.run(_gae_problem(f, outputs))
    assert len(outs) == len(outputs) and carry is None
    assert_ref(outs, [ref[o] for o in outputs], 1e-5)


def test_adjoint_without_value_gradient():
    """The TD(λ) adjoint without ``values`` writes ``r̄`` alone, as with it."""
    f = make(2, 29, "term+trunc+mask", seed=4)
    g = torch.randn(2, 29, generator=torch.Generator().manual_seed(1)).to(DEV)
    fields = {"grad_returns": g, "grad_advantages": None, "terminated": f["terminated"],
              "truncated": f["truncated"], "mask": f["mask"]}
    both = dict(fields, grad_advantages=torch.zeros_like(g))
    with K.forced(poison=True):
        one, w1 = K.run(Problem(family="lambda_adjoint", outputs=("rewards",), fields=fields, gamma=0.9, lam=0.8))
        two, w2 = K.run(Problem(family="lambda_adjoint", outputs=("rewards", "values"), fields=both, gamma=0.9,
                                lam=0.8))
    assert len(one) == 1 and len(two) == 2
    torch.testing.assert_close(one[0], two[0])
    torch.testing.assert_close(w1, w2)


def test_a_cached_launch_runs_on_the_current_contents():
    """The launch cached under a call's signature runs any problem of that signature on its tensors'
    current contents: fields rewritten in place between calls give the fresh call's result."""
    f = make(4, 41, "term+trunc+mask", seed=3)
    p = _gae_problem(f, ("advantages", "returns"), want_carry=True)
    first = K.run(p)
    assert_ref(first[0], call("gae", f, "reference"), 1e-5)
    launch = K.launch_for(p)
    new = make(4, 41, "term+trunc+mask", seed=4)
    for k, v in new.items():
        if v is not None and f.get(k) is not None:
            f[k].copy_(v)
    again = K.run(p)
    assert_ref(again[0], call("gae", new, "reference"), 1e-5)
    fresh = K.run(_gae_problem(new, ("advantages", "returns"), want_carry=True))
    for a, b in zip(again[0] + (again[1],), fresh[0] + (fresh[1],)):
        assert torch.equal(a, b)
    assert K.launch_for(p) is launch and cache.PLANS["launch", K.signature(p, ())] is launch


class _Jit:
    """A stand-in of a jitted kernel (``arg_names``, ``kernel[grid](**kwargs)``) recording its launches."""

    def __init__(self, names):
        self.arg_names = list(names)
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            assert not args, "a launch passes its arguments by name only"
            self.calls.append((grid, kwargs))
            return "compiled"
        return launch


def test_kernels_are_launched_by_keyword_with_their_parameter_names():
    """A launch calls Triton's public JIT launch, ``kernel[grid](name=value, ..., num_warps=...)``,
    with exactly the kernel's parameter names (no argument order written down anywhere else); a
    launch whose names do not match the kernel's signature is refused when it is built."""
    from rollbuf.kernels import host as H

    jit = _Jit(["fields", "p_out", "R", "BLOCK"])
    k = H.Kernel(jit, dict(BLOCK=16), 4, ("fields", "p_out", "R"))
    k(7, dict(fields=(1, 2), p_out="out", R=3), 0)
    assert jit.calls == [((7,), dict(fields=(1, 2), p_out="out", R=3, BLOCK=16, num_warps=4))]
    assert k.binary == "compiled"
    with pytest.raises(ValueError, match=r"passes \['extra'\].*misses \['R'\]"):
        H.Kernel(jit, dict(BLOCK=16), 4, ("fields", "p_out", "extra"))
    # every family's launch names its kernel's parameters (built here, so checked against them)
    f = make(3, 37, "term+trunc+mask", seed=8)
    for force in ({}, dict(split=True, presolve=False, block_t=16), dict(split=True, presolve=True, block_t=16)):
        with K.forced(**force):
            for name in ("gae", "vtrace", "retrace", "eligibility_traces", "episodic_sums"):
                call(name, f, "triton")


class _Compiled:
    """A stand-in of Triton's CompiledKernel: ``binary[grid](*args)`` records positional launches."""

    def __init__(self):
        self.calls = []

    def run(self, *args):  # present on Triton's CompiledKernel; never called here
        raise AssertionError

    def __getitem__(self, grid):
        return lambda *args: self.calls.append((grid, args))


class _CompilingJit(_Jit):
    def __init__(self, names):
        super().__init__(names)
        self.binary = _Compiled()

    def __getitem__(self, grid):
        def launch(**kwargs):
            self.calls.append((grid, kwargs))
            return self.binary
        return launch


def test_a_plans_later_launches_go_to_its_compiled_kernel():
    """On a GPU, a plan's kernel is launched by keyword once; later calls of the same grid with every
    pointer (fields, outputs, carries) 16-byte aligned call the compiled kernel that launch returned, with
    the same arguments in the kernel's parameter order (constexprs last); a misaligned pointer, another grid,
    ``DIRECT = False`` or a kernel not made ``direct`` (integer arguments the plan does not fix) go
    by keyword again; the interpreter always does."""
    from rollbuf.kernels import host as H

    jit = _CompilingJit(["fields", "p_out", "p_ci", "R", "BLOCK"])
    k = H.Kernel(jit, dict(BLOCK=16), 4, ("fields", "p_out", "p_ci", "R"), direct=True)
    a, b, out = torch.zeros(8), torch.zeros(8), torch.zeros(8)
    args = dict(fields=(a, None, b), p_out=out, p_ci=None, R=3)
    k(7, args, 0)
    k(7, args, 0)
    assert len(jit.calls) == 1 and jit.binary.calls == [((7, 1, 1), ((a, None, b), out, None, 3, 16))]
    k(7, dict(args, p_ci=torch.zeros(8)[1:]), 0)  # a carry 4 bytes past an aligned address
    k(7, dict(args, fields=(a[1:], None, b)), 0)
    k(7, dict(args, p_out=torch.zeros(9)[1:]), 0)  # an output another allocator placed off 16 bytes
    k(5, args, 0)
    assert len(jit.calls) == 5 and len(jit.binary.calls) == 1
    k(5, args, 0)  # the runner follows the last aligned keyword launch's grid
    assert len(jit.calls) == 5 and jit.binary.calls[-1][0] == (5, 1, 1)
    H.DIRECT = False
    try:
        k(5, args, 0)
    finally:
        H.DIRECT = True
    assert len(jit.calls) == 6
    k(5, args, None)  # the interpreter
    assert len(jit.calls) == 7
    plain = H.Kernel(jit, dict(BLOCK=16), 4, ("fields", "p_out", "p_ci", "R"))
    plain(5, args, 0)
    plain(5, args, 0)
    assert len(jit.calls) == 9
    # the family kernels' tuples of pointers: one misaligned pointer in any of them takes the keyword launch
    tj = _CompilingJit(["fields", "outputs", "carries", "sizes", "CFG"])
    tk = H.Kernel(tj, dict(CFG=(1, 2)), 4, ("fields", "outputs", "carries", "sizes"), direct=True)
    targs = dict(fields=(a, None), outputs=(out, None), carries=(None, b, None), sizes=(3, 8))
    tk(7, targs, 0)
    tk(7, targs, 0)
    assert len(tj.calls) == 1 and tj.binary.calls == [((7, 1, 1), ((a, None), (out, None), (None, b, None), (3, 8),
                                                                   (1, 2)))]
    tk(7, dict(targs, carries=(None, torch.zeros(9)[1:], None)), 0)
    tk(7, dict(targs, outputs=(None, torch.zeros(9)[1:])), 0)
    assert len(tj.calls) == 3 and len(tj.binary.calls) == 1
    # a kernel whose constexprs are not its last parameters keeps the keyword launch (no KeyError)
    odd = H.Kernel(_CompilingJit(["BLOCK", "fields", "p_out"]), dict(BLOCK=16), 4, ("fields", "p_out"), direct=True)
    assert odd.names is None
    # every family's kernels declare their constexprs last, so each of their launches can go direct
    f = make(3, 37, "term+trunc+mask", seed=8)
    for force in ({}, dict(split=True, presolve=False, block_t=16), dict(split=True, presolve=True, block_t=16)):
        with K.forced(**force):
            for name in ("gae", "vtrace", "retrace", "eligibility_traces", "episodic_sums", "discounted_returns"):
                call(name, f, "triton")
    launches = [v for key, v in cache.PLANS.items() if key[0] == "launch" and not v.empty]
    assert launches and all(k.names is not None for la in launches for k in la.passes)


def test_strategy_reads_the_device():
    """The table's split threshold is 8 programs per SM of the device: fewer SMs, fewer rows split."""
    assert K.device_sms(torch.device("cpu")) == 132
    assert K.strategy(1000, 4096, sms=132).split  # 1000 rows < 8·132
    assert not K.strategy(1000, 4096, sms=66).split  # >= 8·66: walked, one row per program
    if CUDA:
        props = torch.cuda.get_device_properties(0)
        assert K.device_sms(torch.device("cuda", 0)) == props.multi_processor_count


@pytest.mark.parametrize("R,T,tile", [(4096, 128, (4, 4)), (32768, 8, (32, 4)), (32768, 16, (32, 4)),
                                        (16384, 128, (4, 4)), (2048, 512, (1, 4)), (64, 128, (2, 2))])
def test_strategy_tiles_short_rows(R, T, tile):
    """Rows up to 512 steps go several to a program (512-element tiles, halved while the GPU would
    not be filled), whole rows in one chunk: the table as documented (a regression here once gave
    every shape one row per program and one warp)."""
    st = K.strategy(R, T, sms=132)
    assert (st.block_n, st.num_warps) == tile and not st.split and st.block_t >= T


def test_strategy_elements_per_thread():
    """Eight elements per thread where timed to win (docs/kernel-choices.md, 'Elements per thread'):
    backward scans' rows walked by one program in 1024-step chunks with 4 warps (8 with a mask), and
    their one chunk of 1024 steps with 4 warps only where a step moves at most 10 bytes; masked tiles
    of 64-512 steps with a warp per 256 elements; rows of 8 steps or fewer in 256-element tiles, but
    the forward scans' of 5-8 steps with rows enough (512, 4 a thread); split rows keep theirs."""
    def plan(R, T, **kw):
        st = K.strategy(R, T, sms=132, **kw)
        return st.block_n, st.block_t, st.num_warps, st.split

    assert plan(4096, 4096) == (1, 1024, 4, False) and plan(4096, 4096, masked=True) == (1, 1024, 8, False)
    # forced choices: a forced chunk keeps the warps of before the rule, a forced block_n or num_warps
    # the 2048-step walked chunk
    assert plan(4096, 4096, block_t=1024) == plan(4096, 4096, max_chunk=1024) == (1, 1024, 8, False)
    assert plan(4096, 4096, block_n=1) == (1, 2048, 8, False) and plan(4096, 4096, num_warps=4)[1] == 2048
    assert plan(65536, 256, masked=True, block_t=256) == (2, 256, 4, False)
    assert plan(1 << 21, 8, time_contiguous=False)[:3] == (64, 8, 8)  # time-major: the table's tiles
    assert plan(16384, 1024, step_bytes=10) == (1, 1024, 4, False)
    assert plan(16384, 1024, step_bytes=14) == plan(16384, 1024) == (1, 1024, 8, False)  # 0: not known
    assert plan(16384, 1024, masked=True, step_bytes=6) == (1, 1024, 8, False)
    assert plan(65536, 256, masked=True) == (2, 256, 2, False) and plan(65536, 256) == (2, 256, 4, False)
    assert plan(1 << 18, 64, masked=True) == (8, 64, 2, False) and plan(1 << 18, 64) == (8, 64, 4, False)
    assert plan(1 << 16, 16, masked=True) == plan(1 << 16, 16)  # not timed below 64 steps
    assert plan(1 << 21, 8) == (32, 8, 4, False)
    # forward scans over rows of 5-8 steps: 512-element tiles, 4 a thread (2 for 1-4 steps, forced tilings,
    # time-major rows, or too few rows)
    assert plan(1 << 21, 8, reverse_scan=False) == plan(1 << 21, 5, reverse_scan=False) == (64, 8, 4, False)
    assert plan(1 << 21, 4, reverse_scan=False) == plan(1 << 21, 4) == (64, 4, 4, False)
    assert plan(1 << 21, 8, reverse_scan=False, block_n=32) == (32, 8, 4, False)
    assert plan(1 << 21, 8, reverse_scan=False, num_warps=2) == (32, 8, 2, False)  # forced: the table before
    assert plan(1 << 18, 8, reverse_scan=False, max_chunk=4)[:3] == plan(1 << 18, 8, max_chunk=4)[:3]
    assert plan(1 << 21, 8, reverse_scan=False, time_contiguous=False) == plan(1 << 21, 8, time_contiguous=False)
    # fewer rows than 64-row tiles would fill the GPU with (4·sms programs): the half tiles, as before
    assert plan(4096, 8, reverse_scan=False) == plan(4096, 8) == (32, 8, 4, False)
    assert plan(528 * 64, 8, reverse_scan=False) == (64, 8, 4, False)
    assert plan(527 * 64, 8, reverse_scan=False) == plan(527 * 64, 8)
    assert plan(64, 1 << 18, step_bytes=8) == plan(64, 1 << 18) == (1, 2048, 8, True)
    assert plan(8192, 2048, step_bytes=8) == (1, 2048, 8, False)  # one chunk of 2048: 8 a thread already
    # forward scans keep the table's chunks and warps (masked tiles of 64-512 steps aside)
    assert plan(4096, 4096, reverse_scan=False) == (1, 2048, 8, False)
    assert plan(16384, 1024, step_bytes=10, reverse_scan=False) == (1, 1024, 8, False)
    assert plan(65536, 256, masked=True, reverse_scan=False) == (2, 256, 2, False)


def test_launch_tells_the_table_direction_and_mask():
    """Launch passes the table what the rule reads: a backward family's scan runs in reverse (the
    forward traces' does not), a mask over V-trace's pair state is not a scalar-state mask, and the
    bytes a step moves."""
    seen = []
    real = K.host.strategy

    def spy(*a, **kw):
        seen.append(kw)
        return real(*a, **kw)

    f = make(3, 17, "term+trunc+mask", seed=1)
    K.host.strategy = spy
    try:
        for name in ("gae", "eligibility_traces", "vtrace"):
            cache.PLANS.clear()
            seen.clear()
            call(name, f, "triton")
            kw = seen[-1]
            assert kw["reverse_scan"] == (name != "eligibility_traces"), name
            assert kw["masked"] == (name != "vtrace"), name
            assert kw["step_bytes"] > 0, name
    finally:
        K.host.strategy = real
        cache.PLANS.clear()


def test_quads_rule():
    """Backward chunks of 64 steps or more go in quads for the families whose Row says so, on
    time-contiguous rows, split rows chained by the look-back too but where the TD(λ) family writes
    advantages (docs/kernel-choices.md, 'Chunks in quads'); a scan of the output itself keeps lane order
    where its rows are walked at 8 elements a thread; the exclusive state then needs no re-load; a
    forced choice wins, a flipped chunk is not in quads, nor a chunk under 4 steps."""
    def st(R, T, scan_output=False, time_contiguous=True, advantages=False, **kw):
        return K.host.in_quads(K.strategy(R, T, time_contiguous, sms=132, **kw), T, time_contiguous, scan_output,
                               kw.get("shift_load"), advantages)

    for R, T in ((16384, 1024), (65536, 256), (1 << 18, 64), (1, 1 << 24), (4096, 4096)):
        s = st(R, T)
        assert s.quads and not s.shift_load, (R, T, s)
        assert not K.strategy(R, T, sms=132).quads  # the table alone: lane order
    assert not st(1 << 21, 8).quads and not st(1 << 19, 32).quads  # under QUADS_FROM steps
    assert not st(4096, 4096, time_contiguous=False).quads
    assert st(64, 1 << 18).split and not st(64, 1 << 18).presolve and st(64, 1 << 18).quads  # the look-back
    assert not st(64, 1 << 18, advantages=True).quads  # ... but for the TD(λ) family's advantages
    assert st(1, 1 << 24, advantages=True).quads  # three passes: in quads
    # a scan of the output: walked (4096 x 4096) at 8 a thread keeps lane order; one chunk (4 a thread),
    # three passes over one row, and tiles stay in quads
    assert not st(4096, 4096, scan_output=True).quads
    assert st(4096, 4096, scan_output=True).shift_load  # the table's re-load past 512 steps, as before
    assert all(st(R, T, scan_output=True).quads for R, T in ((16384, 1024), (1, 1 << 24), (65536, 256)))
    assert st(16384, 1024, shift_load=True).shift_load  # a forced re-load stays
    assert not st(16384, 1024, flip=True).quads
    # forced: whatever the family, from 4 steps, not flipped
    assert K.strategy(4096, 4096, sms=132, quads=True).quads and not K.strategy(16384, 1024, sms=132).quads
    assert K.strategy(16384, 1024, sms=132, quads=True, block_t=4).quads
    assert not K.strategy(3, 2, sms=132, quads=True).quads
    assert not K.strategy(16384, 1024, sms=132, quads=True, flip=True).quads
    assert K.strategy(16384, 1024, sms=132, quads=True, shift_load=True).shift_load


def test_families_in_quads():
    """The families timed in quads (TD(λ), V-trace, Retrace) hold their backward chunks so by default
    (a call of 100 steps: one 128-step chunk); the forward traces, the affine scan and the turn kernels
    do not (not timed). Split rows chained by the look-back: in quads but for the TD(λ) family's
    advantages, and their outputs equal the reference's (NaN-filled before the launch)."""
    f = make(3, 100, "term+trunc+mask", seed=2)
    for name, want in (("gae", True), ("vtrace", True), ("retrace", True), ("eligibility_traces", False)):
        with _launches() as seen:
            call(name, f, "triton")
        assert seen and all(la.strategy.quads is want for la in seen), (name, [la.strategy for la in seen])
    assert K.FAMILIES[Family.TD_LAMBDA].quads and not K.FAMILIES[Family.AFFINE].quads
    # split rows chained by the look-back: in quads, but for the TD(λ) family's advantages
    f = make(2, 200, "term+trunc", seed=3)
    base = {k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values")}
    for name, want in (("gae", False), ("advantages", False), ("lambda_returns", True), ("discounted_returns", True),
                       ("vtrace", True), ("retrace", True)):
        with K.forced(split=True, block_t=64, poison=True), _launches() as seen:
            if name == "advantages":
                got = (F.advantages(0.97, 0.9, **base, backend="triton"),)
                ref = (F.advantages(0.97, 0.9, **base, backend="reference"),)
            else:
                got, ref = call(name, f, "triton"), call(name, f, "reference")
        assert seen and all(la.strategy.split and not la.strategy.presolve and la.strategy.quads is want
                            for la in seen), (name, [la.strategy for la in seen])
        assert_ref(got, ref, 1e-5)
    # with a mask: V-trace's pair maps and the masked TD(λ) and Retrace states, held through the wait
    f = make(2, 200, "term+trunc+mask", seed=4)
    for name, want in (("gae", False), ("lambda_returns", True), ("vtrace", True), ("retrace", True)):
        with K.forced(split=True, block_t=64, poison=True), _launches() as seen:
            got, ref = call(name, f, "triton"), call(name, f, "reference")
        assert seen and all(la.strategy.split and la.strategy.quads is want for la in seen), name
        assert_ref(got, ref, 1e-5)
    assert not K.FAMILIES[Family.TURN_GAE].quads and not K.FAMILIES[Family.TURN].quads


def test_step_bytes_counts_the_fields_read():
    """The bytes a step moves, as the table reads them: per-step fields (bootstrap values aside) and
    outputs at their sizes, flags one byte each."""
    f = make(3, 17, "term+trunc", seed=0)
    p = _gae_problem(f, ("advantages", "returns"))
    la = K.Launch(p)
    want = sum(f[k].element_size() for k in ("rewards", "values", "terminated", "truncated")) + 2 * 4
    assert la.step_bytes(p.fields) == want == 18


def test_forced_choices_are_scoped():
    with K.forced(block_t=16, split=True):
        with K.forced(presolve=True):
            assert K.forced_choices() == dict(block_t=16, split=True, presolve=True)
        assert K.forced_choices() == dict(block_t=16, split=True)
    assert K.forced_choices() == {}
    with pytest.raises(TypeError, match="unknown kernel choice"):
        with K.forced(early_loads=True):
            pass


def test_forced_window_sizes():
    """``poll=True``: one word a thread (32 per warp) for one-row look-back programs; ``poll=N``: N words;
    none where the rows take three passes or several rows share a program; a window that is not a
    power of two is refused, naming the choice."""
    st = K.strategy(1, 1 << 16, sms=132, split=True, presolve=False, block_t=1024, num_warps=4, poll=True)
    assert st.split and st.poll == 128
    assert K.strategy(1, 1 << 16, sms=132, split=True, presolve=False, block_t=1024, num_warps=8, poll=32).poll == 32
    assert K.strategy(1, 1 << 16, sms=132, split=True, presolve=True, block_t=1024, poll=True).poll == 0
    assert K.strategy(4, 1 << 16, sms=132, split=True, presolve=False, block_n=2, block_t=1024, poll=True).poll == 0
    with pytest.raises(ValueError, match="poll"):
        K.strategy(1, 1 << 16, sms=132, split=True, presolve=False, block_t=1024, poll=48)
    for bad in (48, 1, 16, 32.0, "32"):  # refused by forced() whatever the call: True never meets 1 in a key
        with pytest.raises(ValueError, match="poll"):
            with K.forced(presolve=True, poll=bad):
                pass
    f = make(1, 97, "term+trunc", seed=3)
    with K.forced(block_t=16, split=True, presolve=False, poll=True, num_warps=1), _launches() as seen:
        call("gae", f, "triton")
    with K.forced(block_t=16, split=True, presolve=False, poll=64, num_warps=1), _launches() as seen64:
        call("gae", f, "triton")
    assert [la.strategy.poll for la in seen] == [32] and [la.strategy.poll for la in seen64] == [64]


def _split_calls(seed, n=2, t=301, names=("gae", "vtrace", "eligibility_traces")):
    f = make(n, t, "term+trunc+mask", seed=seed)
    return f, [call(name, f, "triton") for name in names]


@pytest.mark.skipif(CUDA, reason="the interpreter's threads; the GPU runs test_two_streams")
def test_four_threads_equal_single_calls():
    """Four threads run split rows (look-back and three passes) at once; each result equals the same
    call alone: no scratch is shared between calls."""
    def calls(seed):
        out = []
        for force in (dict(split=True, presolve=False), dict(split=True, presolve=True)):
            with K.forced(block_t=16, **force):
                out.append(_split_calls(seed, t=49, names=("gae", "vtrace"))[1])
        return out

    alone = [calls(s) for s in range(4)]
    got, errors = [None] * 4, []

    def work(i):
        try:
            got[i] = calls(i)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for a, b in zip(got, alone):
        for xs, ys in zip(a, b):
            for x, y in zip(xs, ys):
                for u, v in zip(x, y):
                    assert torch.equal(u, v)


@pytest.mark.gpu
def test_two_streams():
    """Split-row calls (look-back chains and three passes) launched on two streams at once equal the
    same calls alone."""
    shapes = [(8, 65537), (1, 300001)]
    fs = [make(n, t, "term+trunc+mask", seed=i) for i, (n, t) in enumerate(shapes)]
    alone = [[call(name, f, "triton") for name in ("gae", "vtrace")] for f in fs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    got = [[], []]
    for _ in range(3):
        for i, s in enumerate(streams):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                got[i].append([call(name, fs[i], "triton") for name in ("gae", "vtrace")])
    torch.cuda.synchronize()
    for i in range(2):
        for rep in got[i]:
            for a, b in zip(rep, alone[i]):
                for x, y in zip(a, b):
                    torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.gpu
def test_graph_captured_before_a_larger_call():
    """A CUDA graph of split-row calls captured first, then a larger eager call (more scratch), then
    the graph replayed on new inputs: its scratch is its own, the replay is right."""
    from rollbuf.testing import make_rollout

    small = make_rollout(8, 65537, seed=1, p_masked=0.1, device="cuda")

    def gae(f):
        return F.gae(0.99, 0.95, rewards=f["rewards"], values=f["values"], terminated=f["terminated"],
                     truncated=f["truncated"], bootstrap_values=f["bootstrap_values"], mask=f["mask"],
                     backend="triton")

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gae(small)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = gae(small)
    big = make_rollout(64, 1 << 20, seed=2, p_masked=0.1, device="cuda")
    big_out = gae(big)
    new = make_rollout(8, 65537, seed=3, p_masked=0.1, device="cuda")
    for k, v in new.items():
        if isinstance(v, torch.Tensor):
            small[k].copy_(v)
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, gae(small)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    ref = F.gae(0.99, 0.95, **{k: (v[:2].cpu() if isinstance(v, torch.Tensor) else v) for k, v in big.items()
                              if k in ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")},
                backend="torch")
    assert_ref(tuple(x[:2] for x in big_out), ref, 2e-5)


@pytest.mark.multigpu
def test_tensors_on_another_device():
    """Tensors on cuda:1 while cuda:0 is current: the launch runs on cuda:1 (walked rows, look-back,
    three passes) and equals the same call on cuda:0."""
    torch.cuda.set_device(0)
    for force in ({}, dict(split=True, presolve=False), dict(split=True, presolve=True)):
        f0 = make(4, 5000, "term+trunc+mask", seed=7, device="cuda:0")
        f1 = {k: (None if v is None else v.to("cuda:1")) for k, v in f0.items()}
        with K.forced(block_t=512, **force):
            for name in ("gae", "vtrace", "eligibility_traces"):
                a = call(name, f0, "triton")
                b = call(name, f1, "triton")
                assert torch.cuda.current_device() == 0
                for x, y in zip(a, b):
                    assert y.device == torch.device("cuda:1")
                    torch.testing.assert_close(y.cpu(), x.cpu(), rtol=0, atol=0)


def test_overlapping_fields_are_made_to_match():
    """A field whose steps share memory (an expanded gradient, stride 0) cannot be the call's
    layout: the call reads dense fields, that one copied first; any other layout still reads."""
    f = make(3, 29, "term+trunc", seed=6)
    g = torch.full((), 0.5, device=DEV).expand(3, 29)  # strides (0, 0)
    fields = {"grad_returns": g, "grad_advantages": f["values"], "terminated": f["terminated"],
              "truncated": f["truncated"], "mask": None}
    with K.forced(poison=True):
        got = K.run(Problem(family="lambda_adjoint", outputs=("rewards", "values"), fields=fields, gamma=0.9,
                            lam=0.8))
        want = K.run(Problem(family="lambda_adjoint", outputs=("rewards", "values"),
                             fields=dict(fields, grad_returns=g.contiguous()), gamma=0.9, lam=0.8))
    for a, b in zip(got[0] + (got[1],), want[0] + (want[1],)):
        torch.testing.assert_close(a, b)
    la = K.launch_for(Problem(family="lambda_adjoint", outputs=("rewards",), fields=fields, gamma=0.9, lam=0.8))
    assert (la.s_n, la.s_t) == (29, 1) and {n for _, n, _ in la.conv} == {"grad_returns"}


def test_each_family_is_one_folder_with_its_row():
    """Every family but the generic one has one row in ``rollbuf.kernels.FAMILIES`` (by ``Family``, or
    by its string value), whose Triton kernel, CPU step and analytic adjoint live in the family's own
    package (``rollbuf/kernels/<family>/``); the turn families are Triton only (no CPU step: the other
    backends run turn_returns and turn_gae by torch ops and the affine scan)."""
    assert set(K.FAMILIES) == set(Family) - {Family.GENERIC}
    for family, row in K.FAMILIES.items():
        assert row.family is family and K.FAMILIES[family.value] is row
        assert row.state == (2 if row.pair else 1)
        package = row.kernel().fn.__module__.rsplit(".", 1)[0]
        assert package.startswith("rollbuf.kernels.") and package.count(".") == 2, package
        if family in (Family.TURN, Family.TURN_GAE, Family.TURN_FILL):
            assert row.step is None and package == "rollbuf.kernels.turns"
        else:
            assert row.step().py_func.__module__ == f"{package}.cpu"
        if row.adjoint is not None:
            assert row.adjoint.__module__ == f"{package}.adjoint"
        assert (row.adjoint is not None) == (family in (Family.TD_LAMBDA, Family.RETRACE, Family.VTRACE,
                                                        Family.FORWARD))
        assert row.saves_output == (family in (Family.RETRACE, Family.VTRACE))


def test_every_kernel_entry_and_helper_takes_at_most_12_parameters():
    """The family kernels are small entries over shared helpers: no ``@triton.jit`` function of
    ``rollbuf.kernels`` takes more than 12 parameters (the constexprs included), and every
    family's entry is among them. A scan's combine function (``combine_*``) takes the components of
    two scan elements, as ``tl.associative_scan`` passes them: at most 2 x 10 (the quads' scan of
    V-trace's pair maps carries two maps of five components)."""
    import importlib
    import inspect
    import pkgutil

    import rollbuf.kernels as kernels_pkg

    counts = {}
    for m in pkgutil.walk_packages(kernels_pkg.__path__, "rollbuf.kernels."):  # the family folders too
        mod = importlib.import_module(m.name)
        for name, obj in vars(mod).items():
            fn = getattr(obj, "fn", None)
            if type(obj).__name__ in ("JITFunction", "InterpretedFunction") and inspect.isfunction(fn) \
                    and fn.__module__ == m.name:
                counts[f"{m.name}.{name}"] = len(inspect.signature(fn).parameters)
    entries = {f"{row.kernel().fn.__module__}.{row.kernel().fn.__name__}" for row in K.FAMILIES.values()}
    assert entries and entries <= set(counts), (entries, sorted(counts))
    over = {k: n for k, n in counts.items() if n > (20 if k.rsplit(".", 1)[1].startswith("combine_") else 12)}
    assert not over, over
