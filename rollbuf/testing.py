"""Testing kit: random rollouts with every boundary, and comparison against the float64 oracle.

Use it to test rollbuf's backends, or your own estimator, against :mod:`rollbuf.reference` (the plain
sequential float64 loop, docs/semantics.md):

* :func:`make_rollout` builds one random rollout from a seed: rewards, values, log-probabilities,
  Q-values, flags of any density (bool, uint8 or 0/1 float), a mask made of masked *spans* whose
  steps hold garbage (NaN, ±inf, 1e30) and random flags, and ``bootstrap_values`` that are NaN at
  every slot that must not be read, so that any leak shows up as a NaN;
* :func:`rollouts`, :func:`gammas`, :func:`lams`, :func:`estimator_params` are
  `hypothesis <https://hypothesis.works>`_ strategies (for the rollouts hypothesis draws only the
  shape, the dtypes, the densities and a seed, so generation stays fast at any ``T``);
* :func:`assert_matches_reference` runs the reference for an estimator on the same fields and, on a
  mismatch, names the first differing ``(row, step)`` with its boundary context: the
  terminated/truncated/mask flags of steps ``t−1..t+1``, whether ``t`` is the window end, the
  bootstrap value there, and both numbers;
* :func:`assert_close_to_reference` is the same comparison for any two tensors;
* :func:`run_estimator` calls ``rollbuf.functional.<name>`` with just the fields that estimator takes.
* :func:`estimator_call` is that call with its arguments gathered once (a zero-argument callable).

Example: unit-test your own GAE against the oracle at every kind of boundary::

    import torch
    from hypothesis import given
    from rollbuf.testing import assert_matches_reference, gammas, lams, rollouts

    def my_gae(gamma, lam, rewards, values, terminated, truncated, bootstrap_values, mask):
        ...  # your implementation, returning (advantages, returns)

    @given(f=rollouts(max_t=70, dtypes=(torch.float32,)), gamma=gammas(), lam=lams())
    def test_my_gae(f, gamma, lam):
        out = my_gae(gamma, lam, f["rewards"], f["values"], f["terminated"], f["truncated"],
                     f["bootstrap_values"], f["mask"])
        assert_matches_reference("gae", out, f, gamma=gamma, lam=lam)

``rollouts(masks=False)`` if your estimator takes no mask. ``out`` may be one tensor (compared
with the estimator's first output: advantages, ``vs``, traces, ...) or a tuple in the order of the
estimator's result. Tolerances default to :func:`default_tolerance` of the output dtype, relative to
each row's magnitude. The strategies need ``hypothesis`` (the ``test`` extra); the rest does not.
A failure reads like::

    AssertionError: gae.advantages: 6 of 24 elements differ (max abs err 3.19792, rtol 0.0001, atol 5e-05 x row scale)
    first at row 1, step 5: actual 1.1095, expected 4.30742 (abs err 3.19792, allowed 0.000646113)
      step 4: terminated=0 truncated=0, bootstrap_values[4] = nan
      step 5: terminated=0 truncated=1   <- t, bootstrap_values[5] = 3
      step 6: terminated=0 truncated=0, bootstrap_values[6] = nan
      t is not the window end (window end of this row: step 11)

(here ``my_gae`` ignored the truncation at step 5; for a backward recursion the reported step is
the latest differing one, where the error starts, not step 0 where it has spread to).

Estimator names are those of :mod:`rollbuf.functional` (``gae``, ``advantages``, ``lambda_returns``,
``discounted_returns``, ``vtrace``, ``retrace``, ``eligibility_traces``, ``episodic_sums``) plus
``monte_carlo_returns`` (``discounted_returns(bootstrap=False)``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import torch

from rollbuf import estimators, windows

__all__ = [
    "ESTIMATORS",
    "FIELDS",
    "make_rollout",
    "rollouts",
    "gammas",
    "lams",
    "estimator_params",
    "run_estimator",
    "estimator_call",
    "reference_outputs",
    "default_tolerance",
    "assert_matches_reference",
    "assert_close_to_reference",
    "window_end_index",
]

NAN = float("nan")

#: The per-step fields a rollout from :func:`make_rollout` holds (``x`` only with ``features``).
FIELDS = ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask", "log_probs",
          "target_log_probs", "q_values")

_FLAG_FIELDS = ("terminated", "truncated", "mask")


class _RegistryView(Mapping):
    """``ESTIMATORS`` as read from :data:`rollbuf.estimators.REGISTRY` (estimators registered later
    appear too): name -> (function in rollbuf.functional, fields it takes, fixed keyword arguments)."""

    def __getitem__(self, name):
        e = estimators.REGISTRY[name]
        return (e.function_name, e.field_names, dict(e.fixed))

    def __iter__(self):
        return iter(estimators.REGISTRY)

    def __len__(self):
        return len(estimators.REGISTRY)


#: Estimator name -> (function in rollbuf.functional, fields it takes, fixed keyword arguments).
ESTIMATORS: Mapping[str, tuple[str, tuple[str, ...], dict]] = _RegistryView()

# ---------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------


def window_end_index(mask: torch.Tensor | None, shape) -> torch.Tensor:
    """The window end of each row of a ``[*B, T]`` rollout: its last unmasked step, ``-1`` if none
    (on the CPU; :func:`rollbuf.windows.window_end_index`)."""
    return windows.window_end_index(None if mask is None else mask.cpu(), shape)


def make_rollout(n=4, t=33, *, seed=0, dtype=torch.float32, flag_dtype=torch.bool,
                 p_terminated=0.05, p_truncated=0.05, p_masked=None, mask_span=4.0,
                 garbage=True, features=None, batch_shape=None, device="cpu") -> dict:
    """One random rollout ``[N, T]`` (or ``[*batch_shape, T]``) as a dict of fields.

    * ``rewards``, ``values`` ~ N(0, 1); ``q_values`` = values + N(0, 1); ``log_probs`` (behaviour)
      ≤ 0, ``target_log_probs`` = behaviour + N(0, 0.5²), equal to it on about a quarter of the steps;
    * ``terminated`` / ``truncated``: each step independently with probability ``p_terminated`` /
      ``p_truncated`` (both may be set at one step: terminated wins), in ``flag_dtype`` (bool, uint8
      or a floating dtype holding 0/1);
    * ``mask`` (``None`` unless ``p_masked`` is given): spans of mean length ``mask_span`` are masked
      with probability ``p_masked`` each; masked steps hold random flags and, with ``garbage``, NaN,
      ±inf or 1e30 in every float field (rewards, values, log-probs, q-values, ``x``);
    * ``bootstrap_values`` ``[N, T]``: a finite value where it is read — at truncated, not
      terminated, unmasked steps and at the window end (last unmasked step) unless terminated there —
      and NaN at every other slot;
    * ``x`` ``[N, T, *features]`` (only when ``features`` is a tuple): the input of the forward
      estimators, garbage at masked steps too.

    Everything is generated in float64 from ``seed`` and cast to ``dtype``, so the reference sees
    exactly the rounded inputs the backend sees.
    """
    if batch_shape is not None:
        batch_shape = tuple(batch_shape)
        n = math.prod(batch_shape)
    g = torch.Generator().manual_seed(int(seed) % (2**63))
    f64 = torch.float64

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=f64)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=f64)

    rewards, values = randn(n, t), randn(n, t)
    q_values = values + randn(n, t)
    log_probs = -rand(n, t) * 3.0
    target = log_probs + 0.5 * randn(n, t)
    target = torch.where(rand(n, t) < 0.25, log_probs, target)  # on-policy steps: ratio exactly 1
    terminated = rand(n, t) < p_terminated
    truncated = rand(n, t) < p_truncated
    x = None if features is None else randn(n, t, *features)

    mask = None if p_masked is None else _masked_spans(rand, n, t, p_masked, mask_span)
    live = torch.ones(n, t, dtype=torch.bool) if mask is None else mask
    if mask is not None and garbage:
        rewards, values, q_values, log_probs, target = [
            _with_garbage(v, live, g) for v in (rewards, values, q_values, log_probs, target)]
        x = None if x is None else _with_garbage(x, live, g)

    end = window_end_index(mask, (n, t))
    steps = torch.arange(t)
    at_end = (steps == end.unsqueeze(-1)) & live & ~terminated
    read = (truncated & ~terminated & live) | at_end
    bootstrap_values = torch.where(read, randn(n, t), NAN)

    def cast(v):
        return _placed(v, dtype, batch_shape, device)

    def flag(v):
        return _placed(v, flag_dtype, batch_shape, device)

    out = dict(rewards=cast(rewards), values=cast(values), terminated=flag(terminated),
               truncated=flag(truncated), bootstrap_values=cast(bootstrap_values), mask=flag(mask),
               log_probs=cast(log_probs), target_log_probs=cast(target), q_values=cast(q_values))
    if x is not None:
        out["x"] = cast(x)
    return out


def _masked_spans(rand, n: int, t: int, p_masked: float, mask_span: float) -> torch.Tensor:
    """A ``[n, t]`` mask (``rand(*shape)``: uniform draws): a new span starts at each step with
    probability ``1/mask_span``; each span is masked with probability ``p_masked``."""
    span_id = torch.cumsum((rand(n, t) < 1.0 / max(mask_span, 1.0)).long(), -1)
    span_masked = rand(n, t + 1) < p_masked
    return ~span_masked.gather(1, span_id)


def _with_garbage(v: torch.Tensor, live: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """``v`` (float64, ``[n, t, ...]``) with NaN, ±inf or ±1e30 drawn from ``g`` at the steps off ``live``."""
    junk = torch.tensor([NAN, math.inf, -math.inf, 1e30, -1e30], dtype=torch.float64)
    pick = torch.randint(0, len(junk), v.shape, generator=g)
    m = live.reshape(live.shape + (1,) * (v.dim() - 2))
    return torch.where(m, v, junk[pick])


def _placed(v: torch.Tensor | None, dtype: torch.dtype, batch_shape: tuple | None, device) -> torch.Tensor | None:
    """``v`` (``[N, T, ...]``) reshaped to ``[*batch_shape, T, ...]`` where given, in ``dtype`` on ``device``."""
    if v is None:
        return None
    if batch_shape is not None:
        v = v.reshape(*batch_shape, *v.shape[1:])
    return v.to(dtype).to(device)


#: Flag densities the strategies draw from: none, sparse, dense, every step.
DENSITIES = (0.0, 0.0, 0.02, 0.1, 0.5, 1.0)
#: Mask densities (fraction of masked spans); ``None`` = no mask tensor at all.
MASK_DENSITIES = (None, None, 0.0, 0.2, 0.5, 0.9, 1.0)


def rollouts(min_n=1, max_n=4, min_t=1, max_t=70, masks=True, dtypes=(torch.float32,),
             flag_dtypes=(torch.bool, torch.uint8, torch.float32), terminations=True, truncations=True,
             garbage=True, features=None, device="cpu"):
    """Hypothesis strategy: a dict of rollout fields from :func:`make_rollout`.

    Draws ``N ∈ [min_n, max_n]``, ``T ∈ [min_t, max_t]``, a dtype from ``dtypes``, a flag dtype from
    ``flag_dtypes`` (a floating flag dtype is replaced by the drawn value dtype), flag densities from
    :data:`DENSITIES` (each of terminated/truncated independently: none, sparse, dense, all), a mask
    density from :data:`MASK_DENSITIES` when ``masks`` (masked spans with garbage), and the seed.
    ``features`` (a tuple) adds ``x`` of shape ``[N, T, *features]`` for the forward estimators.
    """
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        n = draw(st.integers(min_n, max_n))
        t = draw(st.integers(min_t, max_t))
        dtype = draw(st.sampled_from(tuple(dtypes)))
        flag_dtype = draw(st.sampled_from(tuple(flag_dtypes)))
        if flag_dtype.is_floating_point:
            flag_dtype = dtype
        p_term = draw(st.sampled_from(DENSITIES)) if terminations else 0.0
        p_trunc = draw(st.sampled_from(DENSITIES)) if truncations else 0.0
        p_mask = draw(st.sampled_from(MASK_DENSITIES)) if masks else None
        span = draw(st.sampled_from((1.0, 3.0, 10.0)))
        seed = draw(st.integers(0, 2**63 - 1))
        return make_rollout(n, t, seed=seed, dtype=dtype, flag_dtype=flag_dtype, p_terminated=p_term,
                            p_truncated=p_trunc, p_masked=p_mask, mask_span=span, garbage=garbage,
                            features=features, device=device)

    return build()


def gammas(min_value=0.0):
    """Hypothesis strategy for a discount γ ∈ [0, 1]: 0, 1 and values near 1 often, any float else."""
    from hypothesis import strategies as st

    special = [v for v in (0.0, 1.0, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0 - 2.0**-20) if v >= min_value]
    return st.one_of(st.sampled_from(special),
                     st.floats(min_value, 1.0, allow_nan=False, allow_infinity=False))


def lams(min_value=0.0):
    """Hypothesis strategy for a trace decay λ ∈ [0, 1]: like :func:`gammas`."""
    return gammas(min_value)


def estimator_params(name: str, window_ends=("bootstrap", "terminal")):
    """Hypothesis strategy: the keyword parameters of estimator ``name`` (γ, λ, ρ̄, c̄, ρ̄_pg, window_end).

    Truncation levels ``ρ̄`` are drawn from (0, 3] and ``c̄`` from (0, 1] (1.0 and 0.5 often): a
    ``c̄ > 1`` lets the traces grow geometrically with ``T``, which tests range, not semantics.
    """
    from hypothesis import strategies as st

    entry = estimators.get(name)
    rho = st.one_of(st.sampled_from((1.0, 0.5, 2.0)), st.floats(0.05, 3.0))
    cbar = st.one_of(st.sampled_from((1.0, 0.5)), st.floats(0.05, 1.0))
    special = {"gamma": gammas(), "lam": lams(), "rho_bar": rho, "c_bar": cbar,
               "pg_rho_bar": st.one_of(st.none(), rho)}
    spec = {}
    for prm in entry.params:
        if prm.name in special:
            spec[prm.name] = special[prm.name]
        elif prm.check is estimators.unit_interval:
            spec[prm.name] = st.floats(0.0, 1.0)
        elif prm.check is estimators.positive:
            spec[prm.name] = st.floats(0.05, 3.0)
    boot = entry.field("bootstrap_values")
    if entry.direction == "backward" and (boot is None or boot.read):
        spec["window_end"] = st.sampled_from(tuple(window_ends))
    return st.fixed_dictionaries(spec)


# ---------------------------------------------------------------------------------------------
# calling estimators
# ---------------------------------------------------------------------------------------------


def _lookup(name):
    estimators.get(name)  # a clear error naming the known estimators
    return ESTIMATORS[name]


def _inputs(name, fields: Mapping, params: Mapping) -> dict:
    """Keyword arguments of ``rollbuf.functional.<fn>`` for estimator ``name``."""
    _, take, fixed = _lookup(name)
    kw = dict(fixed)
    for f in take:
        if f == "x":
            x = fields.get("x")
            kw["x"] = fields["rewards"] if x is None else x
        elif f in fields:
            kw[f] = fields[f]
    if take[0] == "x" and all(kw.get(f) is None for f in _FLAG_FIELDS):
        # the forward estimators need a [*B, T] flag to place x's time dimension
        shape = fields["rewards"].shape
        kw["terminated"] = torch.zeros(shape, dtype=torch.bool, device=fields["rewards"].device)
    kw.update(params)
    return kw


def run_estimator(name: str, fields: Mapping, *, backend="auto", **params):
    """``rollbuf.functional.<name>(**params, <the fields it takes>, backend=backend)``.

    ``fields`` may hold more fields than the estimator takes (a dict from :func:`make_rollout`);
    the forward estimators use ``fields["x"]`` if present, else the rewards. Returns what the
    function returns.
    """
    return estimator_call(name, fields, backend=backend, **params)()


def estimator_call(name: str, fields: Mapping, *, backend="auto", **params):
    """The zero-argument call :func:`run_estimator` makes, its arguments gathered once: calling it is
    exactly the user's call ``rollbuf.functional.<name>(...)`` (benchmarks time it)."""
    from rollbuf import functional as F

    fn_name = _lookup(name)[0]
    fn = getattr(F, fn_name, None)
    kw = dict(_inputs(name, fields, params), backend=backend)
    if fn is None or fn_name not in F.__all__:  # a registered estimator with no wrapper of its own
        return functools.partial(F.estimate, name, **kw)
    return functools.partial(fn, **kw)


