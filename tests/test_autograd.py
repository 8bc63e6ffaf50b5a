"""Gradients of every estimator's outputs with respect to its floating inputs.

``torch.autograd.gradcheck`` in float64 on the ``reference`` loops (run on 0-d tensors when an
input requires grad), the ``torch`` backend and the ``triton`` backend (fused forward; backward
through the torch backend, see rollbuf/backends/autograd.py), with terminations,
truncations, masks and the window-end carry. Importance ratios are kept away from the clip points,
where the gradient is not defined.
"""

from __future__ import annotations

import contextlib

import attrs
import pytest
import torch

from rollbuf.kernels import FAMILIES
from rollbuf.problem import Family
from rollbuf.testing import make_rollout, run_estimator

DEV = "cuda" if torch.cuda.is_available() else "cpu"
PARAMS = {
    "gae": dict(gamma=0.9, lam=0.8), "lambda_returns": dict(gamma=0.9, lam=0.8),
    "discounted_returns": dict(gamma=0.9), "monte_carlo_returns": dict(gamma=0.9),
    "vtrace": dict(gamma=0.9, rho_bar=5.0, c_bar=5.0, lam=0.9), "retrace": dict(gamma=0.9, lam=0.8, c_bar=5.0),
    "eligibility_traces": dict(gamma=0.9, lam=0.8), "episodic_sums": {},
}
FLOATS = ("rewards", "values", "bootstrap_values", "log_probs", "target_log_probs", "q_values")


@contextlib.contextmanager
def _adjoint_calls(family):
    """The calls of ``family``'s analytic adjoint (its row's ``adjoint``) inside the block, one entry each."""
    from rollbuf.kernels.families import ROWS

    row, calls = FAMILIES[family], []
    spy = attrs.evolve(row, adjoint=lambda *a, **k: calls.append(1) or row.adjoint(*a, **k))
    i = ROWS.index(row)
    FAMILIES[family], ROWS[i] = spy, spy
    try:
        yield calls
    finally:
        FAMILIES[family], ROWS[i] = row, row


def _inputs(seed, masked):
    f = make_rollout(2, 9, seed=seed, dtype=torch.float64, p_masked=0.25 if masked else 0.0, garbage=False,
                     device=DEV)
    for k in FLOATS:
        f[k] = torch.nan_to_num(f[k])
    if not masked:
        f["mask"] = None
    return f


@pytest.mark.covering  # every pair of parameter values by default, the rest -m exhaustive
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
@pytest.mark.parametrize("name", list(PARAMS))
def test_gradcheck(name, backend, masked):
    f = _inputs(3, masked)
    keys = [k for k in FLOATS if f.get(k) is not None]

    def fn(*xs):
        g = dict(f, **dict(zip(keys, xs)))
        out = run_estimator(name, g, backend=backend, **PARAMS[name])
        return tuple(out) if isinstance(out, tuple) else out

    xs = [f[k].clone().requires_grad_() for k in keys]
    assert torch.autograd.gradcheck(fn, xs, check_undefined_grad=False, fast_mode=backend != "torch")


