"""Bad input raises ``ValueError``/``TypeError`` whose message names the argument (SPEC §3).

Nothing is broadcast, nothing is silently bootstrapped with 0. Every case is one call with exactly
one thing wrong, built from a valid call (``test_valid_calls_pass`` checks the base calls work).
"""

from __future__ import annotations

import pytest
import torch

from rollbuf import backends
from rollbuf import functional as F

N, T = 3, 5


def _base():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(N, T, generator=g)
    return dict(rewards=r, values=torch.randn(N, T, generator=g),
                terminated=torch.zeros(N, T, dtype=torch.bool), truncated=torch.zeros(N, T, dtype=torch.bool),
                bootstrap_values=torch.randn(N, T, generator=g))


def _lp():
    return dict(log_probs=torch.zeros(N, T))


# name -> (function taking **overrides, kwargs); each call below is valid as is
CALLS = {
    "gae": lambda **kw: F.gae(**{"gamma": 0.99, "lam": 0.95, **_base(), **kw}),
    "lambda_returns": lambda **kw: F.lambda_returns(**{"gamma": 0.99, "lam": 0.95, **_base(), **kw}),
    "discounted_returns": lambda **kw: F.discounted_returns(**{"gamma": 0.99, **_base(), **kw}),
    "vtrace": lambda **kw: F.vtrace(**{"target_log_probs": torch.zeros(N, T), "gamma": 0.99, **_base(),
                                       **_lp(), **kw}),
    "retrace": lambda **kw: F.retrace(**{"q_values": torch.zeros(N, T), "target_log_probs": torch.zeros(N, T),
                                         "gamma": 0.99, **_base(), **_lp(), **kw}),
}
BACKWARD = list(CALLS)
SCALARS = {  # parameters in [0, 1] per estimator
    "gae": ("gamma", "lam"), "lambda_returns": ("gamma", "lam"), "discounted_returns": ("gamma",),
    "vtrace": ("gamma", "lam"), "retrace": ("gamma", "lam"),
}


def _raises(exc, *words):
    """``pytest.raises`` whose message must contain every word (the argument's name first)."""
    class _Check:
        def __enter__(self):
            self.ctx = pytest.raises(exc)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *a):
            out = self.ctx.__exit__(*a)
            msg = str(self.info.value)
            for w in words:
                assert w in msg, f"message {msg!r} does not mention {w!r}"
            return out

    return _Check()


@pytest.mark.parametrize("name", BACKWARD)
def test_valid_calls_pass(name):
    CALLS[name](backend="torch")
    CALLS[name](backend="reference")


# ---------------------------------------------------------------------------------------------
# shapes, devices, dtypes
# ---------------------------------------------------------------------------------------------

BAD_SHAPES = {
    "T+1": (N, T + 1),
    "missing-batch-dim": (T,),  # broadcastable: still an error
    "singleton-time": (N, 1),  # broadcastable
    "singleton-batch": (1, T),  # broadcastable
    "extra-dim": (N, T, 1),
    "transposed": (T, N),
}


@pytest.mark.parametrize("shape", BAD_SHAPES.values(), ids=BAD_SHAPES.keys())
@pytest.mark.parametrize("field", ["values", "terminated", "truncated", "mask"])
@pytest.mark.parametrize("name", BACKWARD)
def test_wrong_shape_is_not_broadcast(name, field, shape):
    dtype = torch.float32 if field == "values" else torch.bool
    with _raises(ValueError, field, str((N, T))):
        CALLS[name](**{field: torch.zeros(shape, dtype=dtype)}, backend="torch")


@pytest.mark.parametrize("field", ["log_probs", "target_log_probs", "q_values"])
def test_wrong_shape_of_policy_fields(field):
    with _raises(ValueError, field):
        CALLS["retrace"](**{field: torch.zeros(N, T + 1)}, backend="torch")


@pytest.mark.parametrize("shape", [(N, T + 1), (N + 1,), (T,), (N, 1)], ids=str)
def test_wrong_shape_of_bootstrap_values(shape):
    with _raises(ValueError, "bootstrap_values"):
        CALLS["gae"](bootstrap_values=torch.zeros(shape), backend="torch")


