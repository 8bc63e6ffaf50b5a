"""Edge cases tried as a user would: empty windows, rows without a batch dimension, overflowing
importance ratios, non-finite inputs (the same answer on every backend, docs/semantics.md "Non-finite
inputs"), the non-finite input check, and Rollout construction and recording mistakes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rollbuf
from rollbuf import Rollout, backends
from rollbuf import functional as F
from rollbuf.testing import assert_close_to_reference, make_rollout, reference_outputs, run_estimator

# every backend but the reference (numba: the ``auto`` backend on CPU tensors; triton: CUDA, or the
# interpreter on CPU tensors, so its cases stay small)
BACKENDS = (["torch"] + (["numba"] if backends.numba_available() else [])
            + (["triton"] if backends.triton_available() else []))
ALL = ["reference"] + BACKENDS
BACKWARD = ["gae", "advantages", "lambda_returns", "discounted_returns", "monte_carlo_returns", "vtrace",
            "retrace"]
PARAMS = dict(gamma=0.9, lam=0.8)


def _dev(backend):
    """Compiled kernels run on CUDA tensors (a GPU machine); elsewhere the interpreter takes CPU ones."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def _to(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, tuple):
        return type(x)(*(_to(e, dev) for e in x)) if hasattr(x, "_fields") else tuple(_to(e, dev) for e in x)
    if isinstance(x, dict):
        return {k: _to(v, dev) for k, v in x.items()}
    return x


def _run(name, f, backend, **kw):
    """``run_estimator`` on the backend's device, the outputs back on the CPU."""
    return _to(run_estimator(name, _to(f, _dev(backend)), backend=backend, **kw), "cpu")


def _params(name):
    if name in ("discounted_returns", "monte_carlo_returns"):
        return dict(gamma=0.9)
    if name == "episodic_sums":
        return {}
    return dict(PARAMS)


