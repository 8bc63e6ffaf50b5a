"""The launch around the family kernels: outputs asked for, plans bound to a caller's tensors, the
strategy from the device, and calls that must not share anything (threads, streams, CUDA graphs,
another device)."""

from __future__ import annotations

import contextlib
import threading
import zlib

import pytest
import torch

import rollbuf.kernels as K
from rollbuf import functional as F
from rollbuf.problem import Problem
from test_kernels import DEV, assert_ref, call, make

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


def test_plan_reuses_its_launch_on_in_place_writes():
    """A plan bound to a caller's tensors (a ``Rollout``'s storage) runs on their current contents:
    fields rewritten in place between calls give the fresh call's result; nothing is rebuilt."""
    f = make(4, 41, "term+trunc+mask", seed=3)
    p = _gae_problem(f, ("advantages", "returns"), want_carry=True)
    plan = K.plan(p)
    first = plan()
    assert_ref(first[0], call("gae", f, "reference"), 1e-5)
    new = make(4, 41, "term+trunc+mask", seed=4)
    for k, v in new.items():
        if v is not None and f.get(k) is not None:
            f[k].copy_(v)
    again = plan()
    assert_ref(again[0], call("gae", new, "reference"), 1e-5)
    fresh = K.run(_gae_problem(new, ("advantages", "returns"), want_carry=True))
    for a, b in zip(again[0] + (again[1],), fresh[0] + (fresh[1],)):
        assert torch.equal(a, b)
    assert K.launch_for(p) is plan.launch


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


def test_forced_choices_are_scoped():
    with K.forced(block_t=16, split=True):
        with K.forced(presolve=True):
            from rollbuf.kernels.host import _FORCE

            assert dict(_FORCE.get()) == dict(block_t=16, split=True, presolve=True)
        assert dict(_FORCE.get()) == dict(block_t=16, split=True)
    assert _FORCE.get() == ()
    with pytest.raises(TypeError, match="unknown kernel choice"):
        with K.forced(early_loads=True):
            pass


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


class _Chain:
    """A stand-in of Triton 3.6's ``HookChain`` (``calls``: the hooks it would call)."""

    def __init__(self, *calls):
        self.calls = list(calls)

    def __call__(self, metadata):
        for c in self.calls:
            c(metadata)


def _triton_chains(add: bool):
    """Triton's own hook chains (``triton.knobs.HookChain``, Triton 3.6), one with a hook added."""
    knobs = pytest.importorskip("triton.knobs")
    if not hasattr(knobs, "HookChain"):
        pytest.skip("this Triton holds its launch hooks as None or functions")
    enter, leave = knobs.HookChain(), knobs.HookChain(reversed=True)
    if add:
        enter.add(print)
    return enter, leave


@pytest.mark.parametrize("hooks", ["empty-chains", "none", "enter-chain", "exit-function", "triton-empty",
                                   "triton-added"])
def test_compiled_launch_passes_hooks_only_when_they_call_something(monkeypatch, hooks):
    """A warm launch goes straight to the compiled kernel's launcher: with no hook to call (Triton
    3.6's empty hook chains, or ``None``) it builds no launch metadata and passes no hook; a
    profiler's hook (a chain with a call, or a plain function) gets the metadata, as Triton's own
    launch gives it. The launcher is a stand-in here, so this runs without a GPU."""
    from rollbuf.kernels import host as H

    if hooks.startswith("triton"):
        enter, leave = _triton_chains(hooks == "triton-added")
    else:
        enter, leave = {"empty-chains": (_Chain(), _Chain()), "none": (None, None),
                        "enter-chain": (_Chain(print), _Chain()), "exit-function": (None, print)}[hooks]
    rt = type("Runtime", (), {"launch_enter_hook": enter, "launch_exit_hook": leave})()
    monkeypatch.setattr(H, "_DRIVER", [(lambda device: f"stream{device}", rt)])
    seen = {}

    class Compiled:
        def launch_metadata(self, grid, stream, *args):
            seen["metadata"] = (grid, stream, args)
            return "metadata"

    def launcher(*a):
        seen["run"] = a

    k = H.Kernel(jit=None, const=(7, 8), warps=4)
    # the launch function and what goes before the metadata (as _c_launch gives them for Triton's C launch)
    k.compiled = (launcher, "function", "packed", Compiled(), ("coop", "pdl", None, None))
    args = (torch.zeros(3), None, 5, 0.5)
    k(12, args, 0)
    head, tail = seen["run"][:13], seen["run"][13:]
    assert tail == (*args, 7, 8)
    if hooks in ("empty-chains", "none", "triton-empty"):
        assert head == (12, 1, 1, "stream0", "function", "coop", "pdl", None, None, "packed", None, None, None)
        assert "metadata" not in seen
    else:
        assert head == (12, 1, 1, "stream0", "function", "coop", "pdl", None, None, "packed", "metadata", enter,
                        leave)
        assert seen["metadata"] == ((12, 1, 1), "stream0", (*args, 7, 8))