@pytest.mark.parametrize("field", ["rewards", "values", "terminated", "bootstrap_values", "log_probs"])
def test_mismatched_devices(field):
    """A field on another device (``meta`` stands in for a second device) is named, rewards too: the
    call's device is the one most of its fields are on."""
    good = CALLS["vtrace"]
    base = {**_base(), **_lp()}
    other = base[field].to("meta")
    with _raises(ValueError, field, "meta"):
        good(**{field: other}, backend="torch")


def test_the_odd_device_is_named_in_verl_and_torchrl_layouts():
    """The conversions from verl's and TorchRL's layouts name the tensor on the odd device, the first
    one included."""
    from rollbuf.boundary import conventions as C

    r, v, m = torch.zeros(N, T), torch.zeros(N, T), torch.ones(N, T)
    with _raises(ValueError, "token_level_rewards is on meta"):
        C.fields_from_verl(r.to("meta"), v, m)
    with _raises(ValueError, "response_mask is on meta"):
        C.fields_from_verl(r, v, m.to("meta"))
    k = torch.zeros(N, T, dtype=torch.bool)
    with _raises(ValueError, "rewards is on meta"):
        C.torchrl_from_fields(r.to("meta"), v, k, k)
    with _raises(ValueError, "truncated is on meta"):
        C.torchrl_from_fields(r, v, k, k.to("meta"))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=str)
@pytest.mark.parametrize("field", ["rewards", "values", "log_probs", "bootstrap_values"])
def test_non_float_values_are_rejected(field, dtype):
    bad = torch.ones(N, T, dtype=dtype)
    with _raises(TypeError, field, "float"):
        CALLS["vtrace"](**{field: bad}, backend="torch")


def test_integer_x_of_forward_estimators():
    with _raises(TypeError, "x"):
        F.eligibility_traces(torch.ones(N, T, dtype=torch.int64), 0.9, 0.9,
                             terminated=torch.zeros(N, T, dtype=torch.bool))
    with _raises(TypeError, "x"):
        F.episodic_sums(torch.ones(N, T, dtype=torch.int64), terminated=torch.zeros(N, T, dtype=torch.bool))


def test_flags_of_int64_are_rejected():
    with _raises(TypeError, "terminated"):
        CALLS["gae"](terminated=torch.zeros(N, T, dtype=torch.int64), backend="torch")


def test_non_tensor_fields():
    with _raises(TypeError, "rewards", "list"):
        CALLS["gae"](rewards=[[0.0] * T] * N, backend="torch")
    with _raises(TypeError, "values"):
        CALLS["gae"](values=1.0, backend="torch")


def test_zero_dim_rewards():
    with _raises(ValueError, "rewards"):
        F.discounted_returns(0.9, rewards=torch.tensor(1.0), window_end="terminal")


# ---------------------------------------------------------------------------------------------
# scalar parameters
# ---------------------------------------------------------------------------------------------

BAD_UNIT = {"above-1": (1.5, ValueError), "negative": (-0.1, ValueError), "nan": (float("nan"), ValueError),
            "inf": (float("inf"), ValueError), "bool": (True, TypeError), "str": ("0.9", TypeError),
            "tensor": (torch.tensor(0.9), TypeError), "none": (None, TypeError)}


def _unit_cases():
    for name, params in SCALARS.items():
        for param in params:
            for bid, (value, exc) in BAD_UNIT.items():
                yield pytest.param(name, param, value, exc, id=f"{name}-{param}-{bid}")
    for name in ("eligibility_traces-gamma", "eligibility_traces-lam"):
        for bid, (value, exc) in BAD_UNIT.items():
            yield pytest.param(*name.split("-"), value, exc, id=f"{name}-{bid}")


@pytest.mark.parametrize("name, param, value, exc", list(_unit_cases()))
def test_gamma_lam_outside_unit_interval(name, param, value, exc):
    if name == "eligibility_traces":
        kw = dict(gamma=0.9, lam=0.9, terminated=torch.zeros(N, T, dtype=torch.bool))
        kw[param] = value
        with _raises(exc, param):
            F.eligibility_traces(torch.zeros(N, T), **kw)
        return
    with _raises(exc, param):
        CALLS[name](**{param: value}, backend="torch")