@pytest.mark.parametrize("name", list(PARAMS))
def test_backend_gradients_equal_reference_gradients(name):
    """The same vector-Jacobian product on every backend: the reference loop's autograd graph, the
    torch backend's analytic scan adjoint, the fused kernel's forward with its backward."""
    f = _inputs(11, True)
    keys = [k for k in FLOATS if f.get(k) is not None]
    g = torch.Generator().manual_seed(2)
    grads = {}
    for backend in ("reference", "torch", "triton"):
        xs = [f[k].clone().requires_grad_() for k in keys]
        out = run_estimator(name, dict(f, **dict(zip(keys, xs))), backend=backend, **PARAMS[name])
        out = out if isinstance(out, tuple) else (out,)
        g.manual_seed(2)
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.device, o.dtype)).sum()
                   for o in out)
        grads[backend] = torch.autograd.grad(loss, xs, allow_unused=True)
    for backend in ("torch", "triton"):
        for k, ga, gb in zip(keys, grads["reference"], grads[backend]):
            a = torch.zeros_like(f[k]) if ga is None else ga
            b = torch.zeros_like(f[k]) if gb is None else gb
            torch.testing.assert_close(b, a, msg=lambda m: f"{backend} d/d{k}: {m}")


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("name", ["gae", "lambda_returns", "discounted_returns", "vtrace", "retrace"])
def test_terminated_window_end_gets_no_bootstrap_gradient(name, masked):
    """A row whose window end (its last unmasked step) terminated never reads V(s_T): its bootstrap
    value gets no gradient, on every backend; a truncated window end next to it does."""
    f = _inputs(5, masked)
    live = f["mask"] if masked else torch.ones_like(f["terminated"])
    idx = torch.arange(9, device=DEV)
    end = torch.where(live, idx, -1).amax(-1)
    assert (end >= 0).all()
    k, tr = f["terminated"].clone(), f["truncated"].clone()
    k[0, end[0]], tr[0, end[0]] = True, False  # row 0: terminated window end
    k[1, end[1]], tr[1, end[1]] = False, True  # row 1: truncated window end
    f = dict(f, terminated=k, truncated=tr)
    keys = [k for k in FLOATS if f.get(k) is not None]
    grads = {}
    for backend in ("reference", "torch", "triton"):
        xs = [f[k].clone().requires_grad_() for k in keys]
        out = run_estimator(name, dict(f, **dict(zip(keys, xs))), backend=backend, **PARAMS[name])
        out = out if isinstance(out, tuple) else (out,)
        gb = torch.autograd.grad(sum(o.sum() for o in out), xs, allow_unused=True)[keys.index("bootstrap_values")]
        grads[backend] = torch.zeros_like(f["bootstrap_values"]) if gb is None else gb
    assert grads["reference"][0, end[0]] == 0 and grads["reference"][1, end[1]] != 0
    for backend in ("torch", "triton"):
        torch.testing.assert_close(grads[backend], grads["reference"], msg=lambda m: f"{backend}: {m}")


@pytest.mark.parametrize("name", ["gae", "vtrace", "retrace", "eligibility_traces"])
def test_carry_and_initial_gradients(name):
    """Gradients flow into the chaining carry (backward) and ``initial`` (forward) too."""
    from rollbuf import functional as F

    f = _inputs(5, True)
    if name == "eligibility_traces":
        init = torch.randn(2, dtype=torch.float64, device=DEV, requires_grad=True)

        def fn(init):
            return F.eligibility_traces(f["rewards"], 0.9, 0.8, init, terminated=f["terminated"],
                                        truncated=f["truncated"], mask=f["mask"], backend="triton")
    else:
        shape = (2, 2) if name == "vtrace" else (2,)
        init = torch.randn(*shape, dtype=torch.float64, device=DEV, requires_grad=True)

        def fn(init):
            return run_estimator(name, f, backend="triton", carry=init, **PARAMS[name])

    assert torch.autograd.gradcheck(fn, (init,), check_undefined_grad=False)


def test_triton_gradients_equal_torch_gradients():
    f = make_rollout(3, 41, seed=7, p_masked=0.2, garbage=False, device=DEV)
    for k in FLOATS:
        f[k] = torch.nan_to_num(f[k])
    grads = {}
    for backend in ("torch", "triton"):
        r = f["rewards"].clone().requires_grad_()
        v = f["values"].clone().requires_grad_()
        adv, ret = run_estimator("gae", dict(f, rewards=r, values=v), backend=backend, gamma=0.99, lam=0.95)
        (adv.square().sum() + ret.sum()).backward()
        grads[backend] = (r.grad, v.grad)
    for a, b in zip(grads["torch"], grads["triton"]):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