def _as_tuple(out):
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(out)


def reference_outputs(name: str, fields: Mapping, **params) -> tuple[torch.Tensor, ...]:
    """The float64 reference outputs of estimator ``name`` on ``fields``, always as a tuple."""
    params = {k: v for k, v in params.items() if k not in ("out_dtype", "backend")}
    return _as_tuple(run_estimator(name, fields, backend="reference", **params))


# ---------------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------------


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for outputs of ``dtype`` against the float64 reference.

    The bound checked is ``|actual − expected| ≤ atol·scale + rtol·|expected|`` where ``scale`` is
    the largest ``|expected|`` of the row (at least 1): an output like an advantage ``G − V`` is a
    small difference of large numbers, so its error follows the row's magnitude, not its own.
    """
    if dtype == torch.float64:
        return 1e-9, 1e-9
    if dtype in (torch.float16, torch.bfloat16):
        return 2e-2, 2e-2
    return 1e-4, 5e-5


def _row_scale(e: torch.Tensor, lead: int) -> torch.Tensor:
    """Per-row max |expected| (at least 1), broadcast back to ``e``'s shape; rows = first ``lead`` dims."""
    if e.numel() == 0 or lead == 0:
        s = e.abs().nan_to_num(0.0, 0.0, 0.0).amax() if e.numel() else torch.tensor(1.0, dtype=e.dtype)
        return s.clamp_min(1.0).expand_as(e)
    flat = e.abs().nan_to_num(0.0, 0.0, 0.0).reshape(*e.shape[:lead], -1)
    s = flat.amax(-1).clamp_min(1.0)
    return s.reshape(*s.shape, *([1] * (e.dim() - lead))).expand_as(e)


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def _context(fields: Mapping, row: tuple, t: int | None) -> list[str]:
    """Lines describing the boundary around ``(row, t)`` of a rollout given by its fields."""
    flags = {k: fields.get(k) for k in _FLAG_FIELDS if fields.get(k) is not None}
    lines: list[str] = []
    shape = _layout(fields)
    if shape is None:
        return lines
    T = shape[-1]
    mask = fields.get("mask")
    end = int(window_end_index(None if mask is None else mask[row].unsqueeze(0), (1, T))[0])
    bv = fields.get("bootstrap_values")
    steps = range(max(t - 1, 0), min(t + 2, T)) if t is not None else range(max(T - 2, 0), T)
    for s in steps:
        parts = [f"{k}={int(float(fields[k][row + (s,)]) != 0)}" for k in flags]
        if not flags:
            parts = ["(no flags)"]
        line = f"  step {s}: " + " ".join(parts)
        if s == t:
            line += "   <- t"
        if bv is not None and bv.dim() == len(shape):
            line += f", bootstrap_values[{s}] = {_fmt(float(bv[row + (s,)]))}"
        lines.append(line)
    if t is not None:
        if end < 0:
            lines.append("  the row has no unmasked step (no window end)")
        elif t == end:
            lines.append(f"  t is the window end (last {'unmasked ' if mask is not None else ''}step of the row)")
        else:
            lines.append(f"  t is not the window end (window end of this row: step {end})")
    else:
        lines.append(f"  (a per-row output; window end of this row: step {end})")
    if bv is not None and bv.dim() == len(shape) - 1:
        lines.append(f"  bootstrap_values[row] ([*B] window-end column) = {_fmt(float(bv[row]))}")
    return lines