@pytest.mark.parametrize("value, exc", [(0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                                        (False, TypeError), ("1", TypeError)],
                         ids=["zero", "negative", "nan", "bool", "str"])
@pytest.mark.parametrize("name, param", [("vtrace", "rho_bar"), ("vtrace", "c_bar"), ("vtrace", "pg_rho_bar"),
                                         ("retrace", "c_bar")])
def test_truncation_levels_must_be_positive(name, param, value, exc):
    with _raises(exc, param):
        CALLS[name](**{param: value}, backend="torch")


def test_bootstrap_flag_must_be_bool():
    with _raises(TypeError, "bootstrap"):
        CALLS["discounted_returns"](bootstrap=1, backend="torch")


@pytest.mark.parametrize("name", BACKWARD)
def test_unknown_window_end(name):
    with _raises(ValueError, "window_end", "'bootstrap'"):
        CALLS[name](window_end="zero", backend="torch")


# ---------------------------------------------------------------------------------------------
# bootstrap values
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BACKWARD)
def test_missing_window_end_bootstrap(name):
    with _raises(ValueError, "bootstrap_values", "window_end='terminal'"):
        CALLS[name](bootstrap_values=None, truncated=None, backend="torch")


@pytest.mark.parametrize("name", BACKWARD)
def test_no_bootstrap_needed_when_terminal_or_chained(name):
    """window_end='terminal' or carry= replace the window-end value: no error, and no NaN."""
    out = CALLS[name](bootstrap_values=None, truncated=None, window_end="terminal", backend="torch")
    assert all(torch.isfinite(o).all() for o in ((out,) if isinstance(out, torch.Tensor) else out))
    carry = torch.zeros(N, 2) if name == "vtrace" else torch.zeros(N)
    CALLS[name](bootstrap_values=None, truncated=None, carry=carry, backend="torch")


def test_monte_carlo_needs_no_bootstrap():
    F.discounted_returns(0.9, rewards=torch.ones(N, T), truncated=torch.ones(N, T, dtype=torch.bool),
                         bootstrap=False)


@pytest.mark.parametrize("how", ["window_end-terminal", "carry"])
@pytest.mark.parametrize("name", BACKWARD)
def test_truncated_without_bootstrap_values(name, how):
    """Even when the window end needs no value, a truncated step reads V(s'_t) from bootstrap_values."""
    kw = dict(window_end="terminal") if how == "window_end-terminal" else dict(
        carry=torch.zeros(N, 2) if name == "vtrace" else torch.zeros(N))
    with _raises(ValueError, "bootstrap_values", "truncated"):
        CALLS[name](bootstrap_values=None, **kw, backend="torch")


COLUMN_BACKENDS = ["reference", "torch"] + (["numba"] if backends.numba_available() else []) + (
    ["triton"] if backends.triton_available() else [])


