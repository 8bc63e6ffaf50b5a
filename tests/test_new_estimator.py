"""A new estimator is one coefficient function, one registry entry and one test.

The toy estimator here — discounted returns with a per-step discount ``γ_t`` (an SMDP / options
return, Monte Carlo):

    G_t = r_t + γ_t·(1 − d_t)·G_{t+1},   G past the window = 0 (or the chained window's carry),

is registered in this test alone and run through every backend against its own reference loop, with
terminations, truncations, masks, odd lengths and window chaining. docs/howto/new_estimator.md walks
through the same code.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from rollbuf import backends, estimators
from rollbuf import functional as F
from rollbuf.estimators import Estimator, Field
from rollbuf.problem import Family
from rollbuf.testing import assert_close_to_reference, make_rollout

NAME = "per_step_discounted_returns"
BACKENDS = ["reference", "torch"] + (["triton"] if backends.triton_available() else [])


def coefficients(f, params):
    """Own-step ``(α_t, β_t)`` of ``G_t = α_t + β_t·G_{t+1}`` from clean fields (flags 0/1)."""
    not_done = (1.0 - f["terminated"]) * (1.0 - f["truncated"])
    return f["rewards"], f["discounts"] * not_done


def reference(f, p):
    """The loop, row by row over the unmasked steps, in float64 (written apart from the above)."""
    r, g = f["rewards"].double(), f["discounts"].double()
    N, T = r.shape
    zeros = torch.zeros(N, T, dtype=torch.bool)
    k = zeros if f["terminated"] is None else f["terminated"] != 0
    tr = zeros if f["truncated"] is None else f["truncated"] != 0
    m = ~zeros if f["mask"] is None else f["mask"] != 0
    out = torch.zeros(N, T, dtype=torch.float64)
    for n in range(N):
        ret = 0.0
        for t in reversed(range(T)):
            if not m[n, t]:
                continue
            done = bool(k[n, t]) or bool(tr[n, t])
            ret = float(r[n, t]) + (0.0 if done else float(g[n, t]) * ret)
            out[n, t] = ret
    return (out,)


@pytest.fixture
def toy():
    est = estimators.register(Estimator(
        NAME, Family.GENERIC, "backward",
        (Field("rewards"), Field("discounts"), Field("terminated", "flag", False),
         Field("truncated", "flag", False), Field("mask", "flag", False)),
        (), ("returns",), None, reference, coefficients=coefficients,
    ))
    yield est
    estimators.unregister(NAME)


def _fields(N, T, seed, p_masked):
    f = make_rollout(N, T, seed=seed, p_terminated=0.1, p_truncated=0.1, p_masked=p_masked)
    g = torch.Generator().manual_seed(seed)
    disc = 0.8 + 0.2 * torch.rand(N, T, generator=g)
    return dict(rewards=f["rewards"], discounts=disc, terminated=f["terminated"], truncated=f["truncated"],
                mask=f["mask"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [1, 2, 33, 65])
@pytest.mark.parametrize("p_masked", [None, 0.3])
def test_toy_estimator_matches_its_reference(toy, backend, T, p_masked):
    f = _fields(3, T, seed=T, p_masked=p_masked)
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    got = F.estimate(NAME, backend=backend, **{k: (None if v is None else v.to(dev)) for k, v in f.items()}).cpu()
    want = reference({**f}, None)[0]
    assert got.shape == (3, T)
    assert_close_to_reference(got, want, context_fields=f, direction="backward")


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "reference"])
def test_toy_estimator_chains_windows(toy, backend):
    f = _fields(4, 41, seed=7, p_masked=0.2)
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    f = {k: (None if v is None else v.to(dev)) for k, v in f.items()}
    whole = F.estimate(NAME, backend=backend, **f)
    second, carry = F.estimate(NAME, backend=backend, return_carry=True, **{k: v[:, 20:] for k, v in f.items()})
    first = F.estimate(NAME, backend=backend, carry=carry, **{k: v[:, :20] for k, v in f.items()})
    torch.testing.assert_close(torch.cat([first, second], -1), whole, rtol=1e-5, atol=1e-5)


def test_toy_estimator_gradients_on_the_torch_backend(toy):
    f = _fields(2, 9, seed=1, p_masked=None)
    f = {k: (v.double().requires_grad_() if k in ("rewards", "discounts") else v) for k, v in f.items()}
    assert torch.autograd.gradcheck(lambda r, d: F.estimate(NAME, backend="torch", **{**f, "rewards": r,
                                                                                        "discounts": d}),
                                    (f["rewards"], f["discounts"]))


def test_toy_estimator_is_validated_from_its_entry(toy):
    f = _fields(2, 5, seed=0, p_masked=None)
    with pytest.raises(ValueError, match="discounts is required"):
        F.estimate(NAME, **{**f, "discounts": None})
    with pytest.raises(ValueError, match="discounts must have shape"):
        F.estimate(NAME, **{**f, "discounts": torch.ones(2, 6)})
    with pytest.raises(TypeError, match="unexpected keyword"):
        F.estimate(NAME, gamma=0.9, **f)


def test_the_testing_kit_sees_a_registered_estimator(toy):
    from rollbuf.testing import ESTIMATORS, run_estimator

    assert ESTIMATORS[NAME] == (NAME, ("rewards", "discounts", "terminated", "truncated", "mask"), {})
    f = _fields(2, 6, seed=3, p_masked=None)
    torch.testing.assert_close(run_estimator(NAME, f, backend="torch"),
                               reference(f, None)[0].float(), rtol=1e-5, atol=1e-5)


def test_registry_refuses_duplicates_and_builtin_removal(toy):
    with pytest.raises(ValueError, match="already registered"):
        estimators.register(toy)
    gamma = estimators.Param("gamma", estimators.unit_interval)
    for fields, params in [((Field("rewards"), Field("rewards")), ()),  # a field twice
                           ((Field("rewards"), Field("carry")), ()),  # a field named like a call option
                           ((Field("rewards"), Field("gamma")), (gamma,))]:  # a field named like a parameter
        with pytest.raises(ValueError, match="used twice"):
            estimators.register(attrs.evolve(toy, name=NAME + "_2", fields=fields, params=params))
    assert NAME + "_2" not in estimators.REGISTRY
    with pytest.raises(ValueError, match="built-in"):
        estimators.unregister("gae")
