"""Repeated functional calls on the ``triton`` backend.

Every call is validated; the second call of a signature reuses the kernel launch cached under it
(``rollbuf.kernels.LAUNCHES``) with its own tensors. It must equal the float64 reference on its own
new data, with outputs poisoned with NaN before the launch. Under Triton's interpreter in CI (small
odd shapes); compiled on a GPU machine.
"""

from __future__ import annotations

import attrs
import pytest
import torch

import rollbuf.kernels as K
from rollbuf import estimators, plans, validation
from rollbuf import functional as F
from rollbuf.testing import assert_matches_reference, estimator_call, make_rollout

pytestmark = pytest.mark.interpret

DEV = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = [n for n in estimators.REGISTRY if estimators.REGISTRY[n].family != "generic"]
PARAMS = {"gamma": 0.97, "lam": 0.9, "rho_bar": 1.3, "c_bar": 0.8, "pg_rho_bar": 1.1}


def params(name):
    return {p.name: PARAMS[p.name] for p in estimators.get(name).params if p.name in PARAMS}


@pytest.fixture(autouse=True)
def _poisoned():
    with K.forced(poison=True):  # outputs NaN-filled before every launch: an unwritten element fails
        yield


def _fresh(seed, **kw):
    return make_rollout(3, 37, seed=seed, device=DEV, **kw)


def _launches():
    return set(map(id, plans.launches()))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", ["column", "per-step", "mask", "bf16"])
def test_a_repeated_call_equals_the_reference_on_new_data(name, case):
    """Every estimator, twice with one signature and new data each time: the second call reuses the
    first one's launch (no launch is built) and equals the reference on its own data."""
    kw = dict(p_masked=0.2 if case == "mask" else None)
    if case == "bf16":
        kw["dtype"] = torch.bfloat16
    first, second = _fresh(1, **kw), _fresh(2, **kw)
    if case == "column":  # [N] window-end values, no truncations: read as the kernel's carry in
        for f in (first, second):
            f["truncated"] = None
            f["bootstrap_values"] = f["bootstrap_values"][:, -1].clone()
    prm = params(name)
    estimator_call(name, first, backend="triton", **prm)()
    built = _launches()
    out = estimator_call(name, second, backend="triton", **prm)()
    assert _launches() == built, f"{name} ({case}): a repeated call built another launch"
    assert_matches_reference(name, out, second, **prm)


@pytest.mark.parametrize("name", ["gae", "vtrace", "eligibility_traces"])
def test_repeated_calls_with_reshaped_fields_a_carry_or_a_column(name):
    """A [*B] window-end column with truncations at the window end, batch dimensions flattened by a
    reshape, a carry in: repeated with new data, equal to the reference."""
    prm = params(name)
    forward = estimators.get(name).direction == "forward"
    cases = {"batch [2, 3, T]": dict(batch_shape=(2, 3)), "carry": {}}
    if not forward:
        cases["[N] column with truncations"] = dict()
    for label, kw in cases.items():
        first, second = (make_rollout(t=29, seed=s, device=DEV, **kw) if kw else make_rollout(6, 29, seed=s, device=DEV)
                         for s in (3, 4))
        extra = {}
        if label == "carry":
            shape = (6, 2) if name == "vtrace" else (6,)
            extra = {"initial" if forward else "carry": torch.randn(shape, device=DEV)}
        if label.startswith("[N] column"):  # truncations at the window end only, as a column allows
            for f in (first, second):
                end = f["truncated"][:, -1].clone()
                f["truncated"] = torch.zeros_like(f["truncated"])
                f["truncated"][:, -1] = end | (torch.arange(6, device=DEV) % 2 == 0)
                f["bootstrap_values"] = torch.randn(6, device=DEV)
        estimator_call(name, first, backend="triton", **prm, **extra)()
        out = estimator_call(name, second, backend="triton", **prm, **extra)()
        if label == "carry" and not forward:  # the reference computes whole windows: the torch backend
            want = estimator_call(name, second, backend="torch", **prm, **extra)()
            for a, b in zip(out, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        else:
            assert_matches_reference(name, out, second, **prm, **extra)


def test_repeated_calls_keep_the_data_checks_and_gradients(monkeypatch):
    """check_finite names the bad input, inputs that require grad get gradients; an estimator
    registered again under its name is validated from its new entry."""
    from rollbuf import check_finite

    f = _fresh(5)
    f["truncated"] = None
    f["bootstrap_values"] = f["bootstrap_values"][:, -1].clone()
    kw = dict(rewards=f["rewards"], values=f["values"], terminated=f["terminated"],
              bootstrap_values=f["bootstrap_values"], backend="triton")
    F.advantages(0.97, 0.9, **kw)
    bad = f["rewards"].clone()
    bad[1, 4] = float("nan")
    with check_finite(), pytest.raises(ValueError, match="rewards"):
        F.advantages(0.97, 0.9, **dict(kw, rewards=bad))
    r = f["rewards"].clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.advantages(0.97, 0.9, **dict(kw, rewards=r)).sum(), r)
    assert torch.isfinite(g).all() and g.abs().sum() > 0
    entry_now = estimators.REGISTRY["advantages"]
    new_entry = attrs.evolve(entry_now)  # an equal entry, another object
    monkeypatch.setitem(estimators.REGISTRY, "advantages", new_entry)
    seen = []
    real = validation.prepare
    monkeypatch.setattr(validation, "prepare", lambda est, *a, **k: seen.append(est) or real(est, *a, **k))
    F.advantages(0.97, 0.9, **kw)
    assert len(seen) == 1 and seen[0] is new_entry, "a call under a re-registered name was not validated from its new entry"