def _outputs(res):
    return tuple(res) if isinstance(res, tuple) else (res,)


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("backend", COLUMN_BACKENDS)
@pytest.mark.parametrize("name", BACKWARD)
def test_window_end_column_bootstrap_with_interior_truncation(name, backend, with_mask):
    """A [*B] bootstrap_values is the window-end column only: a truncation before the window end
    reads NaN (no host read of the flags decides it), so the row's outputs are NaN from that step
    back and exact after it; the other rows are untouched. Under check_finite it is an error naming
    bootstrap_values and the [*B, T] shape to pass."""
    if backend == "triton" and torch.cuda.is_available():
        pytest.skip("CPU tensors: the interpreter's triton backend (the GPU test covers CUDA)")
    tr = torch.zeros(N, T, dtype=torch.bool)
    tr[1, 2] = True  # interior: row 1's window end is step T - 1
    tr[0, T - 1] = True  # at the window end: read from the column
    col = torch.randn(N, generator=torch.Generator().manual_seed(1))
    kw = dict(truncated=tr, bootstrap_values=col, backend=backend)
    if with_mask:
        m = torch.ones(N, T, dtype=torch.bool)
        m[1, 1] = False
        kw["mask"] = m
    got = _outputs(CALLS[name](**kw))
    # the same column given as [*B, T] values: V(s_T) at the window end, what a truncation reads elsewhere
    per_step = torch.full((N, T), 7.0)
    per_step[:, -1] = col
    want = _outputs(CALLS[name](**dict(kw, bootstrap_values=per_step)))
    live = torch.ones(N, T, dtype=torch.bool) if not with_mask else kw["mask"]
    for a, b in zip(got, want):
        assert a[1, :3][live[1, :3]].isnan().all(), (name, backend, a[1])
        torch.testing.assert_close(a[1, 3:], b[1, 3:], rtol=0, atol=0)
        torch.testing.assert_close(a[[0, 2]], b[[0, 2]], rtol=0, atol=0)
        if with_mask:
            assert a[1, 1] == 0  # a masked step's output stays 0
    from rollbuf import check_finite

    with check_finite(), _raises(ValueError, "bootstrap_values", "[*B, T]", "before the window end", "row 1, step 2"):
        CALLS[name](**kw)


def test_window_end_column_bootstrap_reads_no_data():
    """The [*B] column with truncations is checked without reading the flags: the call validates
    and runs on tensors that have no data at all (meta), where any host read would raise."""
    kw = dict(_base(), truncated=torch.zeros(N, T, dtype=torch.bool), bootstrap_values=torch.zeros(N))
    meta = {k: v.to("meta") for k, v in kw.items()}
    for name in BACKWARD:
        extra = {k: torch.zeros(N, T, device="meta") for k in ("log_probs", "target_log_probs", "q_values")}
        extra = {k: v for k, v in extra.items() if k in {"vtrace": ("log_probs", "target_log_probs"),
                                                         "retrace": ("log_probs", "target_log_probs", "q_values")
                                                         }.get(name, ())}
        out = _outputs(CALLS[name](**meta, **extra, backend="torch"))
        assert all(o.device.type == "meta" and o.shape == (N, T) for o in out)


@pytest.mark.parametrize("name", BACKWARD)
def test_window_end_column_bootstrap_with_truncation_at_window_end_is_fine(name):
    tr = torch.zeros(N, T, dtype=torch.bool)
    tr[:, -1] = True
    m = torch.ones(N, T, dtype=torch.bool)
    m[0, 3:] = False  # row 0 ends at step 2; a truncation flag at masked step 4 is ignored
    tr[0, 2] = True
    CALLS[name](truncated=tr, mask=m, bootstrap_values=torch.zeros(N), backend="torch")


# ---------------------------------------------------------------------------------------------
# backends, carries, out_dtype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["cuda", "Torch", "numpy", None, ""])
def test_unknown_backend(backend):
    with _raises(ValueError, "backend"):
        CALLS["gae"](backend=backend)


def test_triton_on_cpu_without_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with _raises(ValueError, "backend='triton'", "TRITON_INTERPRET"):
        CALLS["gae"](backend="triton")


@pytest.mark.parametrize("shape", [(N + 1,), (N, 1), (), (N, 2)], ids=str)
@pytest.mark.parametrize("name", ["gae", "lambda_returns", "discounted_returns", "retrace"])
def test_wrong_carry_shape(name, shape):
    with _raises(ValueError, "carry", str((N,))):
        CALLS[name](carry=torch.zeros(shape), backend="torch")


@pytest.mark.parametrize("shape", [(N,), (N, 1), (N, 3), (2, N)], ids=str)
def test_wrong_vtrace_carry_shape(shape):
    with _raises(ValueError, "carry", str((N, 2))):
        CALLS["vtrace"](carry=torch.zeros(shape), backend="torch")


def test_carry_dtype_and_device():
    with _raises(TypeError, "carry"):
        CALLS["gae"](carry=torch.zeros(N, dtype=torch.int64), backend="torch")
    with _raises(ValueError, "carry", "meta"):
        CALLS["gae"](carry=torch.zeros(N, device="meta"), backend="torch")