def test_affine_scan_gradients(backend, reverse):
    """The public primitive is differentiable in α, β and ``initial`` (linear-recurrence layers)."""
    from rollbuf import functional as F

    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 13, generator=g, dtype=torch.float64).to(DEV).requires_grad_()
    b = (0.3 + 0.6 * torch.rand(2, 13, generator=g, dtype=torch.float64)).to(DEV).requires_grad_()
    init = torch.randn(2, generator=g, dtype=torch.float64).to(DEV).requires_grad_()
    fn = lambda a, b, i: F.affine_scan(a, b, reverse, i, backend=backend)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (a, b, init), fast_mode=backend == "triton")


@pytest.mark.parametrize("fused", [False, True], ids=["torch-scan", "kernel-scan"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
def test_adjoint_scan_gradient(reverse, fused):
    """AffineScanFunction's analytic backward (the adjoint scan), on the blocked torch scan and on
    the fused kernel, against finite differences; T straddles the blocked scan's block size."""
    from rollbuf.backends import scan

    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 3, 37, generator=g, dtype=torch.float64).to(DEV).requires_grad_()
    b = (0.2 + 0.7 * torch.rand(2, 3, 37, generator=g, dtype=torch.float64)).to(DEV).requires_grad_()
    init = torch.randn(2, 3, generator=g, dtype=torch.float64).to(DEV).requires_grad_()
    fn = lambda a, b, i: scan.AffineScanFunction.apply(a, b, i, reverse, fused)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (a, b, init), fast_mode=fused)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PARAMS))
def test_full_size_gradients_on_gpu(name):
    """fp32 gradients of the triton backend (fused forward and scans) against float64 gradients of
    the torch backend, on 8 rows of 65537 steps with every boundary kind."""
    f = make_rollout(8, 65537, seed=4, p_masked=0.2, garbage=False, device="cuda")
    for k in FLOATS:
        f[k] = torch.nan_to_num(f[k])
    keys = [k for k in FLOATS if f.get(k) is not None]
    grads = {}
    for backend, dt in (("torch", torch.float64), ("triton", torch.float32)):
        xs = [f[k].to(dt).requires_grad_() for k in keys]
        out = run_estimator(name, dict(f, **dict(zip(keys, xs))), backend=backend, **PARAMS[name])
        out = out if isinstance(out, tuple) else (out,)
        g = torch.Generator(device="cuda").manual_seed(3)  # the same float64 draws for both dtypes
        loss = sum((o * torch.randn(o.shape, generator=g, device="cuda", dtype=torch.float64).to(o.dtype)).sum()
                   for o in out)
        grads[backend] = torch.autograd.grad(loss, xs, allow_unused=True)
    for k, a, b in zip(keys, grads["torch"], grads["triton"]):
        if a is None and b is None:
            continue
        err = ((b.double() - a).norm() / a.norm().clamp_min(1e-30)).item()
        assert err < 1e-4, f"{name} d/d{k}: relative error {err:.2e}"


