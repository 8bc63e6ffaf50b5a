"""The vectorised ``torch`` backend against the float64 ``reference`` backend (SPEC §1–3).

Every rollout comes from :mod:`rollbuf.testing`: unread ``bootstrap_values`` slots hold NaN, masked
steps hold NaN/±inf/1e30 garbage and random flags, so a leak or a misplaced read fails. Outputs are
compared with :func:`rollbuf.testing.assert_matches_reference` (per-dtype tolerances relative to
each row's magnitude; bfloat16/float16 loosely).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rollbuf import functional as F
from rollbuf.testing import (
    assert_close_to_reference,
    assert_matches_reference,
    estimator_params,
    make_rollout,
    reference_outputs,
    rollouts,
    run_estimator,
    window_end_index,
)

NAMES = ["gae", "lambda_returns", "discounted_returns", "monte_carlo_returns", "vtrace", "retrace",
         "eligibility_traces", "episodic_sums"]
FORWARD = {"eligibility_traces", "episodic_sums"}
BACKWARD = [n for n in NAMES if n not in FORWARD]
DTYPE_IDS = {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16", torch.float16: "fp16"}
# Fixed parameters for the deterministic cases (the property tests draw them).
PARAMS = {
    "gae": dict(gamma=0.99, lam=0.95),
    "lambda_returns": dict(gamma=0.97, lam=0.8),
    "discounted_returns": dict(gamma=0.99),
    "monte_carlo_returns": dict(gamma=0.99),
    "vtrace": dict(gamma=0.99, lam=0.9, rho_bar=1.0, c_bar=0.9, pg_rho_bar=1.5),
    "retrace": dict(gamma=0.99, lam=0.9, c_bar=1.0),
    "eligibility_traces": dict(gamma=0.99, lam=0.9),
    "episodic_sums": dict(),
}
# boundary mixes: (p_terminated, p_truncated, p_masked)
MIXES = {
    "plain": (0.0, 0.0, None),
    "term": (0.05, 0.0, None),
    "trunc": (0.0, 0.05, None),
    "term+trunc": (0.05, 0.05, None),
    "mask": (0.05, 0.05, 0.3),
}


def _as_tuple(out):
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def _rollout(N, T, mix, dtype=torch.float32, seed=0, **kw):
    p_term, p_trunc, p_mask = MIXES[mix]
    return make_rollout(N, T, seed=seed, dtype=dtype, p_terminated=p_term, p_truncated=p_trunc,
                        p_masked=p_mask, **kw)


# ---------------------------------------------------------------------------------------------
# property tests: every estimator, random boundaries, dtypes and flag dtypes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_property_torch_matches_reference(name, data):
    features = data.draw(st.sampled_from([None, (3,), (2, 2)])) if name in FORWARD else None
    f = data.draw(rollouts(max_n=4, max_t=70, dtypes=(torch.float32, torch.float64, torch.bfloat16),
                           features=features), label="fields")
    p = data.draw(estimator_params(name), label="params")
    if name in FORWARD and data.draw(st.booleans(), label="with initial"):
        x = f.get("x", f["rewards"])
        p["initial"] = torch.randn(x.shape[:1] + x.shape[2:], dtype=torch.float64).to(x.dtype)
    out = run_estimator(name, f, backend="torch", **p)
    assert_matches_reference(name, out, f, **p)


@pytest.mark.parametrize("name", BACKWARD)
@given(data=st.data())
def test_property_window_end_column_bootstrap(name, data):
    """``bootstrap_values`` of shape ``[N]`` (the window-end column only) = the ``[N, T]`` form."""
    f = data.draw(rollouts(max_t=70, truncations=False))
    p = data.draw(estimator_params(name))
    end = window_end_index(f["mask"], f["rewards"].shape)
    col = f["bootstrap_values"].gather(-1, end.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    col = torch.where(end >= 0, col, float("nan"))  # a row with no unmasked step reads nothing
    g = dict(f, bootstrap_values=col)
    out = run_estimator(name, g, backend="torch", **p)
    assert_matches_reference(name, out, g, **p)
    full = reference_outputs(name, f, **p)
    for o, e in zip(_as_tuple(out), full):
        assert_close_to_reference(o, e, f)


# ---------------------------------------------------------------------------------------------
# fixed shapes: odd lengths, every boundary mix, every dtype
# ---------------------------------------------------------------------------------------------

CASES = [(4, T, torch.float32, mix) for T in (1, 2, 32, 33, 63, 65, 129, 1000) for mix in MIXES]
CASES += [(4, T, dt, mix) for T in (65, 1000) for dt in (torch.float64, torch.bfloat16, torch.float16)
          for mix in ("term+trunc", "mask")]


def _case_id(c):
    N, T, dt, mix = c
    return f"N{N}-T{T}-{DTYPE_IDS[dt]}-{mix}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("name", NAMES)
def test_fixed_shapes_match_reference(name, case):
    N, T, dtype, mix = case
    f = _rollout(N, T, mix, dtype, seed=T * 31 + len(mix))
    out = run_estimator(name, f, backend="torch", **PARAMS[name])
    per_step = _as_tuple(out)[:1] if name in FORWARD else _as_tuple(out)
    for o in per_step:
        assert o.dtype == dtype, "per-step outputs take the inputs' dtype"
    if name in FORWARD:  # final is a carry: it stays in the accumulation dtype
        assert out.final.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert_matches_reference(name, out, f, **PARAMS[name])


@pytest.mark.parametrize("flag_dtype", [torch.bool, torch.uint8, torch.float32, torch.float64],
                         ids=["bool", "uint8", "float32-01", "float64-01"])
@pytest.mark.parametrize("name", NAMES)
def test_flag_dtypes(name, flag_dtype):
    f = _rollout(3, 65, "mask", seed=7, flag_dtype=flag_dtype)
    for k in ("terminated", "truncated", "mask"):
        assert f[k].dtype == flag_dtype
    out = run_estimator(name, f, backend="torch", **PARAMS[name])
    assert_matches_reference(name, out, f, **PARAMS[name])
    as_bool = {k: (v.bool() if k in ("terminated", "truncated", "mask") else v) for k, v in f.items()}
    for a, b in zip(_as_tuple(out), _as_tuple(run_estimator(name, as_bool, backend="torch", **PARAMS[name]))):
        assert torch.equal(a, b), "a 0/1 flag of any dtype must give exactly the bool-flag result"


# ---------------------------------------------------------------------------------------------
# layouts: time-major views, leading batch dims, out_dtype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_time_major_views(name):
    """``[T, N]`` buffers passed as their ``.mT`` views (non-contiguous) give the contiguous result."""
    f = _rollout(5, 63, "mask", seed=11, features=(3,) if name in FORWARD else None)

    def view(v):
        if v is None:
            return None
        if v.dim() == 2:
            return v.mT.contiguous().mT  # a [T, N] buffer, seen as [N, T]
        return v.movedim(1, 0).contiguous().movedim(0, 1)  # x: a [T, N, F] buffer

    g = {k: view(v) for k, v in f.items()}
    assert not g["rewards"].is_contiguous() and g["rewards"].stride() == (1, 5)
    out = run_estimator(name, g, backend="torch", **PARAMS[name])
    assert_matches_reference(name, out, f, **PARAMS[name])
    for a, b in zip(_as_tuple(out), _as_tuple(run_estimator(name, f, backend="torch", **PARAMS[name]))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_leading_batch_dims(name):
    """``[2, 3, T]`` fields equal the ``[6, T]`` rows (outputs keep the leading dims)."""
    feat = (2,) if name in FORWARD else None
    f = make_rollout(batch_shape=(2, 3), t=37, seed=5, p_terminated=0.1, p_truncated=0.1, p_masked=0.3,
                     features=feat)
    flat = {k: (None if v is None else v.reshape(6, *v.shape[2:])) for k, v in f.items()}
    out = _as_tuple(run_estimator(name, f, backend="torch", **PARAMS[name]))
    exp = reference_outputs(name, flat, **PARAMS[name])
    for o, e in zip(out, exp):
        assert o.shape[:2] == (2, 3)
        assert_close_to_reference(o.reshape(e.shape), e, flat)


@pytest.mark.parametrize("name", NAMES)
def test_out_dtype(name):
    f = _rollout(2, 40, "mask", seed=2)
    out = _as_tuple(run_estimator(name, f, backend="torch", out_dtype=torch.float64, **PARAMS[name]))
    exp = reference_outputs(name, f, **PARAMS[name])
    for i, (o, e) in enumerate(zip(out, exp)):
        final = name in FORWARD and i == 1  # a carry: the accumulation dtype (float32 here)
        assert o.dtype == (torch.float32 if final else torch.float64)
        assert_close_to_reference(o, e, f, rtol=1e-5, atol=1e-5)


def test_float64_inputs_compute_in_float64():
    """float64 stays float64: agreement with the reference far below fp32 rounding."""
    f = _rollout(3, 1000, "mask", torch.float64, seed=9)
    for name in NAMES:
        out = run_estimator(name, f, backend="torch", **PARAMS[name])
        assert_matches_reference(name, out, f, rtol=1e-10, atol=1e-11, **PARAMS[name])


# ---------------------------------------------------------------------------------------------
# long rows and empty rollouts
# ---------------------------------------------------------------------------------------------

LONG_T = 131072
LONG_GAMMA = LONG_LAM = 0.9999
# Relative L2 bounds. GAE's error is set by the problem's conditioning: a relative change ε of γλ
# changes A_t by ~ε·H relatively, H = 1/(1 − γλ) ≈ 5000 steps, and γλ itself is rounded to fp32
# (here ε = 1.6e-8). A sequential fp32 loop measures 5.4e-5 on this row, the blocked torch scan
# 4.8e-5 (the doubling scan it replaced: 1.1e-4, its β products over long spans round
# systematically). The bound is one fp32 epsilon times H (≈ 6e-4). V-trace's clipped traces
# (c ≤ λ) forget within a few steps: plain fp32 rounding (measured 3e-7), bound 1e-5.
EPS32 = 2.0**-23
LONG_TOL = {"gae": EPS32 / (1 - LONG_GAMMA * LONG_LAM), "vtrace": 1e-5}


def _rel_l2(a, e):
    a, e = a.double(), e.double()
    return float((a - e).norm() / e.norm())


@pytest.mark.parametrize("mix", ["plain", "term+trunc"])
def test_long_row_gae_and_vtrace_accuracy(mix):
    """One row of T = 131072 with γ = λ = 0.9999: the fp32 torch result against float64."""
    p_term, p_trunc = (0.0, 0.0) if mix == "plain" else (2e-5, 2e-5)
    f = make_rollout(1, LONG_T, seed=123, p_terminated=p_term, p_truncated=p_trunc)
    g, lam = LONG_GAMMA, LONG_LAM
    errs = {}
    gae = F.gae(g, lam, **_backward(f), backend="torch")
    gae_ref = F.gae(g, lam, **_backward(f), backend="reference")
    errs["gae.advantages"] = _rel_l2(gae.advantages, gae_ref.advantages)
    errs["gae.returns"] = _rel_l2(gae.returns, gae_ref.returns)
    vt_kw = dict(log_probs=f["log_probs"], **_backward(f))
    vt = F.vtrace(f["target_log_probs"], g, lam=lam, backend="torch", **vt_kw)
    vt_ref = F.vtrace(f["target_log_probs"], g, lam=lam, backend="reference", **vt_kw)
    errs["vtrace.vs"] = _rel_l2(vt.vs, vt_ref.vs)
    errs["vtrace.pg_advantages"] = _rel_l2(vt.pg_advantages, vt_ref.pg_advantages)
    print(f"long row T={LONG_T} ({mix}) relative L2 errors: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    for k, v in errs.items():
        tol = LONG_TOL[k.split(".")[0]]
        assert v < tol, f"{k}: relative L2 error {v:.3g} >= {tol:.3g}"


def _backward(f):
    return {k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")}


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0), (2, 0, 4), (2, 3, 0)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", NAMES)
def test_empty_rollouts(name, shape):
    feat = (2,) if name in FORWARD else None
    f = make_rollout(batch_shape=shape[:-1], t=shape[-1], seed=0, p_masked=0.3, features=feat)
    p = dict(PARAMS[name])
    if name in FORWARD:
        p["initial"] = torch.full((*shape[:-1], 2), 3.0)
    out = _as_tuple(run_estimator(name, f, backend="torch", **p))
    x = f.get("x", f["rewards"])
    if name in FORWARD:
        traces, final = out
        assert traces.shape == x.shape
        assert final.shape == (*shape[:-1], 2)
        if shape[-1] == 0:  # no step: the state passes through
            assert torch.equal(final, p["initial"])
    else:
        for o in out:
            assert o.shape == shape and o.dtype == torch.float32