@pytest.mark.parametrize("fn", ["eligibility_traces", "episodic_sums"])
def test_wrong_initial_shape_names_initial(fn):
    args = (torch.zeros(N, T), 0.9, 0.9) if fn == "eligibility_traces" else (torch.zeros(N, T),)
    with _raises(ValueError, "initial", str((N,))):
        getattr(F, fn)(*args, initial=torch.zeros(N + 1), terminated=torch.zeros(N, T, dtype=torch.bool))


def test_forward_estimators_need_a_flag_to_place_time():
    with _raises(ValueError, "terminated"):
        F.episodic_sums(torch.zeros(N, T))


def test_forward_x_must_match_flags():
    with _raises(ValueError, "x", str((N, T))):
        F.episodic_sums(torch.zeros(N, T + 1), terminated=torch.zeros(N, T, dtype=torch.bool))


@pytest.mark.parametrize("out_dtype", [torch.int32, torch.bool, torch.complex64, "float32"], ids=str)
@pytest.mark.parametrize("name", BACKWARD)
def test_out_dtype_must_be_float(name, out_dtype):
    with _raises(TypeError, "out_dtype"):
        CALLS[name](out_dtype=out_dtype, backend="torch")


def test_reference_backend_refuses_carry():
    with _raises(ValueError, "reference", "carry"):
        CALLS["gae"](carry=torch.zeros(N), backend="reference")


def test_affine_scan_validation():
    a = torch.zeros(N, T)
    with _raises(ValueError, "beta"):
        F.affine_scan(a, torch.zeros(N, T + 1))
    with _raises(TypeError, "reverse"):
        F.affine_scan(a, a, reverse=1)
    with _raises(ValueError, "initial"):
        F.affine_scan(a, a, initial=torch.zeros(N + 1))
    with _raises(TypeError, "alpha"):
        F.affine_scan(torch.zeros(N, T, dtype=torch.int64), a)


def test_row_bootstrap_with_a_terminated_and_truncated_interior_step_is_accepted():
    """Terminated wins: an interior step flagged both reads no bootstrap value, so a [*B]
    bootstrap_values (window-end column only) is enough."""
    r, v = torch.randn(2, 9), torch.randn(2, 9)
    k = torch.zeros(2, 9, dtype=torch.bool)
    tr = torch.zeros(2, 9, dtype=torch.bool)
    k[0, 3] = tr[0, 3] = True
    bv = torch.randn(2)
    got = F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv, backend="torch")
    ref = F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv, backend="reference")
    torch.testing.assert_close(got.advantages, ref.advantages.float())
    tr[1, 4] = True  # a truncation that does read: NaN from there back (check_finite: an error)
    out = F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv, backend="torch")
    assert out.advantages[1, :5].isnan().all() and not out.advantages[1, 5:].isnan().any()
    from rollbuf import check_finite

    with check_finite(), pytest.raises(ValueError, match="bootstrap_values"):
        F.gae(0.9, 0.8, rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv, backend="torch")