def _layout(fields: Mapping | None):
    """The ``[*B, T]`` shape of the rollout described by ``fields`` (from a flag or the rewards)."""
    if not fields:
        return None
    for k in ("mask", "terminated", "truncated", "rewards", "values"):
        v = fields.get(k)
        if isinstance(v, torch.Tensor):
            return tuple(v.shape)
    return None


def _first_bad(bad: torch.Tensor, lead: int, per_step: bool, direction: str) -> tuple:
    """Index of the first mismatch: first row, then the step met first by the recursion."""
    if not per_step or direction == "forward":
        flat = int(bad.reshape(-1).nonzero()[0, 0])
        return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), bad.shape))
    rows = bad.reshape(*bad.shape[:lead + 1], -1).any(-1)  # [*B, T]
    row: tuple[int, ...] = ()
    if lead > 0:
        r = int(rows.reshape(-1, rows.shape[-1]).any(-1).nonzero()[0, 0])
        row = tuple(int(i) for i in torch.unravel_index(torch.tensor(r), rows.shape[:-1]))
    t = int(rows[row].nonzero()[-1, 0])  # backward: the latest step differs first
    feat = bad[row + (t,)]
    rest = () if feat.dim() == 0 else tuple(
        int(i) for i in torch.unravel_index(feat.reshape(-1).nonzero()[0, 0], feat.shape))
    return row + (t,) + rest