# ---- the lean launch: what a warm plan and a repeated call pass the compiled launcher ------------

_OWN = ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")


def _own(f):
    return {k: f[k] for k in _OWN}


def _lean_cases():
    f = _own(make(5, 23, "term+trunc", seed=11, device="cpu"))
    col = dict(f, truncated=None, bootstrap_values=f["bootstrap_values"][:, -1].contiguous())
    bf = {k: (v.to(torch.bfloat16) if v is not None and v.is_floating_point() else v) for k, v in f.items()}
    lp = torch.randn(5, 23, generator=torch.Generator().manual_seed(2)) * 0.3
    return {
        "advantages": ("advantages", dict(gamma=0.97, lam=0.9), f),
        "lambda_returns": ("lambda_returns", dict(gamma=0.97, lam=0.9), f),
        "gae": ("gae", dict(gamma=0.97, lam=0.9), f),
        "gae-column": ("gae", dict(gamma=0.97, lam=0.9), col),
        "gae-bf16-fp32-out": ("gae", dict(gamma=0.97, lam=0.9, out_dtype=torch.float32), bf),
        "vtrace": ("vtrace", dict(target_log_probs=lp + 0.1, log_probs=lp, gamma=0.97), f),
        "discounted_returns": ("discounted_returns", dict(gamma=0.97), col),
    }


def _pretend_gpu(monkeypatch, hooks=(None, None)):
    """A launch that believes it runs on cuda:0 with a compiled kernel whose launcher records its
    arguments (no GPU needed): what reaches the launcher is what this checks."""
    from rollbuf.kernels import host as H

    rt = type("Runtime", (), {"launch_enter_hook": hooks[0], "launch_exit_hook": hooks[1]})()
    monkeypatch.setattr(H, "_DRIVER", [(lambda device: f"stream{device}", rt)])
    current = [0]  # the current device, as torch.cuda.current_device() gives it
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    seen = []

    class Compiled:
        def launch_metadata(self, grid, stream, *args):
            return "metadata"

    def launcher(*a):
        seen.append(a)

    def pretend(p):
        from rollbuf import kernels

        launch = H.Launch(p, kernels.host._FORCE.get())  # a fresh launch: the cache is not touched
        launch.dev_index = 0
        for k in launch.passes:
            # as _c_launch gives Triton 3.6's C launch function: four arguments before the metadata
            k.compiled = (launcher, "function", "packed", Compiled(), ("coop", "pdl", None, None))
        return launch

    pretend.current = current
    return pretend, seen


def _same_arguments(lean_args, full_args, lean_outs, addresses=False):
    """The lean launch passed what the full launch passed: the same grid, stream, fields, carry,
    sizes, scalars and constexprs (the very objects or equal numbers), new output tensors laid out as
    the full launch's, and those outputs are what it returned, in the order asked for.
    ``addresses``: a plan's fixed inputs (the fields and the carry in) are passed as the addresses
    of the full launch's tensors."""
    assert len(lean_args) == len(full_args)
    fresh = []

    def same_input(a, b):
        if addresses and isinstance(b, torch.Tensor):
            return type(a) is int and a == b.data_ptr()
        return a is b

    for a, b in zip(lean_args, full_args):
        if isinstance(b, torch.Tensor) and any(b is o for o in lean_outs[1]):
            assert isinstance(a, torch.Tensor) and a is not b
            assert (a.shape, a.stride(), a.dtype, a.device) == (b.shape, b.stride(), b.dtype, b.device)
            fresh.append(a)
        elif isinstance(b, tuple):  # the fields
            assert len(a) == len(b) and all(same_input(x, y) for x, y in zip(a, b))
        elif isinstance(b, torch.Tensor) or b is None:
            assert same_input(a, b)
        else:
            assert type(a) is type(b) and a == b
    assert fresh == list(lean_outs[0])