def test_repeated_calls_are_validated_and_hold_no_tensors():
    """Every call is validated on its own tensors (no cache but the kernels' launches): a repeated
    call equals a fresh one on its new data, keeps every error, the data check and gradients, and
    nothing keeps a caller's tensor alive."""
    import gc
    import weakref

    from rollbuf import check_finite

    g = torch.Generator().manual_seed(5)
    r, v = torch.randn(4, 11, generator=g), torch.randn(4, 11, generator=g)
    k = torch.rand(4, 11, generator=g) < 0.2
    bv = torch.randn(4, generator=g)
    kw = dict(values=v, terminated=k, bootstrap_values=bv, backend="torch")
    first = F.advantages(0.9, 0.8, rewards=r, **kw)
    r2 = torch.randn(4, 11, generator=g)
    got = F.advantages(0.9, 0.8, rewards=r2, **kw)
    want = F.advantages(0.9, 0.8, rewards=r2.double(), values=v.double(), terminated=k,
                        bootstrap_values=bv.double(), backend="reference")
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert not torch.equal(first, got)
    with pytest.raises(ValueError, match="gamma"):
        F.advantages(1.5, 0.8, rewards=r2, **kw)
    with pytest.raises(TypeError, match="return_carry"):
        F.gae(0.9, 0.8, rewards=r2, return_carry=1, **kw)  # 1 == True, but not a bool
    with pytest.raises(TypeError, match="gamma"):  # a tensor where a number goes
        F.advantages(torch.tensor(0.9), 0.8, rewards=r2, **kw)
    with pytest.raises(ValueError, match="rewards"):  # another shape
        F.advantages(0.9, 0.8, rewards=r2[:, :5], **kw)
    bad = r2.clone()
    bad[1, 3] = float("nan")
    with check_finite(), pytest.raises(ValueError, match="rewards"):
        F.advantages(0.9, 0.8, rewards=bad, **kw)
    rg = r2.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.advantages(0.9, 0.8, rewards=rg, **kw).sum(), rg)
    assert grad.abs().sum() > 0
    ref = weakref.ref(r2)
    del r2, got, rg, grad
    gc.collect()
    assert ref() is None, "a caller's tensor is kept alive"


def test_the_plain_and_the_checked_validation_agree():
    """Validation takes one pass over a call whose tensors are all plain, of one shape, device and
    kind-right dtype (no message built), else the path that names what is wrong. On every call the
    first accepts, both build the same fields; any call the first does not accept goes to the other."""
    from rollbuf import estimators, validation

    g = torch.Generator().manual_seed(11)
    base = dict(_base(), mask=torch.rand(N, T, generator=g) < 0.8, log_probs=torch.zeros(N, T),
                target_log_probs=torch.zeros(N, T), q_values=torch.zeros(N, T))
    variants = {
        "as is": {}, "no truncated": dict(truncated=None), "[N] column": dict(bootstrap_values=torch.zeros(N)),
        "[N] column, no truncated": dict(bootstrap_values=torch.zeros(N), truncated=None),
        "no mask": dict(mask=None), "uint8 flags": dict(terminated=torch.zeros(N, T, dtype=torch.uint8)),
        "float64 values": dict(values=torch.zeros(N, T, dtype=torch.float64)),
        "no bootstrap values": dict(bootstrap_values=None, truncated=None),
        "a transposed field": dict(values=torch.zeros(T, N)), "an int field": dict(rewards=torch.zeros(N, T, dtype=torch.int32)),  # noqa: E501
        "a subclass": dict(values=torch.nn.Parameter(torch.zeros(N, T), requires_grad=False)),
        "a 0-d field": dict(values=torch.tensor(1.0)), "a list": dict(values=[0.0] * T),
        "[N, 1] bootstrap": dict(bootstrap_values=torch.zeros(N, 1)),
    }
    for name in ("gae", "discounted_returns", "monte_carlo_returns", "vtrace", "retrace"):
        est = estimators.get(name)
        for label, change in variants.items():
            for window_end, carry in (("bootstrap", None), ("terminal", None), ("bootstrap", torch.zeros(N)),
                                      ("sideways", None)):
                fields = {f.name: dict(base, **change).get(f.name) for f in est.fields}
                plain = validation.backward_plain(est, fields, window_end, carry)
                try:
                    checked = validation.backward_checked(est, fields, window_end, carry)
                except (TypeError, ValueError):
                    assert plain is None, (name, label, window_end)
                    continue
                if plain is None:
                    assert label in ("a subclass",), (name, label, window_end)
                    continue
                assert tuple(plain.shape) == tuple(checked.shape) and plain.device == checked.device
                assert list(plain.fields) == list(checked.fields) or set(plain.fields) == set(checked.fields)
                for key, x in checked.fields.items():
                    y = plain.fields[key]
                    if x is None or y is None:
                        assert x is y, (name, label, key)
                    else:
                        torch.testing.assert_close(y, x, rtol=0, atol=0, equal_nan=True)
                assert [t.dtype for t in plain.floats] == [t.dtype for t in checked.floats]


