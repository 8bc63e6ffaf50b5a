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

BACKENDS = ["torch"] + (["triton"] if backends.triton_available() else [])
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BACKWARD + ["eligibility_traces", "episodic_sums"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_a_non_finite_reward_gives_the_reference_answer(backend, name, value):
    """One non-finite reward: every backend gives the reference's outputs, NaN for NaN (a backward estimator carries it to the earlier steps of its row, across episode ends too:
    the recursions multiply the next step's state by a zero discount there, and 0·NaN = NaN)."""
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
    field): torch and triton give the reference's answer — non-finite where it is, the same values
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
    with rollbuf.check_finite():
        with pytest.raises(ValueError, match=r"rewards is not finite at row 2, step 7"):
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