# ------------------------------------------------------------------ rows with no batch dimension


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("name", ["eligibility_traces", "episodic_sums"])
def test_forward_estimators_take_a_bare_row(backend, name):
    f = make_rollout(1, 13, seed=2, p_masked=0.2)
    row = {k: (v[0] if isinstance(v, torch.Tensor) else v) for k, v in f.items()}
    got = _run(name, row, backend, **_params(name))
    want = _run(name, f, backend, **_params(name))
    assert got[0].shape == (13,) and got[1].shape == ()
    torch.testing.assert_close(got[0], want[0][0])
    torch.testing.assert_close(got[1], want[1][0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BACKWARD)
def test_return_carry_on_a_bare_row(backend, name):
    f = make_rollout(1, 11, seed=3, p_masked=0.2)
    row = {k: (v[0] if isinstance(v, torch.Tensor) else v) for k, v in f.items()}
    out, carry = _run(name, row, backend, return_carry=True, **_params(name))
    out1, carry1 = _run(name, f, backend, return_carry=True, **_params(name))
    assert carry.shape == carry1.shape[1:]
    torch.testing.assert_close(carry, carry1[0])
    first = out[0] if isinstance(out, tuple) else out
    first1 = out1[0] if isinstance(out1, tuple) else out1
    torch.testing.assert_close(first, first1[0])


# ------------------------------------------------------------- overflowing importance ratios


@pytest.mark.parametrize("backend,dtype", [("reference", torch.float64)]  # the reference computes in float64
                         + [(b, d) for b in BACKENDS for d in (torch.float32, torch.float64)])
def test_clipped_ratio_gradients_stay_finite_when_exp_overflows(backend, dtype):
    """exp(log π − log μ) overflows (≥ 88.8 in fp32, ≥ 709.8 in fp64) where the clip is active: the
    clipped ratio is ρ̄ there and its gradient 0, never 0·inf = NaN."""
    g = torch.Generator().manual_seed(0)
    dev = _dev(backend)
    big = 100.0 if dtype == torch.float32 else 800.0
    tlp = torch.where(torch.rand(2, 9, generator=g) < 0.5, big, -0.3).to(dev, dtype).requires_grad_()
    lp = torch.zeros(2, 9, dtype=dtype, device=dev, requires_grad=True)
    kw = dict(rewards=torch.randn(2, 9, generator=g, dtype=dtype).to(dev),
              values=torch.randn(2, 9, generator=g, dtype=dtype).to(dev),
              bootstrap_values=torch.zeros(2, dtype=dtype, device=dev), backend=backend)
    vs, pg = F.vtrace(tlp, 0.9, log_probs=lp, **kw)
    q = F.retrace(torch.randn(2, 9, generator=g, dtype=dtype).to(dev), tlp, 0.9, lam=0.9, log_probs=lp, **kw)
    for out in ((vs.sum() + pg.sum()), q.sum()):
        assert torch.isfinite(out)
        g_t, g_l = torch.autograd.grad(out, (tlp, lp))
        assert torch.isfinite(g_t).all() and torch.isfinite(g_l).all()


@pytest.mark.parametrize("backend,dtype", [("reference", torch.float64)]
                         + [(b, d) for b in BACKENDS for d in (torch.float32, torch.float64)])
def test_overflowing_ratio_is_clipped_to_the_bar(backend, dtype):
    """Without gradients too (the compiled CPU loops run then): exp(log π − log μ) = inf is clipped
    to ρ̄ / c̄ like any ratio above them, so the outputs stay finite and equal the reference's."""
    g = torch.Generator().manual_seed(1)
    big = 100.0 if dtype == torch.float32 else 800.0
    f = dict(rewards=torch.randn(2, 9, generator=g, dtype=dtype), values=torch.randn(2, 9, generator=g, dtype=dtype),
             log_probs=torch.zeros(2, 9, dtype=dtype), q_values=torch.randn(2, 9, generator=g, dtype=dtype),
             target_log_probs=torch.where(torch.rand(2, 9, generator=g) < 0.5, big, -0.3).to(dtype),
             bootstrap_values=torch.zeros(2, dtype=dtype), terminated=None, truncated=None, mask=None)
    for name, params in (("vtrace", dict(gamma=0.9, rho_bar=1.0, c_bar=0.8, lam=0.9)),
                         ("retrace", dict(gamma=0.9, lam=0.9, c_bar=1.2))):
        got = _run(name, f, backend, **params)
        got = got if isinstance(got, tuple) else (got,)
        for a, e in zip(got, reference_outputs(name, f, **params)):
            assert torch.isfinite(a).all(), (name, a)
            assert_close_to_reference(a, e, f, direction="backward")


def _log_prob_grads(name, backend, target):
    """d/d(target_log_probs), d/d(log_probs) of a V-trace / Retrace loss on ``backend`` (bars 1),
    behaviour log-probabilities 0, so the ratio is exp(target); back on the CPU."""
    dev = _dev(backend)
    g = torch.Generator().manual_seed(3)
    kw = dict(rewards=torch.randn(2, 5, generator=g, dtype=torch.float64).to(dev),
              values=torch.randn(2, 5, generator=g, dtype=torch.float64).to(dev),
              terminated=torch.tensor([[False, False, True, False, False]] * 2).to(dev),
              bootstrap_values=torch.zeros(2, dtype=torch.float64, device=dev), backend=backend)
    q = torch.randn(2, 5, generator=g, dtype=torch.float64).to(dev)
    tlp = target.to(dev, torch.float64).requires_grad_()
    lp = torch.zeros(2, 5, dtype=torch.float64, device=dev, requires_grad=True)
    if name == "vtrace":
        vs, pg = F.vtrace(tlp, 0.9, 1.0, 1.0, 1.0, 0.9, log_probs=lp, **kw)
        out = (0.7 * vs + pg).sum()
    else:
        out = F.retrace(q, tlp, 0.9, 0.9, 1.0, log_probs=lp, **kw).sum()
    return tuple(None if x is None else x.cpu() for x in torch.autograd.grad(out, (tlp, lp), allow_unused=True))


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("name", ["vtrace", "retrace"])
def test_log_probs_clipped_at_every_step_get_a_zero_gradient(backend, name):
    """Every ratio above its bar (finite, and an overflowing exp): the log-probabilities get a
    gradient tensor of zeros on every backend (the reference's loop included), not None."""
    zero = torch.zeros(2, 5, dtype=torch.float64)
    for big in (3.0, 800.0):
        g_t, g_l = _log_prob_grads(name, backend, torch.full((2, 5), big))
        assert g_t is not None and g_l is not None, "the log-probabilities got no gradient"
        assert torch.equal(g_t, zero) and torch.equal(g_l, zero), (g_t, g_l)


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("name", ["vtrace", "retrace"])
def test_ratio_at_the_clip_point_passes_its_gradient(backend, name):
    """Ratio = bar at every step (on-policy data, bars 1): the ratio's gradient passes, as
    torch.clamp's does, on every backend alike (the reference's loop included)."""
    g_t, g_l = _log_prob_grads(name, backend, torch.zeros(2, 5))
    w_t, w_l = _log_prob_grads(name, "torch", torch.zeros(2, 5))
    assert g_t is not None and w_t.abs().sum() > 0
    torch.testing.assert_close(g_t, w_t)
    torch.testing.assert_close(g_l, w_l)


# ----------------------------------------------------------------------- non-finite inputs


def _same_non_finite(a, e, fields, nan_exact):
    """``a`` has the reference's non-finite outputs (NaN for NaN when ``nan_exact``: ±inf inputs may
    give inf on one backend and NaN on another, as ∞ − ∞ depends on the order of operations) and
    its values everywhere else."""
    bad_a, bad_e = ~torch.isfinite(a), ~torch.isfinite(e)
    assert torch.equal(bad_a, bad_e), (a, e)
    if nan_exact:
        assert torch.equal(torch.isnan(a), torch.isnan(e)), (a, e)
    zero = torch.zeros((), dtype=a.dtype)
    assert_close_to_reference(torch.where(bad_a, zero, a), torch.where(bad_e, zero.double(), e), fields,
                              direction="backward")



@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["vtrace", "retrace"])
def test_nan_log_prob_gives_nan_on_every_backend(backend, name):
    f = make_rollout(2, 9, seed=4, p_masked=None, p_truncated=0.0)
    f["log_probs"] = f["log_probs"].clone()
    f["log_probs"][0, 5] = float("nan")
    got = _run(name, f, backend, **PARAMS)
    want = reference_outputs(name, f, **PARAMS)
    got = got if isinstance(got, tuple) else (got,)
    assert torch.isnan(want[0][0]).any()  # the reference propagates it (no min(ρ̄, nan) = ρ̄)
    for a, e in zip(got, want):
        _same_non_finite(a, e, f, nan_exact=True)


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("case", ["nan", "both-inf"])
def test_an_undefined_ratio_is_not_clipped_to_the_bar(backend, case):
    """A NaN log-probability, or both log-probabilities -inf (exp(−inf + inf) = exp(NaN)): the
    ratio is NaN, min(ρ̄, NaN) = NaN (not ρ̄), so V-trace's vs and pg and Retrace's targets are NaN
    at that step and every earlier one of the row, and finite after it."""
    dev = _dev(backend)
    nan, inf = float("nan"), float("inf")
    lp = torch.tensor([[0.0, 0.0, nan if case == "nan" else -inf, 0.0], [0.0] * 4])
    tlp = torch.tensor([[0.0, 0.0, 0.0 if case == "nan" else -inf, 0.0], [0.0] * 4])
    kw = dict(rewards=torch.ones(2, 4, device=dev), values=torch.zeros(2, 4, device=dev),
              log_probs=lp.to(dev), terminated=torch.zeros(2, 4, dtype=torch.bool, device=dev),
              bootstrap_values=torch.zeros(2, device=dev), backend=backend)
    vs, pg = F.vtrace(tlp.to(dev), 0.9, **kw)
    q = F.retrace(torch.zeros(2, 4, device=dev), tlp.to(dev), 0.9, 0.9, **kw)
    undefined = torch.tensor([[True, True, True, False], [False] * 4])
    for out in (vs, pg):
        assert torch.equal(torch.isnan(out.cpu()), undefined), out
    # Q_t reads the trace c_{t+1} of the next step, not its own: finite at the step itself
    assert torch.equal(torch.isnan(q.cpu()), undefined & torch.tensor([True, True, False, False])), q
    torch.testing.assert_close(vs.cpu()[1], torch.tensor([3.439, 2.71, 1.9, 1.0]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["vtrace", "retrace"])
def test_an_undefined_ratio_gives_the_gradients_of_the_torch_backend(backend, name):
    """A NaN log-probability: every backend's gradients (the analytic adjoints of the ``triton`` backend
    included, whose clipped ratio keeps the NaN as the forward's does) are the torch backend's autograd's,
    NaN where it gives NaN."""
    dev = _dev(backend)
    f = make_rollout(2, 6, seed=5, p_masked=None, p_truncated=0.0)
    f["target_log_probs"] = f["target_log_probs"].clone()
    f["target_log_probs"][0, 3] = float("nan")

    def grads(b):
        kw = {k: f[k].to(dev) for k in ("rewards", "values", "q_values", "log_probs", "target_log_probs")
              if name == "retrace" or k != "q_values"}
        for x in kw.values():
            x.requires_grad_()
        out = F.estimate(name, backend=b, gamma=0.9, lam=0.8, c_bar=0.9, terminated=f["terminated"].to(dev),
                         bootstrap_values=f["bootstrap_values"].to(dev), **kw)
        out = out if isinstance(out, tuple) else (out,)
        loss = sum((o.nan_to_num() * (i + 1.5)).sum() for i, o in enumerate(out))
        return [g.cpu() for g in torch.autograd.grad(loss, list(kw.values()))]

    got, want = grads(backend), grads("torch")
    assert any(g.isnan().any() for g in want)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, equal_nan=True)


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("name", ["eligibility_traces", "episodic_sums"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("where", ["x", "initial"])
def test_a_non_finite_forward_input_reaches_every_later_step(backend, name, value, where):
    """A forward estimator resets its state at an episode end by multiplying it by 0, so a NaN or
    inf at or before a done step still reaches every later step and ``final`` (0·NaN = NaN,
    0·inf = NaN), on every backend alike."""
    dev = _dev(backend)
    x = torch.tensor([[1.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]])
    initial = torch.zeros(2)
    if where == "x":
        x[0, 0] = value  # a terminated step
    else:
        initial[0] = value  # row 0's state before its first (terminated) step
    k = torch.tensor([[True, False, False, False], [False, True, False, False]])
    tr = torch.tensor([[False, False, True, False], [False] * 4])

    def call(b, d):
        kw = dict(terminated=k.to(d), truncated=tr.to(d), backend=b)
        if name == "episodic_sums":
            res = F.episodic_sums(x.to(d), initial.to(d), **kw)
        else:
            res = F.eligibility_traces(x.to(d), 0.9, 0.8, initial.to(d), **kw)
        return tuple(r.cpu() for r in res)

    out, final = call(backend, dev)
    assert torch.isnan(out[0, 1:]).all() and torch.isnan(final[0]), (out, final)
    assert not torch.isfinite(out[0, 0])
    assert torch.isfinite(out[1]).all() and torch.isfinite(final[1])  # other rows are unaffected
    want = call("reference", "cpu")
    torch.testing.assert_close(out, want[0], equal_nan=True, check_dtype=False)
    torch.testing.assert_close(final, want[1], equal_nan=True, check_dtype=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BACKWARD + ["eligibility_traces", "episodic_sums"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_a_non_finite_reward_gives_the_reference_answer(backend, name, value):
    """One non-finite reward: every backend gives the reference's outputs, NaN for NaN (a backward
    estimator carries it to the earlier steps of its row, across episode ends too: the recursions
    multiply the next step's state by a zero discount there, and 0·NaN = NaN)."""
    f = make_rollout(3, 17, seed=5, p_masked=0.2)
    f["rewards"] = f["rewards"].clone()
    f["mask"][1, 8] = True
    f["rewards"][1, 8] = value
    got = _run(name, f, backend, **_params(name))
    want = reference_outputs(name, f, **_params(name))
    got = got if isinstance(got, tuple) else (got,)
    for a, e in zip(got, want):
        _same_non_finite(a, e, f, nan_exact=value != value)


@st.composite
def _poisoned(draw):
    name = draw(st.sampled_from(BACKWARD + ["eligibility_traces", "episodic_sums"]))
    n, t = draw(st.integers(1, 3)), draw(st.integers(1, 40))
    f = make_rollout(n, t, seed=draw(st.integers(0, 2**16)), p_masked=draw(st.sampled_from([None, 0.3])),
                     p_terminated=0.1, p_truncated=0.1)
    fields = [k for k in ("rewards", "values", "log_probs", "target_log_probs", "q_values", "bootstrap_values")
              if f.get(k) is not None]
    for _ in range(draw(st.integers(1, 3))):
        k = draw(st.sampled_from(fields))
        x = f[k].clone()
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, t - 1))
        x[i, j] = draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
        f[k] = x
    return name, f


@settings(max_examples=60)
@given(case=_poisoned(), backend=st.sampled_from(BACKENDS))
def test_property_non_finite_inputs_match_the_reference(case, backend):
    """Non-finite values at read and unread positions (masked steps, unread bootstrap slots, any
    field): every backend gives the reference's answer — non-finite where it is, the same values
    elsewhere, NaN for NaN when the inputs hold no inf."""
    name, f = case
    got = _run(name, f, backend, **_params(name))
    want = reference_outputs(name, f, **_params(name))
    got = got if isinstance(got, tuple) else (got,)
    no_inf = not any(torch.isinf(x).any() for x in f.values() if isinstance(x, torch.Tensor) and x.is_floating_point())
    for a, e in zip(got, want):
        _same_non_finite(a, e, f, nan_exact=no_inf)


# ------------------------------------------------------------------- the non-finite input check


def test_check_finite_names_the_first_non_finite_input_read():
    f = make_rollout(4, 12, seed=6, p_masked=None, p_truncated=0.0)
    r = f["rewards"].clone()
    r[2, 7] = float("nan")
    kw = dict(rewards=r, values=f["values"], terminated=f["terminated"], bootstrap_values=torch.zeros(4))
    assert torch.isnan(F.gae(0.9, 0.8, **kw).advantages[2]).any()  # off: NaN flows to the outputs
    with rollbuf.check_finite(), pytest.raises(ValueError, match=r"rewards is not finite at row 2, step 7"):
        F.gae(0.9, 0.8, **kw)
    F.gae(0.9, 0.8, **kw)  # off again after the block


def test_check_finite_ignores_what_is_not_read():
    """NaN at masked steps and in unread bootstrap slots cannot reach an output: not reported."""
    f = make_rollout(3, 20, seed=7, p_masked=0.4)  # garbage at masked steps, NaN in unread slots
    with rollbuf.check_finite():
        for name in BACKWARD:
            run_estimator(name, f, backend="torch", **_params(name))


def test_check_finite_names_a_bootstrap_value_and_a_batch_index():
    v = torch.zeros(2, 3, 5)
    bv = torch.zeros(2, 3)
    bv[1, 2] = float("inf")
    with rollbuf.check_finite():
        with pytest.raises(ValueError, match=r"bootstrap_values is not finite at row \(1, 2\)"):
            F.lambda_returns(0.9, 0.8, rewards=v, values=v, bootstrap_values=bv)
        F.lambda_returns(0.9, 0.8, rewards=v, values=v, bootstrap_values=bv, window_end="terminal")


# -------------------------------------------------------------- Rollout construction and record


def test_rollout_without_batch_size_is_refused():
    x = torch.zeros(3, 5)
    with pytest.raises(ValueError, match=r"batch_size=\[\*B, T\].*batch_size=\[3, 5\]"):
        Rollout(rewards=x, values=x, terminated=x.bool())
    with pytest.raises(ValueError, match="batch_size"):
        Rollout(rewards=x, values=x, terminated=x.bool(), batch_size=[3])
    ro = Rollout(rewards=x, values=x, terminated=x.bool(), batch_size=[3, 5])
    assert ro[:2].batch_size == torch.Size([2, 5])


@pytest.mark.parametrize("t", [1, np.int64(1), torch.tensor(1), -4])
def test_record_takes_any_integer_step(t):
    ro = Rollout.empty(2, 5)
    ro.record(t, rewards=torch.ones(2))
    assert ro.rewards[:, 1].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("t", [True, 1.0, torch.tensor(True), torch.tensor([1]), 5, -6])
def test_record_refuses_a_step_that_is_not_an_index(t):
    with pytest.raises(IndexError, match="t must be an int step index"):
        Rollout.empty(2, 5).record(t, rewards=torch.ones(2))


@pytest.mark.parametrize("t", [5, -6, 16, -17])
def test_record_names_the_range_it_accepts(t):
    """Negative steps count from the end (as Python indexes): the message says [-T, T)."""
    with pytest.raises(IndexError, match=r"t must be an int step index in \[-5, 5\)"):
        Rollout.empty(2, 5).record(t, rewards=torch.ones(2))
    ro = Rollout.empty(2, 16)
    with pytest.raises(IndexError, match=r"in \[-16, 16\)"):
        ro.record(-17, rewards=torch.ones(2))
    ro.record(-16, rewards=torch.ones(2))  # the first step
    assert ro.rewards[:, 0].tolist() == [1.0, 1.0] and ro.rewards[:, 1:].isnan().all()


@pytest.mark.parametrize("n", [-2, (3, -1), 2.5, True])
def test_empty_names_num_envs(n):
    with pytest.raises(ValueError, match="num_envs must be a non-negative int"):
        Rollout.empty(n, 5)


def test_bootstrap_of_a_row_with_no_unmasked_step_ignores_its_masked_flags():
    """A row with no unmasked step passes V(s_T) through in its last column; a flag set at that
    (masked) column must not stop Rollout.bootstrap from writing it."""
    ro = Rollout.empty(1, 3, with_mask=True)
    ro.rewards.zero_()
    ro.values.zero_()
    ro.mask[:] = False
    ro.terminated[0, 2] = True
    ro.bootstrap(torch.tensor([5.0]))
    _, carry = ro.gae(0.9, 0.9, return_carry=True, backend="torch")
    assert carry.tolist() == [5.0]


def test_a_re_registered_estimator_is_validated_from_its_new_entry():
    from rollbuf import estimators
    from rollbuf.estimators import Estimator, Field
    from rollbuf.problem import Family

    def coefficients(f, params):
        return f["rewards"], f["w"]

    def entry(fields):
        return Estimator("toy_rereg", Family.GENERIC, "backward", fields, (), ("y",), None,
                         lambda f, p: None, coefficients=coefficients)

    old = estimators.register(entry((Field("rewards"), Field("w"))))
    try:
        F.estimate("toy_rereg", rewards=torch.zeros(2, 3), w=torch.zeros(2, 3), backend="torch")
        estimators.unregister("toy_rereg")
        estimators.register(entry((Field("rewards"), Field("w"), Field("u"))))
        assert old.field_names == ("rewards", "w")
        with pytest.raises(ValueError, match="u is required"):
            F.estimate("toy_rereg", rewards=torch.zeros(2, 3), w=torch.zeros(2, 3), backend="torch")
        with pytest.raises(ValueError, match="w must have shape"):
            F.estimate("toy_rereg", rewards=torch.zeros(2, 3), w=torch.zeros(3, 2), u=torch.zeros(2, 3),
                       backend="torch")
    finally:
        estimators.unregister("toy_rereg")


def test_return_carry_must_be_a_bool():
    with pytest.raises(TypeError, match="return_carry must be a bool"):
        F.gae(0.9, 0.8, rewards=torch.zeros(2, 3), values=torch.zeros(2, 3), bootstrap_values=torch.zeros(2),
              return_carry=1)