@pytest.mark.interpret
def test_repeated_kernel_calls_follow_the_forced_kernel_choices():
    """The launch a repeated call reuses was built under the kernel choices forced then; under other
    choices the call takes the full path (here: outputs poisoned with NaN before the launch, and a
    split row), and gives the same values."""
    import rollbuf.kernels as K

    g = torch.Generator().manual_seed(6)
    r, v = torch.randn(2, 37, generator=g), torch.randn(2, 37, generator=g)
    kw = dict(rewards=r, values=v, terminated=torch.rand(2, 37, generator=g) < 0.2,
              bootstrap_values=torch.randn(2, generator=g))
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter takes CPU tensors
    kw = {k: x.to(dev) for k, x in kw.items()}
    kw["backend"] = "triton"
    plain = F.gae(0.9, 0.8, **kw)
    with K.forced(split=True, block_t=8, poison=True):
        forced = F.gae(0.9, 0.8, **kw)
        again = F.gae(0.9, 0.8, **kw)
    for a, b, c in zip(plain, forced, again):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b, c, rtol=0, atol=0)
    torch.testing.assert_close(F.gae(0.9, 0.8, **kw).advantages, plain.advantages, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# the field that is wrong is the one named
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BACKWARD)
def test_a_transposed_rewards_is_blamed_on_rewards(name):
    """[*B, T] is the shape most per-step fields have: the one that disagrees is named, also when it
    is the first field of the signature."""
    with _raises(ValueError, "rewards must have shape", str((N, T)), str((T, N))) as info:
        CALLS[name](rewards=torch.zeros(T, N), backend="torch")
    assert not str(info.value).startswith("values")


def test_a_tie_goes_to_the_first_field_and_names_the_reference():
    """With only rewards and values, neither outvotes the other: rewards (first) fixes the layout."""
    with _raises(ValueError, "values must have shape", str((T, N)), "rewards"):
        F.gae(0.9, 0.9, rewards=torch.zeros(T, N), values=torch.zeros(N, T), bootstrap_values=torch.zeros(T))


@pytest.mark.parametrize("flag", ["terminated", "truncated", "mask"])
@pytest.mark.parametrize("fn", ["eligibility_traces", "episodic_sums"])
def test_forward_estimators_name_the_wrongly_shaped_flag(fn, flag):
    args = (torch.zeros(N, T), 0.9, 0.9) if fn == "eligibility_traces" else (torch.zeros(N, T),)
    kw = dict(terminated=torch.zeros(N, T, dtype=torch.bool), mask=torch.ones(N, T, dtype=torch.bool))
    for bad in [(N, T - 1), (T, N), (N, T, 1), (N + 1, T)]:
        with _raises(ValueError, f"{flag} must have shape") as info:
            getattr(F, fn)(*args, **{**kw, flag: torch.zeros(bad, dtype=torch.bool)})
        assert str(bad) in str(info.value)
    with _raises(ValueError, "terminated must have shape", str((N, T - 1))):  # the only flag: x is first
        getattr(F, fn)(*args, terminated=torch.zeros(N, T - 1, dtype=torch.bool))
    with _raises(ValueError, "terminated", "0-d"):
        getattr(F, fn)(*args, terminated=torch.tensor(False))
    # x itself is named where the flags agree with each other and not with it
    args = (torch.zeros(T, N), *args[1:])
    with _raises(ValueError, "x must have shape", str((N, T)), "terminated, mask"):
        getattr(F, fn)(*args, **kw)


def test_episodic_sums_refuses_rewards_beside_x():
    x, k = torch.ones(N, T), torch.zeros(N, T, dtype=torch.bool)
    with _raises(TypeError, "unexpected keyword argument 'rewards'"):
        F.episodic_sums(x, rewards=torch.zeros(N, T), terminated=k)
    assert F.episodic_sums(rewards=x, terminated=k).sums[:, -1].tolist() == [float(T)] * N