def assert_close_to_reference(actual: torch.Tensor, expected: torch.Tensor,
                              context_fields: Mapping | None = None, *, rtol: float | None = None,
                              atol: float | None = None, name: str = "output",
                              equal_nan: bool = False, direction: str = "forward") -> None:
    """Assert ``actual`` matches the float64 ``expected``, explaining the first mismatch.

    ``actual`` is ``[*B, T, *F]`` (a per-step output) or ``[*B, *F]`` (a per-row output such as
    ``final``); ``context_fields`` (optional) are the rollout's fields (``terminated``,
    ``truncated``, ``mask``, ``bootstrap_values``, ``[*B, T]``), used to report the boundary around
    the first differing element. The bound is ``|a − e| ≤ atol·scale + rtol·|e|`` with ``scale``
    the row's largest ``|e|`` (at least 1); ``rtol``/``atol`` default to
    :func:`default_tolerance` of ``actual.dtype``. ±inf matches the same inf; NaN matches NaN only
    with ``equal_nan=True`` (a NaN in the reference means a NaN input was read: usually a broken test).
    The reported mismatch is in the first differing row, at the step the recursion meets first:
    the earliest with ``direction="forward"``, the latest with ``"backward"`` (an error at a
    boundary spreads to every earlier step of a backward recursion; the latest one is its origin).
    """
    __tracebackhide__ = True
    if not isinstance(actual, torch.Tensor):
        raise AssertionError(f"{name}: expected a torch.Tensor, got {type(actual).__name__}")
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != reference shape {tuple(expected.shape)}")
    d_rtol, d_atol = default_tolerance(actual.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if e.numel() == 0:
        return
    layout = _layout(context_fields)
    lead = len(layout) - 1 if layout is not None else (1 if e.dim() >= 2 else 0)
    if layout is not None and tuple(e.shape[:len(layout)]) == layout:
        per_step = True
    elif layout is not None and tuple(e.shape[:lead]) == layout[:-1]:
        per_step = False
    else:
        per_step, layout = True, None
    scale = _row_scale(e, lead)
    err = (a - e).abs()
    allowed = atol * scale + rtol * e.abs()
    same_special = a.isinf() & e.isinf() & (a.sign() == e.sign())
    if equal_nan:
        same_special |= a.isnan() & e.isnan()
    bad = ~((err <= allowed) | same_special)
    if not bool(bad.any()):
        return
    count = int(bad.sum())
    index = _first_bad(bad, lead, per_step and layout is not None, direction)
    finite = err[bad & ~err.isnan()]
    max_err = float(finite.max()) if finite.numel() else float("nan")
    n_nan = int((bad & err.isnan()).sum())
    nan_txt = f"{n_nan} NaN/inf mismatches, " if n_nan else ""
    lines = [f"{name}: {count} of {e.numel()} elements differ ({nan_txt}max abs err {_fmt(max_err)}, "
             f"rtol {rtol:g}, atol {atol:g} x row scale)"]
    av, ev = float(a[index]), float(e[index])
    where = f"index {index}"
    context: list[str] = []
    if layout is not None:
        row = index[:lead]
        t = index[lead] if per_step else None
        feat = index[lead + 1:] if per_step else index[lead:]
        row_txt = ", ".join(str(i) for i in row) if row else "0"
        where = f"row {row_txt}" + (f", step {t}" if per_step else " (per-row output)")
        if feat:
            where += f", feature {feat}"
        context = _context(context_fields or {}, row, t)  # a layout comes from the context fields
    lines.append(f"first at {where}: actual {_fmt(av)}, expected {_fmt(ev)} "
                 f"(abs err {_fmt(abs(av - ev))}, allowed {_fmt(float(allowed[index]))})")
    lines += context
    raise AssertionError("\n".join(lines))


def assert_matches_reference(estimator_name: str, outputs, fields: Mapping, *, rtol: float | None = None,
                             atol: float | None = None, equal_nan: bool = False, **params) -> None:
    """Assert that ``outputs`` equal estimator ``estimator_name`` computed by the float64 reference.

    ``fields`` are the rollout fields the outputs were computed from (a dict as made by
    :func:`make_rollout`; extra entries are ignored); ``params`` are the estimator's parameters as
    keywords (``gamma=``, ``lam=``, ``rho_bar=``, ``window_end=``, ``initial=``, ...).
    ``outputs`` is a tensor (compared with the estimator's first output) or a tuple/named tuple in
    the estimator's output order (a prefix is fine). Tolerances: :func:`assert_close_to_reference`;
    the reported step is the first mismatch in the recursion's order (the latest differing step of
    the row for the backward estimators).
    """
    __tracebackhide__ = True
    expected = reference_outputs(estimator_name, fields, **params)
    actual = _as_tuple(outputs)
    if len(actual) > len(expected):
        raise AssertionError(f"{estimator_name}: got {len(actual)} outputs, the estimator has {len(expected)}")
    entry = estimators.get(estimator_name)
    names, direction = entry.outputs, entry.direction
    for i, (a, e) in enumerate(zip(actual, expected, strict=False)):  # a prefix of the outputs
        label = f"{estimator_name}.{names[i] if i < len(names) else i}"
        assert_close_to_reference(a, e, fields, rtol=rtol, atol=atol, name=label, equal_nan=equal_nan,
                                  direction=direction)