def _no_full_path(monkeypatch, launch=None):
    """Make the full launch path fail (its launch step and the kernels' own call), so that a test
    sees the lean launch taken rather than the full one handing over the same arguments."""
    from rollbuf.kernels import host as H

    def full(*a, **k):
        raise AssertionError("the full launch path was taken")

    monkeypatch.setattr(H.Kernel, "__call__", full)
    if launch is not None:
        monkeypatch.setattr(launch, "launch", full)


@pytest.mark.parametrize("case", list(_lean_cases()))
def test_lean_launch_passes_what_the_full_launch_passes(case, monkeypatch):
    """A warm plan (a ``Rollout``'s bound call) and a repeated functional call launch the compiled
    kernel through :meth:`Launch.lean`, which skips the per-call bookkeeping; it must hand the
    launcher exactly the arguments the full path hands it, with fresh outputs."""
    from rollbuf import functional

    name, params, f = _lean_cases()[case]
    est, kw = functional._arguments(name, dict(params, **f))
    p, _ = functional._problem(est, **kw)
    pretend, seen = _pretend_gpu(monkeypatch)
    launch = pretend(p)
    fields, ci, scalars = launch.inputs(p)
    outs_full, _ = launch(p, fields, ci, scalars)
    go = launch.lean(fields, ci, scalars)
    assert go is not None
    _no_full_path(monkeypatch, launch)  # from here on only the lean launch may reach the launcher
    outs_lean, co = go()
    assert co is None and len(outs_lean) == len(outs_full) == len(p.outputs)
    _same_arguments(seen[1], seen[0], (outs_lean, outs_full), addresses=True)
    # the same with the inputs given per call (rollbuf.functional's repeated calls)
    outs_with, _ = launch.lean(None, None, scalars)(fields, ci)
    _same_arguments(seen[2], seen[0], (outs_with, outs_full))


def test_lean_launch_only_where_it_is_the_same_launch(monkeypatch):
    """No lean launch where the launch has more to do (a carry out, split rows with scratch, the
    interpreter, poisoned outputs, not yet compiled); under a profiler's hook or another current
    device a lean launch takes the full path (the hook gets the launch's metadata)."""
    from rollbuf import functional

    f = _own(make(5, 23, "term+trunc", seed=12, device="cpu"))
    kw = dict(gamma=0.97, lam=0.9, **f)
    pretend, seen = _pretend_gpu(monkeypatch)
    p, _ = functional._problem("gae", **kw)
    launch = pretend(p)
    go = launch.lean(*launch.inputs(p))
    assert go is not None
    assert pretend(functional._problem("gae", return_carry=True, **kw)[0]).lean(None, None, ()) is None
    with K.forced(split=True, presolve=False, block_t=8):
        assert pretend(p).lean(None, None, ()) is None  # look-back scratch
    with K.forced(poison=True):
        assert pretend(p).lean(None, None, ()) is None
    cold = pretend(p)
    cold.passes[0].compiled = None
    assert cold.lean(None, None, ()) is None
    assert K.launch_for(p).lean(None, None, ()) is None  # CPU tensors: no device to launch on
    x = torch.randn(5, 23)
    traces, _ = functional._problem("eligibility_traces", x=x, gamma=0.9, lam=0.8, terminated=f["terminated"])
    assert pretend(traces).lean(None, None, ()) is None  # the traces' final is a carry out
    # a profiler's hook: the full path, which builds the metadata for it
    hook = type("Chain", (), {"calls": [print]})()
    from rollbuf.kernels import host as H

    rt = H._DRIVER[0][1]  # Triton's runtime knobs: the hooks are read from it on every launch
    for which in ("launch_enter_hook", "launch_exit_hook"):
        setattr(rt, which, hook)
        go()
        assert seen[-1][10] == "metadata", which
        setattr(rt, which, None)
    # another current device: the full path (which switches to the launch's device first)
    switched = []

    def device(d):  # torch.cuda.device(d): d becomes current
        switched.append(d)
        pretend.current[0] = d
        return contextlib.nullcontext()

    monkeypatch.setattr(torch.cuda, "device", device)
    pretend.current[0] = 1
    n = len(seen)
    go()
    assert switched == [0] and len(seen) == n + 1