# ---------------------------------------------------------------------------------------------
# NumPy scalars as hyper-parameters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["float32", "float64", "float16", "int64"])
@pytest.mark.parametrize("name", BACKWARD)
def test_numpy_scalars_are_real_numbers(name, kind):
    np = pytest.importorskip("numpy")
    value = getattr(np, kind)(1 if kind == "int64" else 0.5)
    for param in SCALARS[name]:
        got = CALLS[name](**{param: value}, backend="torch")
        want = CALLS[name](**{param: float(value)}, backend="torch")
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    if name == "vtrace":
        got = CALLS[name](rho_bar=np.float32(0.5), c_bar=np.float32(2.0), backend="torch")
        want = CALLS[name](rho_bar=0.5, c_bar=2.0, backend="torch")
        torch.testing.assert_close(got.vs, want.vs, rtol=0, atol=0)


@pytest.mark.parametrize("value", ["bool_", "tensor64"])
def test_numpy_bools_and_tensors_are_not_numbers(value):
    np = pytest.importorskip("numpy")
    v = np.bool_(True) if value == "bool_" else torch.tensor(0.9, dtype=torch.float64)
    with _raises(TypeError, "gamma", "real number"):
        CALLS["gae"](gamma=v, backend="torch")
    with _raises(TypeError, "gamma", "real number"):
        F.eligibility_traces(torch.zeros(N, T), v, 0.9, terminated=torch.zeros(N, T, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------
# a float64 initial / carry makes the accumulation float64
# ---------------------------------------------------------------------------------------------

_BACKENDS = (["reference", "torch"] + (["numba"] if backends.numba_available() else [])
             + (["triton"] if backends.triton_available() else []))
_CHAINED = [(fn, be) for fn in ("affine_scan", "eligibility_traces", "episodic_sums", "gae", "vtrace")
            for be in _BACKENDS if not (be == "reference" and fn in ("gae", "vtrace"))]  # (no carry= there)


@pytest.mark.parametrize("fn, backend", _CHAINED)
def test_a_float64_initial_or_carry_makes_the_accumulation_float64(fn, backend):
    """Every floating input takes part in the compute dtype, the chained state included: 1e8 + t
    is exact in float64 and stuck at 1e8 (step 8) in float32, so float32 fields with a float64
    initial/carry of 1e8 must give 1e8 + t (rounded once, to the float32 output)."""
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    Tn = 16
    one, zero = torch.ones(1, Tn, device=dev), torch.zeros(1, Tn, device=dev)
    k = torch.zeros(1, Tn, dtype=torch.bool, device=dev)
    big = torch.tensor([1e8], dtype=torch.float64, device=dev)
    steps = torch.arange(1, Tn + 1, dtype=torch.float64)
    if fn == "affine_scan":
        y = F.affine_scan(one, one, initial=big, backend=backend)
        want = 1e8 + steps
    elif fn == "eligibility_traces":
        y, final = F.eligibility_traces(one, 1.0, 1.0, big, terminated=k, backend=backend)
        assert final.dtype == torch.float64 and final.tolist() == [1e8 + Tn]
        want = 1e8 + steps
    elif fn == "episodic_sums":
        y, final = F.episodic_sums(one, big, terminated=k, backend=backend)
        assert final.dtype == torch.float64 and final.tolist() == [1e8 + Tn]
        want = 1e8 + steps
    elif fn == "gae":
        (_, y), carry = F.gae(1.0, 1.0, rewards=one, values=zero, terminated=k, carry=big, return_carry=True,
                              backend=backend)
        assert carry.dtype == torch.float64 and carry.tolist() == [1e8 + Tn]
        want = 1e8 + steps.flip(0)
    else:
        (y, _), carry = F.vtrace(zero, 1.0, rewards=one, values=zero, log_probs=zero, terminated=k,
                                 carry=torch.tensor([[1e8, 0.0]], dtype=torch.float64, device=dev),
                                 return_carry=True, backend=backend)
        assert carry.dtype == torch.float64 and carry[0, 0].item() == 1e8 + Tn
        want = 1e8 + steps.flip(0)
    assert y.dtype == torch.float32  # the outputs keep the fields' dtype
    assert y.cpu().reshape(-1).tolist() == want.float().tolist()
