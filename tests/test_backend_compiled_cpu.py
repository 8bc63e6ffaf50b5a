"""The compiled CPU backend (``backend="numba"``) against the float64 ``reference`` backend.

Rollouts come from :mod:`rollbuf.testing`: unread ``bootstrap_values`` slots hold NaN and masked
steps hold NaN/±inf/1e30 garbage with random flags, so any leak or misplaced read fails. Besides
the reference: every layout (time-major views, strided and broadcast fields) gives the contiguous
result bit for bit, one window equals two chained windows, the carries equal the torch backend's,
the parallel path equals the serial one, and the TD(λ) adjoint equals autograd's gradients.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from rollbuf import functional as F
from rollbuf import backends
from rollbuf.backends import torch_backend as vectorized
from rollbuf.backends import compiled_cpu
from rollbuf.problem import Problem
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

BE = "numba"
NAMES = ["gae", "advantages", "lambda_returns", "discounted_returns", "monte_carlo_returns", "vtrace",
         "retrace", "eligibility_traces", "episodic_sums"]
FORWARD = {"eligibility_traces", "episodic_sums"}
BACKWARD = [n for n in NAMES if n not in FORWARD]
DTYPE_IDS = {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16", torch.float16: "fp16"}
PARAMS = {
    "gae": dict(gamma=0.99, lam=0.95),
    "advantages": dict(gamma=0.99, lam=0.95),
    "lambda_returns": dict(gamma=0.97, lam=0.8),
    "discounted_returns": dict(gamma=0.99),
    "monte_carlo_returns": dict(gamma=0.99),
    "vtrace": dict(gamma=0.99, lam=0.9, rho_bar=1.0, c_bar=0.9, pg_rho_bar=1.5),
    "retrace": dict(gamma=0.99, lam=0.9, c_bar=1.0),
    "eligibility_traces": dict(gamma=0.99, lam=0.9),
    "episodic_sums": dict(),
}
MIXES = {  # (p_terminated, p_truncated, p_masked)
    "plain": (0.0, 0.0, None),
    "term": (0.05, 0.0, None),
    "trunc": (0.0, 0.05, None),
    "term+trunc": (0.05, 0.05, None),
    "mask": (0.05, 0.05, 0.3),
    "dense": (0.3, 0.3, 0.5),
}


def _tuple(out):
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def _rollout(N, T, mix, dtype=torch.float32, seed=0, name=None, **kw):
    p_term, p_trunc, p_mask = MIXES[mix]
    if name in FORWARD:
        kw.setdefault("features", (3,))
    return make_rollout(N, T, seed=seed, dtype=dtype, p_terminated=p_term, p_truncated=p_trunc,
                        p_masked=p_mask, **kw)


def _equal(a, b):
    for x, y in zip(_tuple(a), _tuple(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(torch.nan_to_num(x, nan=7.0), torch.nan_to_num(y, nan=7.0)), (x - y).abs().max()


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------


def test_auto_picks_the_compiled_backend_on_cpu(monkeypatch):
    assert backends.resolve("auto", torch.device("cpu")) == "numba"
    calls = []
    real = compiled_cpu.run
    monkeypatch.setattr(compiled_cpu, "run", lambda p: calls.append(p.family) or real(p))
    f = _rollout(2, 9, "mask")
    F.gae(0.9, 0.8, rewards=f["rewards"], values=f["values"], bootstrap_values=f["bootstrap_values"],
          terminated=f["terminated"], truncated=f["truncated"], mask=f["mask"])
    F.affine_scan(torch.randn(2, 5), torch.rand(2, 5))
    assert calls == ["lambda", "affine"]


def test_numba_backend_refuses_other_devices():
    with pytest.raises(ValueError, match="CPU tensors"):
        backends.resolve("numba", torch.device("meta"))


@pytest.mark.parametrize("name", ["gae", "vtrace", "retrace", "eligibility_traces"])
def test_gradients_go_through_the_torch_backend(name):
    """Inputs that require grad: the call runs on the torch backend, gradients as its own."""
    f = _rollout(3, 21, "mask", dtype=torch.float64, seed=4, name=name)
    key = "x" if name in FORWARD else "rewards"
    grads = []
    for be in (BE, "torch"):
        g = dict(f)
        g[key] = f[key].clone().requires_grad_(True)
        out = _tuple(run_estimator(name, g, backend=be, **PARAMS[name]))
        sum(o.nan_to_num().sum() for o in out).backward()
        grads.append(g[key].grad)
    _equal(grads[0], grads[1])


# ---------------------------------------------------------------------------------------------
# property tests: every estimator, random boundaries, dtypes and flag dtypes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_property_matches_reference(name, data):
    features = data.draw(st.sampled_from([None, (3,), (2, 2)])) if name in FORWARD else None
    f = data.draw(rollouts(max_n=5, max_t=70, features=features,
                           dtypes=(torch.float32, torch.float64, torch.bfloat16, torch.float16)),
                  label="fields")
    p = data.draw(estimator_params(name), label="params")
    if name in FORWARD and data.draw(st.booleans(), label="with initial"):
        x = f.get("x", f["rewards"])
        p["initial"] = torch.randn(x.shape[:1] + x.shape[2:], dtype=torch.float64).to(x.dtype)
    out = run_estimator(name, f, backend=BE, **p)
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
    out = run_estimator(name, g, backend=BE, **p)
    assert_matches_reference(name, out, g, **p)
    for o, e in zip(_tuple(out), reference_outputs(name, f, **p)):
        assert_close_to_reference(o, e, f)


@pytest.mark.parametrize("name", BACKWARD)
@given(data=st.data())
def test_property_two_chained_windows_equal_one(name, data):
    """The row split at any step before every row's window end: the second window's carry, passed to
    the first, gives the outputs of the whole row (masks, terminations and truncations on both
    sides of the cut). (A second window with no unmasked step would pass on V(s_T) of its own last
    column, which this rollout leaves NaN where the whole row does not read it.)"""
    f = data.draw(rollouts(min_t=2, max_t=60, dtypes=(torch.float64,)), label="fields")
    p = data.draw(estimator_params(name), label="params")
    ends = window_end_index(f["mask"], f["rewards"].shape)
    ends = ends[ends >= 0]
    hi = int(ends.min()) if len(ends) else f["rewards"].shape[-1] - 1
    assume(hi >= 1)
    cut = data.draw(st.integers(1, hi), label="cut")
    whole = _tuple(run_estimator(name, f, backend=BE, **p))
    tail = {k: (None if v is None else v[..., cut:]) for k, v in f.items()}
    head = {k: (None if v is None else v[..., :cut]) for k, v in f.items()}
    if name == "monte_carlo_returns":
        head.pop("bootstrap_values")
    out_tail, carry = run_estimator(name, tail, backend=BE, return_carry=True, **p)
    out_head = run_estimator(name, head, backend=BE, carry=carry, **p)
    for w, a, b in zip(whole, _tuple(out_head), _tuple(out_tail)):
        torch.testing.assert_close(torch.cat([a, b], -1), w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", sorted(FORWARD))
@given(data=st.data())
def test_property_forward_chained_windows(name, data):
    """Forward estimators: ``final`` of the first window as the second's ``initial``."""
    f = data.draw(rollouts(min_t=2, max_t=60, dtypes=(torch.float64,), features=(2,)), label="fields")
    p = data.draw(estimator_params(name), label="params")
    T = f["rewards"].shape[-1]
    cut = data.draw(st.integers(1, T - 1), label="cut")
    whole = run_estimator(name, f, backend=BE, **p)
    a = run_estimator(name, {k: (None if v is None else v[:, :cut]) for k, v in f.items()}, backend=BE, **p)
    b = run_estimator(name, {k: (None if v is None else v[:, cut:]) for k, v in f.items()}, backend=BE,
                      initial=a[1], **p)
    torch.testing.assert_close(torch.cat([a[0], b[0]], 1), whole[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(b[1], whole[1], rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# fixed shapes: odd lengths, every boundary mix, every dtype
# ---------------------------------------------------------------------------------------------

CASES = [(4, T, torch.float32, mix) for T in (1, 2, 33, 65, 1000) for mix in MIXES]
CASES += [(3, T, dt, mix) for T in (65, 257) for dt in (torch.float64, torch.bfloat16, torch.float16)
          for mix in ("term+trunc", "mask")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"N{c[0]}-T{c[1]}-{DTYPE_IDS[c[2]]}-{c[3]}")
@pytest.mark.parametrize("name", NAMES)
def test_fixed_shapes_match_reference(name, case):
    N, T, dtype, mix = case
    f = _rollout(N, T, mix, dtype, seed=T * 31 + len(mix), name=name)
    out = run_estimator(name, f, backend=BE, **PARAMS[name])
    per_step = _tuple(out)[:1] if name in FORWARD else _tuple(out)
    for o in per_step:
        assert o.dtype == dtype, "per-step outputs take the inputs' dtype"
    if name in FORWARD:  # final is a carry: the accumulation dtype
        assert out.final.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert_matches_reference(name, out, f, **PARAMS[name])


@pytest.mark.parametrize("name", NAMES)
def test_float64_inputs_compute_in_float64(name):
    f = _rollout(3, 1000, "mask", torch.float64, seed=9, name=name)
    out = run_estimator(name, f, backend=BE, **PARAMS[name])
    assert_matches_reference(name, out, f, rtol=1e-10, atol=1e-11, **PARAMS[name])


@pytest.mark.parametrize("flag_dtype", [torch.bool, torch.uint8, torch.float32, torch.float64],
                         ids=["bool", "uint8", "float32-01", "float64-01"])
@pytest.mark.parametrize("name", NAMES)
def test_flag_dtypes(name, flag_dtype):
    f = _rollout(3, 65, "mask", seed=7, flag_dtype=flag_dtype, name=name)
    out = run_estimator(name, f, backend=BE, **PARAMS[name])
    assert_matches_reference(name, out, f, **PARAMS[name])
    as_bool = {k: (v.bool() if k in ("terminated", "truncated", "mask") else v) for k, v in f.items()}
    _equal(out, run_estimator(name, as_bool, backend=BE, **PARAMS[name]))


def test_uint8_flags_other_than_one_count_as_set():
    f = _rollout(3, 40, "mask", seed=8, flag_dtype=torch.uint8)
    g = {k: (v * 7 if k in ("terminated", "truncated", "mask") else v) for k, v in f.items()}
    p = PARAMS["vtrace"]
    _equal(run_estimator("vtrace", g, backend=BE, **p), run_estimator("vtrace", f, backend=BE, **p))


@pytest.mark.parametrize("name", NAMES)
def test_mixed_input_dtypes_compute_in_the_widest(name):
    f = _rollout(3, 50, "mask", seed=12, name=name)
    g = dict(f, bootstrap_values=f["bootstrap_values"].double()) if name not in FORWARD else dict(f, x=f["x"].double())
    if name == "monte_carlo_returns":
        g = dict(f, rewards=f["rewards"].double())
    out = _tuple(run_estimator(name, g, backend=BE, **PARAMS[name]))
    assert out[0].dtype == torch.float64
    assert_matches_reference(name, out, g, rtol=1e-5, atol=1e-5, **PARAMS[name])


# ---------------------------------------------------------------------------------------------
# layouts: read in place whatever the strides
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_time_major_views(name):
    """``[T, N]`` buffers passed as their ``.mT`` views: the contiguous result, bit for bit."""
    f = _rollout(5, 63, "mask", seed=11, name=name)

    def view(v):
        if v is None:
            return None
        if v.dim() == 2:
            return v.mT.contiguous().mT  # a [T, N] buffer, seen as [N, T]
        return v.movedim(1, 0).contiguous().movedim(0, 1)  # x: a [T, N, F] buffer

    g = {k: view(v) for k, v in f.items()}
    assert not g["rewards"].is_contiguous() and g["rewards"].stride() == (1, 5)
    out = run_estimator(name, g, backend=BE, **PARAMS[name])
    assert_matches_reference(name, out, f, **PARAMS[name])
    _equal(out, run_estimator(name, f, backend=BE, **PARAMS[name]))


def _time_major_view(v):
    if v is None:
        return None
    if v.dim() == 2:
        return v.mT.contiguous().mT  # a [T, N] buffer, seen as [N, T]
    return v.movedim(1, 0).contiguous().movedim(0, 1)  # x: a [T, N, F] buffer


@pytest.mark.parametrize("mix", ["term+trunc", "mask", "dense"])
@pytest.mark.parametrize("name", NAMES)
def test_lanes_order_equals_rows_order(name, mix, monkeypatch):
    """Time-major buffers with enough rows run time outermost, the rows innermost (the lanes order,
    vectorised: 37 rows are a vector body and a remainder): bit for bit the rows order's result, which
    matches the reference; the outputs are then time-major views. Forward estimators with enough
    features run the features as lanes."""
    f = _rollout(37, 45, mix, seed=23, name=name, dtype=torch.float64)
    if name in FORWARD:
        f = dict(f, x=torch.randn(37, 45, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    g = {k: _time_major_view(v) for k, v in f.items()}
    lanes = _tuple(run_estimator(name, g, backend=BE, **PARAMS[name]))
    if name not in FORWARD:
        assert all(o.stride() == (1, 37) for o in lanes)
    assert_matches_reference(name, lanes, f, **PARAMS[name])
    # flags [N, T] next to [T, N] buffers, a field broadcast over the rows: copied, the same result
    mixed = dict(g, **{k: f[k] for k in ("terminated", "truncated", "mask") if f.get(k) is not None})
    if "log_probs" in f:
        mixed["log_probs"] = f["log_probs"][:1].expand(37, -1)
        f = dict(f, log_probs=mixed["log_probs"].contiguous())
        g = dict(g, log_probs=mixed["log_probs"])
        lanes = _tuple(run_estimator(name, g, backend=BE, **PARAMS[name]))
    _equal(lanes, run_estimator(name, mixed, backend=BE, **PARAMS[name]))
    monkeypatch.setattr(compiled_cpu, "LANES_MIN_ROWS", 10**9)
    _equal(lanes, run_estimator(name, g, backend=BE, **PARAMS[name]))
    _equal(lanes, run_estimator(name, f, backend=BE, **PARAMS[name]))


@pytest.mark.parametrize("window_end", ["bootstrap", "terminal"])
@pytest.mark.parametrize("name", NAMES)
def test_lanes_order_carries(name, window_end):
    """The lanes order's carry out (``final``) and its reading of a carry in (``initial``) are the
    rows order's, bit for bit; one feature: the rows are the lanes, as for the backward estimators."""
    f = _rollout(33, 60, "mask", seed=29, name=name, dtype=torch.float64)
    p = dict(PARAMS[name])
    if name in FORWARD:
        f = dict(f, x=torch.randn(33, 60, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(2)))
    elif name != "monte_carlo_returns":
        p["window_end"] = window_end
    g = {k: _time_major_view(v) for k, v in f.items()}
    if name in FORWARD:
        lanes, rows = run_estimator(name, g, backend=BE, **p), run_estimator(name, f, backend=BE, **p)
        assert lanes[0].stride()[:2] == (1, 33)
        _equal(lanes, rows)
        init = torch.randn(33, 1, dtype=torch.float64)
        _equal(run_estimator(name, g, backend=BE, initial=init, **p),
               run_estimator(name, f, backend=BE, initial=init, **p))
        return
    (out, carry), (out_r, carry_r) = (run_estimator(name, h, backend=BE, return_carry=True, **p) for h in (g, f))
    _equal(out, out_r)
    _equal(carry, carry_r)
    c = torch.randn(carry.shape, dtype=torch.float64)
    _equal(run_estimator(name, g, backend=BE, carry=c, **p), run_estimator(name, f, backend=BE, carry=c, **p))


@pytest.mark.parametrize("name", NAMES)
def test_strided_and_broadcast_fields(name):
    """Every other step of a wider buffer, a field broadcast along time (stride 0), the bootstrap
    column broadcast, features that cannot be merged into one stride: the contiguous result."""
    f = _rollout(4, 81, "mask", seed=13, name=name)

    def spread(v):
        if v is None:
            return None
        wide = torch.zeros((v.shape[0], v.shape[1] * 2) + tuple(v.shape[2:]), dtype=v.dtype)
        wide[:, ::2] = v
        return wide[:, ::2]

    g = {k: spread(v) for k, v in f.items()}
    assert g["rewards"].stride() == (162, 2)
    _equal(run_estimator(name, g, backend=BE, **PARAMS[name]), run_estimator(name, f, backend=BE, **PARAMS[name]))
    g = torch.Generator().manual_seed(2)
    h = dict(f, values=torch.randn(4, 1, generator=g).expand(4, 81),  # one value per row
             log_probs=-torch.rand(1, 81, generator=g).expand(4, 81))  # one per step
    if name in FORWARD:
        h["x"] = torch.randn(4, 81, 2, 3).transpose(2, 3)  # [N, T, 3, 2] not mergeable to one stride
    out = run_estimator(name, h, backend=BE, **PARAMS[name])
    assert_matches_reference(name, out, h, **PARAMS[name])


# ---------------------------------------------------------------------------------------------
# NaN where nothing may be read; carries; empty rollouts
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BACKWARD)
def test_nan_in_unread_bootstrap_slots_does_not_leak(name):
    f = _rollout(6, 97, "dense", seed=21)
    read = ~f["bootstrap_values"].isnan()
    assert (~read).any() and read.any()
    out = _tuple(run_estimator(name, f, backend=BE, **PARAMS[name]))
    live = f["mask"]
    for o in out:
        assert torch.isfinite(o[live]).all()
        assert (o[~live] == 0).all()
    assert_matches_reference(name, out, f, **PARAMS[name])


@pytest.mark.parametrize("mix", ["term+trunc", "mask", "dense"])
@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("window_end", ["bootstrap", "terminal"])
def test_carry_out_equals_the_torch_backend(name, mix, window_end):
    f = _rollout(5, 47, mix, seed=5, dtype=torch.float64)
    p = dict(PARAMS[name])
    if name != "monte_carlo_returns":
        p["window_end"] = window_end
    out, carry = run_estimator(name, f, backend=BE, return_carry=True, **p)
    ref_out, ref_carry = run_estimator(name, f, backend="torch", return_carry=True, **p)
    torch.testing.assert_close(carry, ref_carry, rtol=1e-10, atol=1e-10, equal_nan=True)
    for a, b in zip(_tuple(out), _tuple(ref_out)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    c = torch.randn(ref_carry.shape, dtype=torch.float64)
    a = _tuple(run_estimator(name, f, backend=BE, carry=c, **p))
    b = _tuple(run_estimator(name, f, backend="torch", carry=c, **p))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("order", ["rows", "lanes"])
def test_no_carry_out_unless_asked(name, order, monkeypatch):
    """A backward estimator's carry out is made and stored only when the call asks for it
    (``return_carry=True``), as on the triton backend: without it the backend returns no carry, and
    the outputs are bit for bit those of the call that asks, in both loop orders."""
    f = _rollout(37, 29, "term+trunc", seed=11, name=name, dtype=torch.float64)
    if order == "lanes":  # time-major buffers with enough rows: time outermost
        f = {k: _time_major_view(v) for k, v in f.items()}
    seen = []
    real = compiled_cpu.run
    monkeypatch.setattr(compiled_cpu, "run", lambda p: seen.append(real(p)) or seen[-1])
    plain = _tuple(run_estimator(name, f, backend=BE, **PARAMS[name]))
    asked, carry = run_estimator(name, f, backend=BE, return_carry=True, **PARAMS[name])
    assert len(seen) == 2 and seen[0][1] is None and seen[1][1] is carry is not None
    for a, b in zip(plain, _tuple(asked), strict=True):
        assert torch.equal(a, b)
    assert_matches_reference(name, plain, f, **PARAMS[name])


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0), (2, 0, 4), (2, 3, 0)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", NAMES)
def test_empty_rollouts(name, shape):
    feat = (2,) if name in FORWARD else None
    f = make_rollout(batch_shape=shape[:-1], t=shape[-1], seed=0, p_masked=0.3, features=feat)
    p = dict(PARAMS[name])
    if name in FORWARD:
        p["initial"] = torch.full((*shape[:-1], 2), 3.0)
    out = _tuple(run_estimator(name, f, backend=BE, **p))
    x = f.get("x", f["rewards"])
    if name in FORWARD:
        traces, final = out
        assert traces.shape == x.shape
        assert final.shape == (*shape[:-1], 2)
        if shape[-1] == 0:
            assert torch.equal(final, p["initial"])
    else:
        for o in out:
            assert o.shape == shape and o.dtype == torch.float32


@pytest.mark.parametrize("name", NAMES)
def test_leading_batch_dims(name):
    feat = (2,) if name in FORWARD else None
    f = make_rollout(batch_shape=(2, 3), t=37, seed=5, p_terminated=0.1, p_truncated=0.1, p_masked=0.3,
                     features=feat)
    flat = {k: (None if v is None else v.reshape(6, *v.shape[2:])) for k, v in f.items()}
    out = _tuple(run_estimator(name, f, backend=BE, **PARAMS[name]))
    for o, e in zip(out, reference_outputs(name, flat, **PARAMS[name])):
        assert o.shape[:2] == (2, 3)
        assert_close_to_reference(o.reshape(e.shape), e, flat)


@pytest.mark.parametrize("name", NAMES)
def test_out_dtype(name):
    f = _rollout(2, 40, "mask", seed=2, name=name)
    out = _tuple(run_estimator(name, f, backend=BE, out_dtype=torch.float64, **PARAMS[name]))
    for i, (o, e) in enumerate(zip(out, reference_outputs(name, f, **PARAMS[name]))):
        final = name in FORWARD and i == 1
        assert o.dtype == (torch.float32 if final else torch.float64)
        assert_close_to_reference(o, e, f, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the parallel path (rows over the cores) and long rows
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["rows", "lanes"])
@pytest.mark.parametrize("name", NAMES)
def test_threaded_rows_equal_serial(name, order, monkeypatch):
    """Rows split over three threads give the one-thread result bit for bit: whole rows each, or in
    the lanes order (time-major buffers; forward estimators: features) a range of lanes each."""
    if order == "rows":
        f = _rollout(7, 300, "mask", seed=17, name=name)
    else:
        f = _rollout(40, 50, "mask", seed=17, name=name)
        if name in FORWARD:
            f["x"] = torch.randn(40, 50, 17)
        f = {k: _time_major_view(v) for k, v in f.items()}
    monkeypatch.setattr(compiled_cpu, "PARALLEL_MIN_ELEMENTS", 10**12)
    serial = run_estimator(name, f, backend=BE, **PARAMS[name])
    monkeypatch.setattr(compiled_cpu, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    pools = []
    real = compiled_cpu.pool
    monkeypatch.setattr(compiled_cpu, "pool", lambda k: pools.append(k) or real(k))
    _equal(run_estimator(name, f, backend=BE, **PARAMS[name]), serial)
    assert pools == [2], "two worker threads next to the calling one"


def test_long_rows_gae_accuracy():
    """One row of T = 131072 with γ = λ = 0.9999 in fp32 against float64 (relative L2)."""
    f = make_rollout(1, 131072, seed=123, p_terminated=2e-5, p_truncated=2e-5)
    kw = {k: f[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap_values")}
    got = F.gae(0.9999, 0.9999, **kw, backend=BE)
    exp = F.gae(0.9999, 0.9999, **{k: (v.double() if v.is_floating_point() else v) for k, v in kw.items()},
                backend="torch")
    for a, e in zip(got, exp):
        err = float((a.double() - e).norm() / e.norm())
        assert err < 2.0**-23 / (1 - 0.9999**2), err


# ---------------------------------------------------------------------------------------------
# the affine primitive and the TD(λ) adjoint
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_affine_scan_matches_reference(reverse, dtype):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 77, generator=g, dtype=torch.float64).to(dtype)
    b = torch.rand(4, 77, generator=g, dtype=torch.float64).to(dtype)
    init = torch.randn(4, generator=g, dtype=torch.float64).to(dtype)
    got = F.affine_scan(a.mT.contiguous().mT, b, reverse, init, backend=BE)
    exp = F.affine_scan(a, b, reverse, init, backend="reference")
    assert got.dtype == dtype
    assert_close_to_reference(got, exp)


@pytest.mark.parametrize("mix", ["term+trunc", "mask", "dense"])
@pytest.mark.parametrize("outputs", [("advantages", "returns"), ("returns",)])
@pytest.mark.parametrize("grad_values", [True, False])
def test_lambda_adjoint_equals_autograd(mix, outputs, grad_values):
    """The ``lambda_adjoint`` family (``rewards`` = ∂L/∂G, ``values`` = ∂L/∂A, ``carry`` = ∂L/∂Z_0)
    gives autograd's gradients of the TD(λ) forward: ∂L/∂rewards, ∂L/∂values and ∂L/∂carry (W_T)."""
    f = _rollout(4, 53, mix, dtype=torch.float64, seed=31)
    gamma, lam = 0.97, 0.8
    r = f["rewards"].clone().requires_grad_(True)
    v = f["values"].clone().requires_grad_(True)
    carry = torch.randn(4, dtype=torch.float64, requires_grad=True)
    fields = dict(rewards=r, values=v, terminated=f["terminated"], truncated=f["truncated"],
                  bootstrap_values=f["bootstrap_values"], mask=f["mask"])
    p = Problem(family="lambda", outputs=outputs, fields=fields, gamma=gamma, lam=lam, carry=carry,
                compute_dtype=torch.float64, out_dtype=torch.float64)
    outs, z0 = vectorized.run(p)
    g = torch.Generator().manual_seed(1)
    g_outs = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    g_z0 = torch.randn(4, generator=g, dtype=torch.float64)
    loss = sum((o * w).nan_to_num().sum() for o, w in zip(outs, g_outs)) + (z0 * g_z0).sum()
    r_bar, v_bar, w_end = torch.autograd.grad(loss, (r, v, carry))
    if outputs == ("advantages", "returns"):
        g_adv, g_ret = g_outs
    else:
        g_adv, g_ret = None, g_outs[0]
    adj = Problem(family="lambda_adjoint", outputs=("rewards", "values") if grad_values else ("rewards",),
                  fields={"grad_returns": g_ret, "grad_advantages": g_adv, "terminated": f["terminated"],
                          "truncated": f["truncated"], "mask": f["mask"]},
                  gamma=gamma, lam=lam, carry=g_z0, compute_dtype=torch.float64, out_dtype=torch.float64)
    got, got_w = compiled_cpu.run(adj)
    m = f["mask"] if f["mask"] is not None else torch.ones(4, 53, dtype=torch.bool)
    torch.testing.assert_close(got[0], torch.where(m, r_bar, 0), rtol=1e-10, atol=1e-10)
    if grad_values:
        torch.testing.assert_close(got[1], torch.where(m, v_bar, 0), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got_w, w_end, rtol=1e-10, atol=1e-10)


def test_lambda_adjoint_empty_and_no_carry():
    adj = Problem(family="lambda_adjoint", outputs=("rewards", "values"),
                  fields={"grad_returns": torch.zeros(3, 0), "grad_advantages": None}, gamma=0.9, lam=0.5)
    outs, w = compiled_cpu.run(adj)
    assert [o.shape for o in outs] == [(3, 0), (3, 0)] and torch.equal(w, torch.zeros(3))
    g = torch.randn(2, 6)
    adj = Problem(family="lambda_adjoint", outputs=("rewards",), fields={"grad_returns": g}, gamma=0.5, lam=1.0)
    (r_bar,), w = compiled_cpu.run(adj)
    # no flags, λ = 1: W_t = Σ_{s<t} γ^{t−s}·Ḡ_s, r̄ = Ḡ + W
    exp_w = torch.zeros(2, dtype=torch.float64)
    for t in range(6):
        torch.testing.assert_close(r_bar[:, t].double(), g[:, t].double() + exp_w, rtol=1e-6, atol=1e-6)
        exp_w = 0.5 * (g[:, t].double() + exp_w)
    torch.testing.assert_close(w.double(), exp_w, rtol=1e-6, atol=1e-6)


def test_cpu_bench_smoke(tmp_path):
    """``python -m benchmarks cpu`` (benchmarks/, outside the package) on two tiny shapes: every
    implementation it can run, rollbuf's numba backend among them, passes the float64 gate and is
    timed; the CSV and the markdown table are written."""
    import csv

    from benchmarks.__main__ import main as benchmarks_main
    from benchmarks.competitors import CPU_GAE

    assert "rollbuf-numba" in CPU_GAE
    impls = "rollbuf-numba,rollbuf-numba-tm,rollbuf-torch,plain-numba,sb3,cleanrl"
    assert benchmarks_main(["cpu", "--out", str(tmp_path), "--shapes", "1x8,3x40", "--budget-s", "0.01",
                            "--no-first-call", "--impls", impls]) == 0
    rows = list(csv.DictReader(open(tmp_path / "cpu.csv")))
    assert len(rows) == 12
    import importlib.util

    absent = set() if importlib.util.find_spec("stable_baselines3") else {"sb3"}  # (a GPU machine without it)
    rows = [r for r in rows if not (r["impl"] in absent and r["status"] == "unsupported")]
    assert len(rows) >= 10
    assert all(r["status"] == "ok" and float(r["err"]) < 1e-4 and float(r["call_us"]) > 0 for r in rows)
    assert "| 3 × 40 |" in (tmp_path / "cpu.md").read_text()
