"""benchmarks.oracles (the benchmark gate's float64 oracles, written apart from rollbuf's arithmetic)
against rollbuf's float64 reference loops, at every boundary."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import oracles as O
from rollbuf import reference
from rollbuf.testing import estimator_params, make_rollout, reference_outputs, rollouts, window_end_index

PARAMS = {
    "gae": dict(gamma=0.9, lam=0.8), "advantages": dict(gamma=0.9, lam=0.8),
    "lambda_returns": dict(gamma=0.9, lam=0.8), "discounted_returns": dict(gamma=0.97),
    "monte_carlo_returns": dict(gamma=0.97),
    "vtrace": dict(gamma=0.9, lam=0.9, rho_bar=1.2, c_bar=0.8, pg_rho_bar=0.7),
    "retrace": dict(gamma=0.9, lam=0.8, c_bar=0.9), "eligibility_traces": dict(gamma=0.9, lam=0.8),
    "episodic_sums": {},
}
BACKWARD = [e for e in PARAMS if e not in ("eligibility_traces", "episodic_sums")]


def _close(got, want, tol=1e-12):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == torch.float64 and a.shape == b.shape
        scale = b.abs().max().clamp_min(1.0)
        assert torch.equal(a.isnan(), b.isnan())
        assert ((a - b).abs().nan_to_num(0.0) <= tol * scale).all(), float((a - b).abs().max())


WINDOW_ENDS = [(e, w) for e in PARAMS for w in (("bootstrap", "terminal") if e in BACKWARD and
                                                   e != "monte_carlo_returns" else (None,))]


@pytest.mark.parametrize("name,window_end", WINDOW_ENDS, ids=[f"{e}-{w}" for e, w in WINDOW_ENDS])
@pytest.mark.parametrize("p_masked", [None, 0.3], ids=["nomask", "mask"])
@pytest.mark.parametrize("chunk", [None, 1, 4, 7], ids=lambda c: f"chunk{c}")
def test_oracle_equals_reference(name, window_end, p_masked, chunk):
    """Dense terminations and truncations, masked spans holding NaN/±inf/1e30, NaN at every
    unread bootstrap slot; uncut (chunk None at T = 37) and cut into chunks of 1, 4 and 7 steps."""
    params = dict(PARAMS[name])
    if window_end is not None:
        params["window_end"] = window_end
    for seed in range(3):
        f = make_rollout(5, 37, seed=seed, dtype=torch.float64, p_terminated=0.1, p_truncated=0.1,
                         p_masked=p_masked)
        _close(O.outputs(name, f, chunk=chunk, **params), reference_outputs(name, f, **params))


@pytest.mark.parametrize("name", BACKWARD)
def test_window_end_column_bootstrap(name):
    """``bootstrap_values`` as ``[N]`` (the window-end value of each row), with a mask and
    terminations; an interior truncation with a ``[N]`` column is refused."""
    f = make_rollout(6, 29, seed=3, dtype=torch.float64, p_terminated=0.1, p_truncated=0.0, p_masked=0.3)
    end = window_end_index(f["mask"], (6, 29)).clamp_min(0)
    f["bootstrap_values"] = f["bootstrap_values"].gather(1, end[:, None])[:, 0]
    f["truncated"] = None
    _close(O.outputs(name, f, **PARAMS[name]), reference_outputs(name, f, **PARAMS[name]))
    if name != "monte_carlo_returns":
        g = make_rollout(2, 9, seed=0, dtype=torch.float64, p_terminated=0.0, p_truncated=0.0)
        g["truncated"] = torch.zeros(2, 9, dtype=torch.bool)
        g["truncated"][0, 3] = True
        g["bootstrap_values"] = torch.randn(2, dtype=torch.float64)
        with pytest.raises(ValueError, match="bootstrap_values"):
            O.outputs(name, g, **PARAMS[name])
        g["bootstrap_values"] = None
        with pytest.raises(ValueError, match="bootstrap_values"):
            O.outputs(name, g, **PARAMS[name])


@pytest.mark.parametrize("name", list(PARAMS))
def test_batch_shape_and_flag_dtypes(name):
    """``[*B, T]`` fields (B = 2 × 3), uint8 and 0/1 float flags: the rows of the direct reference
    loop on the flattened rollout."""
    for flag_dtype in (torch.uint8, torch.float64):
        f = make_rollout(seed=5, t=23, batch_shape=(2, 3), dtype=torch.float64, flag_dtype=flag_dtype,
                         p_terminated=0.15, p_truncated=0.15, p_masked=0.25)
        flat = {k: (v.reshape(6, 23) if v is not None else None) for k, v in f.items()}
        want = reference_outputs(name, flat, **PARAMS[name])
        got = O.outputs(name, f, **PARAMS[name])
        _close(tuple(g.reshape(w.shape) for g, w in zip(got, want)), want)


def test_direct_reference_loops_long_rows():
    """Rows longer than the uncut limit are cut into chunks by default: equal to the reference
    loops of ``rollbuf.reference`` called directly, and to the same oracle uncut."""
    T = 700
    f = make_rollout(3, T, seed=1, dtype=torch.float64, p_terminated=0.005, p_truncated=0.005, p_masked=0.2)
    k, tr, m = f["terminated"], f["truncated"], f["mask"]
    want = reference.gae(f["rewards"], f["values"], k, tr, f["bootstrap_values"], m, 0.99, 0.95, "bootstrap")
    for chunk in (None, T):
        _close(O.gae(f["rewards"], f["values"], k, tr, f["bootstrap_values"], m, gamma=0.99, lam=0.95, chunk=chunk),
               want)
    want = reference.vtrace(f["rewards"], f["values"], k, tr, f["bootstrap_values"], m,
                            (f["log_probs"], f["target_log_probs"]), 0.99, 1.0, (1.0, 1.0, None), "bootstrap")
    _close(O.vtrace(f["rewards"], f["values"], f["log_probs"], f["target_log_probs"], k, tr, f["bootstrap_values"], m,
                    gamma=0.99), want)
    want = reference.retrace(f["rewards"], f["values"], k, tr, f["bootstrap_values"], m,
                             (f["log_probs"], f["target_log_probs"]), f["q_values"], 0.99, 0.95, 1.0, "bootstrap")
    _close((O.retrace(f["rewards"], f["values"], f["q_values"], f["log_probs"], f["target_log_probs"], k, tr,
                      f["bootstrap_values"], m, gamma=0.99, lam=0.95),), (want,))
    want = reference.episodic_sums(f["rewards"], k, tr, m, None)
    _close(O.episodic_sums(f["rewards"], k, tr, m), want)


@pytest.mark.parametrize("name", ["eligibility_traces", "episodic_sums"])
@pytest.mark.parametrize("chunk", [None, 3])
def test_forward_features_and_initial(name, chunk):
    """``x`` ``[N, T, F]`` with an ``initial`` ``[N, F]``; a row with no unmasked step keeps
    ``final = initial``."""
    f = make_rollout(4, 31, seed=2, dtype=torch.float64, p_terminated=0.1, p_truncated=0.1, p_masked=0.3,
                     features=(2,))
    f["mask"][1] = False
    init = torch.randn(4, 2, dtype=torch.float64)
    params = dict(PARAMS[name], initial=init)
    got = O.outputs(name, f, chunk=chunk, **params)
    _close(got, reference_outputs(name, f, **params))
    assert torch.equal(got[1][1], init[1])


@settings(max_examples=60, deadline=None)
@given(data=st.data(), f=rollouts(max_n=3, max_t=40, dtypes=(torch.float64,)),
       name=st.sampled_from(list(PARAMS)), chunk=st.sampled_from([None, 1, 2, 5]))
def test_oracle_property(data, f, name, chunk):
    """Random flag densities and dtypes, masks with garbage, every parameter of the estimator."""
    params = data.draw(estimator_params(name))
    _close(O.outputs(name, f, chunk=chunk, **params), reference_outputs(name, f, **params), tol=1e-10)


def test_oracles_share_no_code_with_rollbuf():
    """The oracle module imports torch only: no boundary coefficients, backend or scan of rollbuf."""
    src = Path(O.__file__).read_text(encoding="utf-8")
    mods = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mods.add(node.module)
    assert mods <= {"__future__", "math", "collections.abc", "torch"}, mods


def test_user_loops_match_the_oracle():
    """The loops users write (GAE loop, doubling scan) give the oracle's numbers where they apply
    (no mask; V' built by the trainer)."""
    f = make_rollout(4, 50, seed=0, dtype=torch.float64, p_terminated=0.05, p_truncated=0.05)
    f["bootstrap_values"] = torch.nan_to_num(f["bootstrap_values"], nan=0.0)
    v, bv = f["values"], f["bootstrap_values"]
    nxt = torch.where(f["truncated"], bv, torch.cat([v[:, 1:], bv[:, -1:]], -1))
    want = O.gae(f["rewards"], v, f["terminated"], f["truncated"], bv, gamma=0.99, lam=0.95)
    for fn in (O.gae_loop, O.gae_doubling):
        _close(fn(f["rewards"], v, nxt, f["terminated"], f["truncated"] & ~f["terminated"], 0.99, 0.95), want,
               tol=1e-12)