def test_plan_launches_lean_once_compiled(monkeypatch):
    """A plan's first run goes through the full launch (compiling the kernel on a GPU); from the
    second on it runs the lean launch, which passes the same arguments."""
    from rollbuf import functional
    from rollbuf.kernels import host as H

    p, _ = functional._problem("advantages", gamma=0.97, lam=0.9,
                               **_own(make(5, 23, "term+trunc", seed=13, device="cpu")))
    pretend, seen = _pretend_gpu(monkeypatch)
    monkeypatch.setattr(H, "launch_for", pretend)
    plan = H.Plan(p)
    assert plan._go is None
    first = plan()
    assert callable(plan._go)
    _no_full_path(monkeypatch, plan.launch)
    again = plan()
    _same_arguments(seen[1], seen[0], (again[0], first[0]), addresses=True)


@pytest.mark.parametrize("which", ["rewards", "carry"])
def test_a_plan_holds_the_storage_it_was_bound_to(which, monkeypatch):
    """A warm plan passes its fixed inputs (the fields, the carry in) to the launcher as addresses
    read once: it holds their storages, so the memory an address points at is not freed when a
    tensor is given new storage in place (``x.data = y``; the plan is then stale, and a ``Rollout``
    binds its call again: tested in test_rollout.py)."""
    import gc

    from rollbuf import functional
    from rollbuf.kernels import host as H

    f = _own(make(5, 23, "term+trunc", seed=15, device="cpu"))
    carry = torch.randn(5)
    p, _ = functional._problem("advantages", gamma=0.97, lam=0.9, carry=carry, **f)
    pretend, seen = _pretend_gpu(monkeypatch)
    monkeypatch.setattr(H, "launch_for", pretend)
    plan = H.Plan(p)
    plan(), plan()
    t = p.carry if which == "carry" else p.fields["rewards"]  # the tensor the plan reads (a view, or ours)
    address = t.data_ptr()
    del carry, f  # the test's own references: the plan's problem holds what it reads
    assert any(s.data_ptr() == address for s in plan._go.held)
    t.data = torch.zeros_like(t)  # new storage in place
    gc.collect()
    assert any(s.data_ptr() == address for s in plan._go.held)
    plan()
    # the launcher's arguments: 13 before the kernel's, then the fields, the output slots, the carry in
    passed = seen[-1][13][0] if which == "rewards" else seen[-1][13 + 1 + plan.launch.n_slots]
    assert passed == address != t.data_ptr()


def test_the_direct_c_launch_passes_what_tritons_launcher_passes():
    """On Triton 3.6's CUDA launcher, a compiled kernel is launched through the C function its
    Python wrapper calls, with the arguments the wrapper would add (no scratch): the same call
    reaches that function either way. Elsewhere (Triton 3.7 orders the C function's arguments
    differently), Triton's launcher as it is."""
    import triton

    from rollbuf.kernels import host as H

    try:
        from triton.backends.nvidia.driver import CudaLauncher
    except ImportError:  # a Triton without the NVIDIA backend: nothing to compare with
        CudaLauncher = None
    seen = []
    if CudaLauncher is not None:
        run = CudaLauncher.__new__(CudaLauncher)  # its state as __init__ sets it, with no GPU
        run.num_ctas, run.launch_cooperative_grid, run.launch_pdl = 1, False, True
        run.global_scratch_size = run.profile_scratch_size = 0
        run.global_scratch_align = run.profile_scratch_align = 1
        run.arg_annotations = run.kernel_signature = None  # set by Triton 3.7's __init__, passed on
        run.launch = lambda *a: seen.append(a)
        c_launch, head = H._c_launch(run)
        if triton.__version__.split(".")[:2] == ["3", "6"]:
            assert c_launch is run.launch and head == (False, True, None, None)
        else:
            assert c_launch is run and head == ()
        args = (torch.zeros(3), (None, 4), 5, 0.5)
        run(12, 1, 1, "stream", "function", "packed", None, None, None, *args)
        c_launch(12, 1, 1, "stream", "function", *head, "packed", None, None, None, *args)
        assert len(seen) == 2 and seen[0] == seen[1]
        run.global_scratch_size = 128  # a kernel that needs scratch: the wrapper allocates it
        assert H._c_launch(run) == (run, ())

    def other(*a):  # another launcher (another backend or version): used as it is
        pass

    assert H._c_launch(other) == (other, ())