@pytest.mark.parametrize("variant", ["carry-out", "terminal", "boot-vector", "boot-vector-truncated", "carry-in",
                                     "mc"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_lambda_family_adjoint_variants(backend, variant):
    """The TD(λ) family's analytic adjoint (triton) at every way the window end is fed: the carry
    out differentiated, a terminal window end, ``[N]`` bootstrap values (without truncations, and
    with truncations at the window end only: the column is then read as ``[N, T]`` values holding it
    at the window end), an explicit carry in, and Monte-Carlo returns (no bootstrap)."""
    from rollbuf import functional as F

    f = _inputs(8, True)
    with _adjoint_calls(Family.TD_LAMBDA) as calls:
        kw = dict(terminated=f["terminated"], truncated=f["truncated"], mask=f["mask"], backend=backend)
        if variant == "boot-vector":
            kw["truncated"] = None
        if variant == "boot-vector-truncated":  # truncations at each row's window end only
            from rollbuf import windows

            m = f["mask"] != 0
            end = windows.window_end_index(m, m.shape, m.device)
            kw["truncated"] = torch.arange(m.shape[-1], device=DEV) == end.unsqueeze(-1)
        init = torch.randn(2, dtype=torch.float64, device=DEV, requires_grad=True)
        boot = f["bootstrap_values"][:, -1].clone() if variant.startswith("boot-vector") else f["bootstrap_values"]

        def fn(r, v, bv, init):
            if variant == "mc":
                return F.discounted_returns(0.9, rewards=r, bootstrap=False, **kw)
            extra = dict(bootstrap_values=bv)
            if variant == "carry-in":  # the carry replaces the window-end bootstrap
                extra["carry"] = init
            if variant == "terminal":
                extra["window_end"] = "terminal"
            out = F.gae(0.9, 0.8, rewards=r, values=v, return_carry=variant == "carry-out", **extra, **kw)
            if variant == "carry-out":
                (adv, ret), carry = out
                return adv, ret, carry
            return tuple(out)

        xs = (f["rewards"].clone().requires_grad_(), f["values"].clone().requires_grad_(),
              boot.clone().requires_grad_(), init)
        assert torch.autograd.gradcheck(fn, xs, check_undefined_grad=False, fast_mode=backend == "triton")
    assert bool(calls) == (backend == "triton")  # the triton backward used the analytic adjoint


@pytest.mark.parametrize("name", ["eligibility_traces", "episodic_sums"])
def test_trace_adjoint_with_features_and_initial(name):
    """The forward estimators' analytic adjoint (triton backward) with per-feature traces ``[N, T, F]``,
    ``initial`` and ``final`` both in the loss, against finite differences."""
    from rollbuf import functional as F

    f = _inputs(12, True)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 9, 3, generator=g, dtype=torch.float64).to(DEV).requires_grad_()
    init = torch.randn(2, 3, generator=g, dtype=torch.float64).to(DEV).requires_grad_()
    kw = dict(terminated=f["terminated"], truncated=f["truncated"], mask=f["mask"], backend="triton")
    with _adjoint_calls(Family.FORWARD) as calls:
        if name == "eligibility_traces":
            fn = lambda x, i: tuple(F.eligibility_traces(x, 0.9, 0.8, i, **kw))  # noqa: E731
        else:
            fn = lambda x, i: tuple(F.episodic_sums(x, i, **kw))  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x, init), check_undefined_grad=False, fast_mode=True)
    assert calls


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_retrace_adjoint_with_clipping_and_carry_out(masked):
    """Retrace's analytic adjoint (triton backward, from the saved output Q) with the trace clipped
    at c̄ = 1 on many steps and the carry out in the loss: the same VJP as the torch backend."""
    from rollbuf import functional as F

    f = _inputs(13, masked)
    keys = ("rewards", "values", "bootstrap_values", "log_probs", "target_log_probs", "q_values")
    grads = {}
    with _adjoint_calls(Family.RETRACE) as calls:
        for backend in ("torch", "triton"):
            xs = [f[k].clone().requires_grad_() for k in keys]
            d = dict(zip(keys, xs))
            q, carry = F.retrace(d["q_values"], d["target_log_probs"], 0.9, 0.8, 1.0, log_probs=d["log_probs"],
                                 rewards=d["rewards"], values=d["values"], terminated=f["terminated"],
                                 truncated=f["truncated"], bootstrap_values=d["bootstrap_values"], mask=f["mask"],
                                 return_carry=True, backend=backend)
            g = torch.Generator().manual_seed(6)
            loss = (q * torch.randn(q.shape, generator=g, dtype=torch.float64).to(DEV)).sum() + 2.0 * carry.sum()
            grads[backend] = torch.autograd.grad(loss, xs)
    assert calls
    ratio = (f["target_log_probs"] - f["log_probs"]).exp()
    assert (ratio > 1.0).float().mean() > 0.2  # the clip is active on many steps
    for k, a, b in zip(keys, grads["torch"], grads["triton"]):
        torch.testing.assert_close(b, a, msg=lambda m_: f"d/d{k}: {m_}")


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_vtrace_adjoint_with_clipping_and_carry_out(masked):
    """V-trace's analytic adjoint (triton backward, from the saved output vs) with ρ̄ = c̄ = ρ̄_pg = 1
    (the clips active on many steps), both outputs and the carry out in the loss: the same VJP as the
    torch backend; and with an explicit carry in."""
    from rollbuf import functional as F

    f = _inputs(14, masked)
    keys = ("rewards", "values", "bootstrap_values", "log_probs", "target_log_probs")
    with _adjoint_calls(Family.VTRACE) as calls:
        for carry_in in (False, True):
            grads = {}
            for backend in ("torch", "triton"):
                xs = [f[k].clone().requires_grad_() for k in keys]
                init = torch.tensor([[0.3, -1.2], [0.7, 2.0]], dtype=torch.float64, device=DEV, requires_grad=True)
                d = dict(zip(keys, xs))
                (vs, pg), carry = F.vtrace(d["target_log_probs"], 0.9, 1.0, 1.0, 1.0, 0.85, log_probs=d["log_probs"],
                                           rewards=d["rewards"], values=d["values"], terminated=f["terminated"],
                                           truncated=f["truncated"], bootstrap_values=d["bootstrap_values"],
                                           mask=f["mask"], carry=init if carry_in else None, return_carry=True,
                                           backend=backend)
                g = torch.Generator().manual_seed(7)
                w = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(DEV) for o in (vs, pg, carry)]
                loss = (vs * w[0]).sum() + (pg * w[1]).sum() + (carry * w[2]).sum()
                grads[backend] = torch.autograd.grad(loss, xs + [init], allow_unused=True)
            for k, ga, gb in zip(keys + ("carry",), grads["torch"], grads["triton"]):
                a = torch.zeros(()) if ga is None else ga
                b = torch.zeros(()) if gb is None else gb
                torch.testing.assert_close(b.cpu(), a.cpu(), msg=lambda m_: f"carry_in={carry_in} d/d{k}: {m_}")
    assert calls
    ratio = (f["target_log_probs"] - f["log_probs"]).exp()
    assert (ratio > 1.0).float().mean() > 0.2