def test_outputs_are_allocated_in_the_call_layout():
    """Outputs are allocated like a field of the call's layout (env-major or time-major), or as
    that layout where no field has the output's dtype and shape: strides as the layout rule says."""
    f = _fresh(6)
    r = f["rewards"]
    tm = {k: (v.t().contiguous().t() if isinstance(v, torch.Tensor) and v.dim() == 2 else v)
          for k, v in f.items()}
    for fields, time_major in ((f, False), (tm, True)):
        for out_dtype in (None, torch.float64):
            adv = F.advantages(0.97, 0.9, rewards=fields["rewards"], values=fields["values"],
                               terminated=fields["terminated"], truncated=fields["truncated"],
                               bootstrap_values=fields["bootstrap_values"], out_dtype=out_dtype,
                               backend="triton")
            want = (1, r.shape[0]) if time_major else (r.shape[1], 1)
            assert adv.stride() == want and adv.shape == r.shape
            assert adv.dtype == (out_dtype or torch.float32)
            assert_matches_reference("advantages", adv, fields, gamma=0.97, lam=0.9, rtol=1e-4, atol=5e-5)  # fp32 inputs


def test_the_cache_holds_no_tensor_of_a_call():
    """The launch cache keeps no tensor of a call alive (it holds shapes, strides and dtypes)."""
    import gc
    import weakref

    for column in (True, False):  # the [N] column as the carry in, and [N, T] values with truncations
        f = _fresh(7)
        if column:
            f["truncated"] = None
            f["bootstrap_values"] = f["bootstrap_values"][:, -1].clone()
        refs = [weakref.ref(t) for t in f.values() if isinstance(t, torch.Tensor)]
        out = estimator_call("gae", f, backend="triton", gamma=0.97, lam=0.9)()
        assert plans.launches()
        del f, out
        gc.collect()
        assert all(r() is None for r in refs), "the launch cache holds a caller's tensor"


def test_arguments_are_mapped_to_fields_as_their_spelled_out_call():
    """episodic_sums(rewards=...) is episodic_sums(x=...); discounted_returns(bootstrap=False) given
    bootstrap values it does not read is the call without them; a forward estimator's `initial`
    through `estimate` wins over `carry`: repeated on new data, equal to the spelled-out call."""
    g = torch.Generator().manual_seed(8)

    def data():
        return (torch.randn(4, 19, generator=g).to(DEV), (torch.rand(4, 19, generator=g) < 0.2).to(DEV),
                torch.randn(4, 19, generator=g).to(DEV), torch.randn(4, generator=g).to(DEV))

    calls = {
        "episodic_sums(rewards=)": (
            lambda r, k, b, c: F.episodic_sums(rewards=r, terminated=k, backend="triton"),
            lambda r, k, b, c: F.episodic_sums(r, terminated=k, backend="triton")),
        "monte carlo with bootstrap_values": (
            lambda r, k, b, c: F.discounted_returns(0.9, rewards=r, terminated=k, truncated=~k & (b > 1.5),
                                                    bootstrap_values=b, bootstrap=False, backend="triton"),
            lambda r, k, b, c: F.discounted_returns(0.9, rewards=r, terminated=k, truncated=~k & (b > 1.5),
                                                    bootstrap=False, backend="triton")),
        "estimate(initial=, carry=)": (
            lambda r, k, b, c: F.estimate("eligibility_traces", x=r, terminated=k, gamma=0.9, lam=0.8, carry=c + 7.0,
                                          initial=c, backend="triton"),
            lambda r, k, b, c: F.eligibility_traces(r, 0.9, 0.8, c, terminated=k, backend="triton")),
    }
    for label, (fn, spelled) in calls.items():
        for _ in range(2):
            new = data()
            got, want = fn(*new), spelled(*new)
            for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                torch.testing.assert_close(a, b, rtol=0, atol=0, msg=label)


def test_other_forced_choices_build_their_own_launch():
    """A call under forced kernel choices runs the launch built under those choices (a launch is
    cached per signature and choices), and gives the reference's values."""
    f = _fresh(9)
    f["truncated"] = None
    f["bootstrap_values"] = f["bootstrap_values"][:, -1].clone()
    call = estimator_call("advantages", f, backend="triton", gamma=0.97, lam=0.9)
    call()
    plain = {la for la in plans.launches() if la.force == (("poison", True),)}
    with K.forced(split=True, block_t=8, poison=True):
        out = call()
    forced = [la for la in plans.launches() if dict(la.force).get("split") and la.family == "lambda"
              and la.N == 3 and la.T == 37]
    assert forced and forced[0] not in plain and forced[0].strategy.split
    assert_matches_reference("advantages", out, f, gamma=0.97, lam=0.9)


def test_a_repeated_call_keeps_the_layout_and_dtype_of_its_outputs():
    """Time-major inputs and an out_dtype: the repeated call's outputs have the first call's
    strides and dtype, and equal the reference."""
    for time_major in (False, True):
        for out_dtype in (None, torch.float64):
            outs = []
            for seed in (10, 11):
                f = _fresh(seed)
                if time_major:
                    f = {k: (v.t().contiguous().t() if isinstance(v, torch.Tensor) and v.dim() == 2 else v)
                         for k, v in f.items()}
                res = estimator_call("gae", f, backend="triton", gamma=0.97, lam=0.9, out_dtype=out_dtype)()
                outs.append(res)
                assert_matches_reference("gae", res, f, gamma=0.97, lam=0.9, rtol=1e-4, atol=5e-5)
            for a, b in zip(*outs):
                assert a.stride() == b.stride() and a.dtype == b.dtype == (out_dtype or torch.float32)