def test_a_copied_plan_runs_on_its_own_tensors(monkeypatch):
    """A deep copy of a warm plan launches on the copied tensors (a plan's lean launch holds the
    tensors it was built on, so a copy is bound again); a shallow copy on the same tensors."""
    import copy

    from rollbuf import functional
    from rollbuf.kernels import host as H

    f = _own(make(5, 23, "term+trunc", seed=14, device="cpu"))
    p, _ = functional._problem("advantages", gamma=0.97, lam=0.9, **f)
    pretend, seen = _pretend_gpu(monkeypatch)
    monkeypatch.setattr(H, "launch_for", pretend)
    plan = H.Plan(p)
    plan()
    plan()  # warm: lean
    deep, shallow = copy.deepcopy(plan), copy.copy(plan)
    deep(), deep()
    assert seen[-1][13][0] == deep.problem.fields["rewards"].data_ptr() != f["rewards"].data_ptr()
    torch.testing.assert_close(deep.problem.fields["rewards"], f["rewards"])
    shallow()
    assert seen[-1][13][0] is f["rewards"]  # a new plan: its first run is the full launch
    shallow()
    assert seen[-1][13][0] == f["rewards"].data_ptr()  # then lean, on the same tensors


def test_repeated_functional_call_launches_lean(monkeypatch):
    """A repeated functional call on the fast path (here GAE with the ``[N]`` window-end column as
    the kernel's carry in) launches lean from its second repeat on, with the arguments of the
    repeat before it: the fields from this call's arguments, the column as the carry in."""
    from rollbuf import functional
    from rollbuf.kernels import host as H

    # CPU tensors on the triton backend: the interpreter's setting lets them through validation on
    # a GPU machine too (the launches are stand-ins, nothing is interpreted)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pretend, seen = _pretend_gpu(monkeypatch)
    launches = {}

    def cached(p):  # one launch per signature, as the real cache keeps it
        key = H.signature(p, H._FORCE.get())
        if key not in launches:
            launches[key] = pretend(p)
        return launches[key]

    monkeypatch.setattr(H, "launch_for", cached)
    monkeypatch.setattr(K, "launch_for", cached)
    monkeypatch.setattr(functional, "_CALLS", {})
    f = _lean_cases()["gae-column"][2]

    def call():
        return tuple(F.gae(0.97, 0.9, **f, backend="triton"))

    call()  # validated, the launch built and run (compiled, as far as the launcher knows)
    second = call()  # the repeated path's first run: the launch itself
    _no_full_path(monkeypatch)
    third = call()  # lean
    assert len(seen) == 3
    _same_arguments(seen[2], seen[1], (third, second))
    assert any(a is f["bootstrap_values"] for a in seen[2])  # the column, as the carry in


def test_every_kernel_entry_and_helper_takes_at_most_24_parameters():
    """The family kernels are small entries over shared helpers: no ``@triton.jit`` function of
    ``rollbuf.kernels`` takes more than 24 parameters (the constexpr flags included), and every
    family's entry is among them."""
    import importlib
    import inspect
    import pkgutil

    import rollbuf.kernels as kernels_pkg
    from rollbuf.kernels.host import FAMILIES

    counts = {}
    for m in pkgutil.iter_modules(kernels_pkg.__path__):
        mod = importlib.import_module(f"rollbuf.kernels.{m.name}")
        for name, obj in vars(mod).items():
            fn = getattr(obj, "fn", None)
            if type(obj).__name__ in ("JITFunction", "InterpretedFunction") and inspect.isfunction(fn):
                counts[f"{m.name}.{name}"] = len(inspect.signature(fn).parameters)
    entries = {fam.kernel for fam in FAMILIES.values()}  # "module.function"
    assert entries and entries <= set(counts), (entries, sorted(counts))
    over = {k: n for k, n in counts.items() if n > 24}
    assert not over, over