@pytest.mark.parametrize("name", ["gae", "vtrace", "retrace", "eligibility_traces"])
def test_gradients_of_empty_windows(name):
    """T = 0: the carry passes straight through; its gradient does too, on both backends."""
    from rollbuf import functional as F

    res = {}
    for backend in ("torch", "triton"):
        z = torch.zeros(2, 0, dtype=torch.float64, device=DEV, requires_grad=True)
        if name == "eligibility_traces":
            init = torch.tensor([0.5, -1.0], dtype=torch.float64, device=DEV, requires_grad=True)
            e, final = F.eligibility_traces(z, 0.9, 0.8, init, terminated=torch.zeros(2, 0, dtype=torch.bool,
                                                                                     device=DEV), backend=backend)
            loss = (final * torch.tensor([2.0, 3.0], dtype=torch.float64, device=DEV)).sum() + e.sum()
            res[backend] = torch.autograd.grad(loss, [z, init])
            continue
        shape = (2, 2) if name == "vtrace" else (2,)
        init = torch.arange(1.0, 1.0 + torch.Size(shape).numel(), dtype=torch.float64, device=DEV).reshape(shape)
        init.requires_grad_()
        kw = dict(rewards=z, values=z, carry=init, return_carry=True, backend=backend)
        if name == "gae":
            (a, g), carry = F.gae(0.9, 0.8, **kw)
            outs = (a, g)
        elif name == "vtrace":
            (vs, pg), carry = F.vtrace(z, 0.9, log_probs=z, **kw)
            outs = (vs, pg)
        else:
            q, carry = F.retrace(z, z, 0.9, 0.8, log_probs=z, **kw)
            outs = (q,)
        loss = sum(o.sum() for o in outs) + (carry * 3.0).sum()
        res[backend] = torch.autograd.grad(loss, [z, init], allow_unused=True)
    for a, b in zip(res["torch"], res["triton"]):
        torch.testing.assert_close(b, a)
    assert res["triton"][1] is not None and bool((res["triton"][1] != 0).all())
