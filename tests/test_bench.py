"""The benchmarks (``python -m benchmarks``, outside the package): the CPU smoke run of the
scoreboard (what CI runs), its correctness gate, its clocks and regression check, the peers'
adapters, the naive kernel, the CPU table, the dry runs of the GPU commands, and the runner."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

from benchmarks import competitors as C  # noqa: E402
from benchmarks import scoreboard as cli  # noqa: E402
from benchmarks import suite  # noqa: E402
from benchmarks.__main__ import main as runner  # noqa: E402
from benchmarks.cases import GRIDS, Case  # noqa: E402
from benchmarks.suite import compare, run_cases, scoreboard  # noqa: E402
from rollbuf import backends  # noqa: E402

# the Triton kernels' tests run compiled on a CUDA machine, on CPU tensors under the interpreter elsewhere
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _csv_rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_cpu_smoke_run_writes_scoreboard_and_csv(tmp_path):
    rc = cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch,loop", "--out", str(tmp_path)])
    assert rc == 0
    rows = _csv_rows(tmp_path / "results.csv")
    assert len(rows) == 2 * len(GRIDS["cpu-smoke"])
    ours = [r for r in rows if r["impl"] == "rollbuf-torch"]
    assert all(r["status"] == "ok" and float(r["rel_err"]) < 1e-4 for r in ours)
    assert all(float(r["err"]) < float(r["tol"]) == 1e-4 for r in ours)  # the gated error, fp32
    loop = [r for r in rows if r["impl"] == "loop"]
    assert {r["status"] for r in loop} == {"ok", "unsupported"}  # GAE without masks only
    assert all(r["commit"] and r["torch"] == torch.__version__ for r in rows)  # provenance
    board = (tmp_path / "scoreboard.md").read_text()
    assert "| loop |" in board and "geomean" in board


def test_a_wrong_competitor_is_reported_wrong_not_timed(monkeypatch):
    def broken(name, f, params):  # forgets truncations: bootstraps nothing, cuts nothing
        g = dict(f, truncated=None)
        return C.rollbuf_backend("torch")(name, g, params)

    monkeypatch.setitem(C.COMPETITORS, "broken", broken)
    rows = run_cases([Case("gae", 4, 200, mix="term+trunc")], ["rollbuf-torch", "broken"], "cpu", reps=1)
    status = {r["impl"]: r["status"] for r in rows}
    assert status == {"rollbuf-torch": "ok", "broken": "wrong"}
    assert "call_us" not in next(r for r in rows if r["impl"] == "broken")
    board = {b["impl"]: b for b in scoreboard(rows, "rollbuf-torch")}
    assert board["broken"]["pass_rate"] == 0.0


def test_compare_lists_cases_slower_than_the_spread():
    base = [dict(estimator="gae", n=8, t=64, dtype="float32", mix="none", impl="x", status="ok",
                 call_us=100.0, spread=0.02),
            dict(estimator="gae", n=8, t=128, dtype="float32", mix="none", impl="x", status="ok",
                 call_us=100.0, spread=0.02)]
    new = [dict(base[0], call_us=104.0), dict(base[1], call_us=130.0)]
    slower = compare(new, base, "x")
    assert [s["case"][2] for s in slower] == [128]


def test_parts_cover_the_grid_once_with_whole_shapes():
    from benchmarks.cases import part, shape_cost

    cases = GRIDS["gpu"]
    parts = [part(cases, i, 3) for i in range(3)]
    assert sorted(c.key for p in parts for c in p) == sorted(c.key for c in cases)
    shapes = [{(c.n, c.t) for c in p} for p in parts]
    assert not (shapes[0] & shapes[1]) and not (shapes[1] & shapes[2]) and not (shapes[0] & shapes[2])
    cost = [sum(shape_cost(c.n, c.t) for c in p) for p in parts]
    assert max(cost) < 1.5 * min(cost)  # dealt out by cost


def test_budget_skips_and_scoreboard_from_csv_parts(tmp_path):
    """A spent budget reports the remaining cases as skipped (not failed); the parts of a run merge
    into one scoreboard with --from-csv."""
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    assert cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch", "--part", "0/2", "--out", str(a)]) == 0
    assert cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch", "--part", "1/2", "--budget-s", "0",
                     "--out", str(b)]) == 0
    rows_b = _csv_rows(b / "results.csv")
    assert rows_b and {r["status"] for r in rows_b} == {"skipped"}
    assert cli.main(["--from-csv", str(a / "results.csv"), str(b / "results.csv"), "--out", str(merged)]) == 0
    board = (merged / "scoreboard.md").read_text()
    n_a = len(_csv_rows(a / "results.csv"))
    assert f"| rollbuf-torch | {n_a} | {n_a} | 100% |" in board  # skipped cases are not counted as attempted


def test_a_part_run_again_without_some_shapes_stays_within_the_part(tmp_path):
    """``--part i/k`` is cut from the whole grid before ``--skip-shapes`` / ``--only-shapes`` /
    ``--estimators`` / ``--mixes`` narrow it: re-running a part without a shape it holds runs the rest
    of that same part (cut after the filter, the parts were re-dealt and the re-run measured cases of
    the other part)."""
    def keys(out, *extra):
        grid = [] if "--grid" in extra else ["--grid", "peers"]
        assert cli.main([*grid, "--competitors", "rollbuf-torch", "--budget-s", "0", "--out", str(out), *extra]) == 0
        return {(r["estimator"], r["n"], r["t"], r["mix"]) for r in _csv_rows(out / "results.csv")}

    whole = keys(tmp_path / "w", "--part", "1/2")
    other = keys(tmp_path / "o", "--part", "0/2")
    assert whole and not whole & other
    big = max({(n, t) for _, n, t, _ in whole}, key=lambda s: int(s[0]) * int(s[1]))
    rest = keys(tmp_path / "r", "--part", "1/2", "--skip-shapes", f"{big[0]}x{big[1]}")
    assert rest == {k for k in whole if (k[1], k[2]) != big}
    only = keys(tmp_path / "s", "--part", "1/2", "--only-shapes", f"{big[0]}x{big[1]}")
    assert only == whole - rest
    # in the CPU smoke grid the masked cases cover fewer shapes: dealt alone, they would split otherwise
    smoke = keys(tmp_path / "sw", "--grid", "cpu-smoke", "--part", "1/2")
    masked = keys(tmp_path / "sm", "--grid", "cpu-smoke", "--part", "1/2", "--mixes", "mask")
    assert masked and masked == {k for k in smoke if k[3] == "mask"}


def test_time_major_cases_are_views_and_pass_the_gate():
    """``layout="time"``: the fields are [T, N] buffers passed as [N, T] views (time stride N), and
    both the competitors and rollbuf read them in place and pass the float64 gate."""
    case = Case("gae", 16, 64, layout="time")
    f = suite.make_fields(case, "cpu")
    assert f["rewards"].shape == (16, 64) and f["rewards"].stride() == (1, 16)
    rows = run_cases([case, Case("gae", 16, 64)], ["rollbuf-torch", "loop"], "cpu", reps=1)
    assert {(r["layout"], r["impl"]): r["status"] for r in rows} == {
        ("time", "rollbuf-torch"): "ok", ("time", "loop"): "ok", ("env", "rollbuf-torch"): "ok", ("env", "loop"): "ok"}


def test_rows_from_csvs_before_the_layout_column_are_env_major():
    from benchmarks.cases import row_key

    old = dict(estimator="gae", n="8", t="64", dtype="float32", mix="none", impl="x")
    assert row_key(old) == ("gae", 8, 64, "float32", "none", "env")
    assert row_key(dict(old, layout="time"))[-1] == "time"


def test_window_end_bootstrap_is_finite_in_small_cases():
    """Loops that compute γ·(1 − done)·V' must not be failed by a NaN no trainer passes: the
    window-end bootstrap value is finite even where the last step terminated, while the slots that
    are never read stay NaN."""
    for seed in range(8):
        case = Case("gae", 64, 33, mix="term")
        f = suite.make_fields(case, "cpu", seed=seed)
        bv = f["bootstrap_values"]
        assert torch.isfinite(bv[:, -1]).all()
        assert bv[:, :-1].isnan().any()  # unread slots keep their poison
        rows = run_cases([case], ["loop"], "cpu", reps=1)
        assert rows[0]["status"] == "ok", rows[0]
    masked = suite.make_fields(Case("gae", 64, 33, mix="mask"), "cpu", seed=1)
    from rollbuf.testing import window_end_index

    end = window_end_index(masked["mask"], (64, 33)).clamp_min(0)
    assert torch.isfinite(masked["bootstrap_values"].gather(1, end[:, None])).all()


def test_redo_runs_only_failed_cases_and_later_csvs_replace_rows(tmp_path):
    first, again = tmp_path / "a", tmp_path / "b"
    assert cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch", "--out", str(first)]) == 0
    rows = _csv_rows(first / "results.csv")
    rows[0]["status"] = "wrong"  # as if one case had failed
    with open(first / "results.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch", "--redo", str(first / "results.csv"),
                     "--out", str(again)]) == 0
    redo = _csv_rows(again / "results.csv")
    assert [(r["estimator"], r["n"], r["t"], r["mix"]) for r in redo] == [
        (rows[0]["estimator"], rows[0]["n"], rows[0]["t"], rows[0]["mix"])]
    assert redo[0]["status"] == "ok"
    merged_rows = suite.read_csv([str(first / "results.csv"), str(again / "results.csv")])
    assert len(merged_rows) == len(rows) and all(r["status"] == "ok" for r in merged_rows)


@pytest.mark.parametrize("name", ["memory", "backward"])
def test_gpu_commands_dry_run(name, tmp_path):
    """The GPU commands in their CPU dry-run mode under Triton's interpreter (one process each, as
    on the GPU, started by the runner): their logic (every case's call, the backward's float64
    gate) must not fail where device time is scarce."""
    import os
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    res = subprocess.run([sys.executable, "-m", "benchmarks", name, "--device", "cpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = _csv_rows(tmp_path / f"{name}.csv")
    if name == "memory":  # every case ran; outputs counted (3 x 37 fp32: 444 B, a 512-byte block)
        assert len(rows) == 15 and all(int(r["output_bytes"]) > 0 for r in rows), rows
        assert all(int(r["output_alloc_bytes"]) % 512 == 0 for r in rows)
    else:  # every estimator at both dry shapes, its triton gradients within the gate of float64
        assert len(rows) == 10 and all(r["status"] == "ok" for r in rows), rows


# ------------------------------------------------------------------------ the independent gate


def _torch_impl(name, f, params):
    return C.rollbuf_backend("torch")(name, f, params)


def _trunc_as_term(name, f, params):
    """Truncation treated as termination: no bootstrap at a time limit."""
    return _torch_impl(name, dict(f, terminated=f["terminated"] | f["truncated"], truncated=None), params)


def _no_window_end_bootstrap(name, f, params):
    """The window end treated as terminal: the last step bootstraps from 0."""
    return _torch_impl(name, f, dict(params, window_end="terminal"))


def _gamma_098(name, f, params):
    return _torch_impl(name, f, dict(params, gamma=0.98))


def _lambda_ignored(name, f, params):
    return _torch_impl(name, f, dict(params, lam=1.0))


def _mask_ignored(name, f, params):
    """The mask dropped (its steps' garbage replaced by zeros so the error is not a NaN)."""
    m = f["mask"]
    g = {k: (torch.where(m, v, torch.zeros_like(v)) if isinstance(v, torch.Tensor) and v.is_floating_point()
             and v.shape == m.shape else v) for k, v in f.items()}
    return _torch_impl(name, dict(g, mask=None), params)


def _retrace_current_trace(name, f, params):
    """Retrace with the off-by-one trace: c_t where the recursion has c_{t+1}."""
    r, _, q = (f[k].float() for k in ("rewards", "values", "q_values"))
    k, tr = C._flags(f)
    nxt = C._successor(f).float()
    c = params["lam"] * torch.exp(f["target_log_probs"].float() - f["log_probs"].float()).clamp(max=1.0)
    T = r.shape[-1]
    out = torch.empty_like(r)
    Q_next = torch.zeros_like(r[:, 0])
    for t in range(T - 1, -1, -1):
        d = (k[:, t] | tr[:, t]) if t < T - 1 else torch.ones_like(k[:, t])
        trace = torch.where(d, 0.0, c[:, t] * (Q_next - (q[:, t + 1] if t < T - 1 else 0.0)))
        Q_next = r[:, t] + params["gamma"] * (~k[:, t]) * (nxt[:, t] + trace)
        out[:, t] = Q_next
    return (out.to(f["rewards"].dtype),)


def _vtrace_pg_current_vs(name, f, params):
    """V-trace whose policy-gradient advantage bootstraps from vs_t instead of vs_{t+1}."""
    vs, _ = _torch_impl(name, f, params)
    k, tr = C._flags(f)
    d = k | tr
    d[:, -1] = True
    ratio = torch.exp(f["target_log_probs"].float() - f["log_probs"].float()).clamp(max=1.0)
    qv = torch.where(d, C._successor(f).float(), vs.float())
    pg = ratio * (f["rewards"].float() + params["gamma"] * (~k) * qv - f["values"].float())
    return vs, pg.to(vs.dtype)


WRONG = {  # wrong implementation -> (estimator, mix) cases where its error is a semantic one
    "truncation-as-termination": (_trunc_as_term, [(e, "term+trunc") for e in
                                                  ("gae", "lambda_returns", "discounted_returns", "vtrace",
                                                   "retrace")]),
    "no-window-end-bootstrap": (_no_window_end_bootstrap, [(e, "term+trunc") for e in
                                                          ("gae", "lambda_returns", "discounted_returns", "vtrace",
                                                           "retrace")] + [("gae", "term-only")]),
    "gamma-0.98": (_gamma_098, [(e, "term+trunc") for e in
                                ("gae", "lambda_returns", "discounted_returns", "monte_carlo_returns", "vtrace",
                                 "retrace", "eligibility_traces")]),
    "lambda-ignored": (_lambda_ignored, [(e, "term+trunc") for e in
                                         ("gae", "lambda_returns", "retrace", "eligibility_traces")]),
    "mask-ignored": (_mask_ignored, [(e, "mask") for e in ("gae", "vtrace", "episodic_sums")]),
    "retrace-trace-off-by-one": (_retrace_current_trace, [("retrace", "term+trunc")]),
    "vtrace-pg-from-vs_t": (_vtrace_pg_current_vs, [("vtrace", "term+trunc")]),
}


@pytest.mark.parametrize("wrong", list(WRONG))
def test_gate_rejects_wrong_implementations_in_fp32_and_bf16(wrong, monkeypatch):
    """Deliberately wrong implementations are ``wrong`` in fp32 and in bf16 (the bf16 case is also
    run on the same inputs in fp32), on rows long enough that boundaries occur (16 × 200, 1%
    terminations and truncations), while rollbuf's torch backend passes the same cases."""
    fn, where = WRONG[wrong]
    monkeypatch.setitem(C.COMPETITORS, "wrong", fn)
    cases = [Case(e, 16, 200, dtype=d, mix=m) for e, m in where for d in ("float32", "bfloat16")]
    rows = run_cases(cases, ["rollbuf-torch", "wrong"], "cpu", reps=1)
    got = {(r["estimator"], r["mix"], r["dtype"], r["impl"]): r for r in rows}
    for c in cases:
        ours, bad = got[(c.estimator, c.mix, c.dtype, "rollbuf-torch")], got[(c.estimator, c.mix, c.dtype, "wrong")]
        assert ours["status"] == "ok", ours
        assert bad["status"] == "wrong", (wrong, bad)
        assert "call_us" not in bad  # not timed
        if c.dtype == "bfloat16":  # the fp32 rerun on the same inputs is what catches it for certain
            assert bad["err_fp32"] >= 1e-4 and "fp32" in bad["note"], bad


def test_gate_oracle_is_independent_at_every_size(monkeypatch):
    """Every case, however large, is gated by benchmarks.oracles (no rollbuf backend as oracle)."""
    from benchmarks import oracles

    calls = []
    real = oracles.outputs

    def counting(name, fields, **kw):
        calls.append((name, fields["rewards"].numel()))
        return real(name, fields, **kw)

    monkeypatch.setattr(oracles, "outputs", counting)
    rows = run_cases([Case("vtrace", 4, 2**13 + 7), Case("gae", 3, 50)], ["rollbuf-torch"], "cpu", reps=1)
    assert sorted(calls) == [("gae", 150), ("vtrace", 4 * (2**13 + 7))]
    assert all(r["status"] == "ok" and r["err"] < suite.TOLERANCE[torch.float32] for r in rows)
    src = Path(suite.__file__).read_text(encoding="utf-8")
    assert "reference_outputs" not in src and "_ORACLE_TORCH" not in src


def test_bf16_cases_are_also_run_in_fp32_on_the_same_inputs(monkeypatch):
    seen = []

    def spy(name, f, params):
        seen.append((f["rewards"].dtype, f["rewards"].float().clone()))
        return _torch_impl(name, f, params)

    monkeypatch.setitem(C.COMPETITORS, "spy", spy)
    rows = run_cases([Case("gae", 4, 30, dtype="bfloat16")], ["spy"], "cpu", reps=1)
    assert rows[0]["status"] == "ok" and rows[0]["err_fp32"] < 1e-4 <= rows[0]["tol"]
    dtypes = [d for d, _ in seen[:2]]
    assert dtypes == [torch.bfloat16, torch.float32] and torch.equal(seen[0][1], seen[1][1])


def test_ratios_never_divide_two_clocks():
    """A competitor with a full-call time only is compared on the full call; device time with
    device time; the scoreboard names both and never mixes them."""
    base = dict(estimator="gae", n=8, t=64, dtype="float32", mix="term", layout="env", status="ok")
    rows = [dict(base, impl="ours", call_us=50.0, device_us=5.0),
            dict(base, impl="eager", call_us=5000.0, device_us=None),
            dict(base, impl="graphed", call_us=100.0, device_us=20.0)]
    assert suite.speedups(rows, "ours", "eager", "call_us") == [100.0]  # not 5000 / 5 = 1000
    assert suite.speedups(rows, "ours", "eager", "device_us") == []
    assert suite.speedups(rows, "ours", "graphed", "device_us") == [4.0]
    board = {b["impl"]: b for b in scoreboard(rows, "ours")}
    assert board["eager"]["call_geomean_speedup"] == pytest.approx(100.0)
    assert board["eager"]["device_compared"] == 0
    md = cli._markdown(scoreboard(rows, "ours"), rows, "ours", {})
    assert "device time ÷ device time" in md and "full call ÷ full call" in md
    assert "| eager | 1 | 1 | 100% | – | 1, 100%, 100.0× |" in md


def test_parse_cases_and_the_term_only_mix():
    from benchmarks.cases import parse_cases

    cs = parse_cases("gae:4096x128:mask,vtrace:8x8:term+trunc:bfloat16:time,advantages:3x5:term-only")
    assert [c.key for c in cs] == [("gae", 4096, 128, "float32", "mask", "env"),
                                   ("vtrace", 8, 8, "bfloat16", "term+trunc", "time"),
                                   ("advantages", 3, 5, "float32", "term-only", "env")]
    with pytest.raises(ValueError, match="unknown mix"):
        parse_cases("gae:4x4:sometimes")
    f = suite.make_fields(cs[2], "cpu")
    assert f["truncated"] is None and f["bootstrap_values"].shape == (3,)
    assert torch.isfinite(f["bootstrap_values"]).all()


# ----------------------------------------------------------------------------------------- peers

_FAKE_RL_TRITON = '''
"""A stand-in for rl-triton 0.1.3 (its API and its documented conventions, in plain torch) for
testing the benchmarks' adapters without a GPU: float flags, terminated/truncated exclusive,
bootstrap_values zero except where read (added to the next value), last_value = the window end."""
import torch

CALLS = []


def _next(x, trunc, bv, last):
    nxt = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], 1)
    if trunc is not None:
        nxt = nxt * (1 - trunc)
    nxt[:, -1] = 0.0
    if bv is not None:
        nxt = nxt + bv
    elif last is not None:
        nxt[:, -1] = last
    return nxt


def _scan(u, v, carry=None):
    out = torch.empty_like(u)
    a = torch.zeros_like(u[:, 0]) if carry is None else carry
    for t in range(u.shape[1] - 1, -1, -1):
        a = u[:, t] + v[:, t] * a
        out[:, t] = a
    return out


def compute_gae(rewards, values, terminateds, truncateds=None, gamma=0.99, lambda_=0.95,
                bootstrap_values=None, last_value=None):
    CALLS.append("gae")
    done = terminateds if truncateds is None else (terminateds + truncateds).clamp(max=1)
    delta = rewards + gamma * (1 - terminateds) * _next(values, truncateds, bootstrap_values, last_value) - values
    return _scan(delta, gamma * lambda_ * (1 - done))


def compute_vtrace(log_pi_target, log_pi_behavior, values, rewards, terminateds, truncateds=None, gamma=0.99,
                   rho_bar=1.0, c_bar=1.0, bootstrap_values=None, last_value=None):
    CALLS.append("vtrace")
    done = terminateds if truncateds is None else (terminateds + truncateds).clamp(max=1)
    ratio = torch.exp(log_pi_target - log_pi_behavior)
    rho, c = ratio.clamp(max=rho_bar), ratio.clamp(max=c_bar)
    nv = _next(values, truncateds, bootstrap_values, last_value)
    vs = _scan(rho * (rewards + gamma * nv * (1 - terminateds) - values), gamma * c * (1 - done)) + values
    nvs = _next(vs, truncateds, bootstrap_values, last_value)
    return vs, rho * (rewards + gamma * nvs * (1 - terminateds) - values)


def compute_lambda_returns(rewards, next_values, terminateds, truncateds=None, gamma=0.99, lambda_=0.95,
                           bootstrap_values=None):
    tr = torch.zeros_like(rewards) if truncateds is None else truncateds
    bv = torch.zeros_like(rewards) if bootstrap_values is None else bootstrap_values
    nd = 1 - (terminateds + tr).clamp(max=1)
    return _scan(rewards + gamma * (1 - lambda_) * nd * next_values + gamma * tr * bv, gamma * lambda_ * nd,
                 bv[:, -1])


def compute_discounted_returns(rewards, terminateds, truncateds=None, gamma=0.99, bootstrap_values=None):
    tr = torch.zeros_like(rewards) if truncateds is None else truncateds
    bv = torch.zeros_like(rewards) if bootstrap_values is None else bootstrap_values
    done = (terminateds + tr).clamp(max=1)
    return _scan(rewards + gamma * tr * bv, gamma * (1 - done), bv[:, -1])


def compute_retrace(action_probs_target, action_probs_behavior, q_values, next_q_values_all, actions, rewards,
                    terminateds, truncateds, gamma, lambda_=1.0, c_bar=1.0, rho_bar=1.0):
    done = (terminateds + truncateds).clamp(max=1)
    e_next = (action_probs_target * next_q_values_all).sum(-1)
    pi = action_probs_target.gather(-1, actions[..., None])[..., 0]
    c = lambda_ * (pi / action_probs_behavior).clamp(max=c_bar)
    c_next = torch.cat([c[:, 1:], torch.zeros_like(c[:, :1])], 1)
    q_ret = _scan(rewards + gamma * e_next * (1 - terminateds) - q_values, gamma * c_next * (1 - done)) + q_values
    return q_ret, torch.zeros_like(q_ret)


def _forward(x, dones, decay):
    out = torch.empty_like(x)
    e = torch.zeros_like(x[:, 0])
    prev = torch.zeros_like(e)
    for t in range(x.shape[1]):
        e = x[:, t] + decay * (1 - prev) * e
        out[:, t] = e
        prev = dones[:, t]
    return out


def compute_eligibility_traces(gradients, dones, gamma, lambda_, seed_values=None):
    return _forward(gradients, dones, gamma * lambda_)


def compute_episodic_prefix_sum(inputs, dones, seed_values=None, boundary="ends_at"):
    return _forward(inputs, dones, 1.0)
'''

_FAKE_PUFFERLIB_BUILD = '''
import torch


def load_puff_advantage():
    """A stand-in for PufferLib 3.0's CPU/CUDA op: same signature, same in-place write, its
    dones[t+1] convention, the last step left unwritten."""
    def op(values, rewards, dones, importance, advantages, gamma, lam, rho_clip, c_clip):
        last = torch.zeros_like(values[:, 0])
        for t in range(values.shape[1] - 2, -1, -1):
            nn = 1.0 - dones[:, t + 1]
            rho, c = importance[:, t].clamp(max=rho_clip), importance[:, t].clamp(max=c_clip)
            delta = rho * (rewards[:, t + 1] + gamma * values[:, t + 1] * nn - values[:, t])
            last = delta + gamma * lam * c * last * nn
            advantages[:, t] = last

    return op, "stand-in"
'''


@pytest.fixture
def fake_peers(tmp_path, monkeypatch):
    """A peers source folder with stand-ins of rl-triton and PufferLib's build, fetched by the CLI
    into a fresh peers folder (what ``--fetch-peers`` does with the real ones)."""
    import sys

    src = tmp_path / "src"
    pkg = src / "rl-triton-0.1.3" / "src" / "rl_triton"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(_FAKE_RL_TRITON)
    (src / "pufferlib-3.0-advantage").mkdir()
    (src / "pufferlib-3.0-advantage" / "build.py").write_text(_FAKE_PUFFERLIB_BUILD)
    monkeypatch.setenv("ROLLBUF_PEERS", str(tmp_path / ".peers"))
    monkeypatch.setattr(C, "_PEERS", {})
    for m in [m for m in sys.modules if m == "rl_triton" or m.startswith("rl_triton.")]:
        monkeypatch.delitem(sys.modules, m)
    assert runner(["fetch-peers", str(src)]) == 0
    assert sorted(p.name for p in (tmp_path / ".peers").iterdir()) == ["pufferlib-3.0-advantage", "rl-triton-0.1.3"]
    yield tmp_path
    for m in [m for m in sys.modules if m == "rl_triton" or m.startswith("rl_triton.")]:
        del sys.modules[m]


def test_peers_adapters_through_the_gate(fake_peers):
    """rl-triton's adapters pass the gate on every estimator both have (the stand-in follows
    rl-triton's documented conventions), PufferLib is timed and marked unchecked, and the
    scoreboard has a case-by-case table naming both clocks."""
    out = fake_peers / "out"
    cases = ",".join(f"{e}:6x40:{m}" for e in ("advantages", "vtrace", "lambda_returns", "discounted_returns",
                                                "monte_carlo_returns", "retrace", "eligibility_traces",
                                                "episodic_sums") for m in ("term-only", "term+trunc"))
    assert cli.main(["--cases", cases, "--competitors", "rollbuf-torch,rl-triton,pufferlib", "--out", str(out)]) == 0
    rows = _csv_rows(out / "results.csv")
    rt = {(r["estimator"], r["mix"]): r for r in rows if r["impl"] == "rl-triton"}
    assert len(rt) == 16 and all(r["status"] == "ok" and float(r["err"]) < 1e-4 for r in rt.values()), rt
    pl = {(r["estimator"], r["mix"]): r["status"] for r in rows if r["impl"] == "pufferlib"}
    assert pl.pop(("advantages", "term-only")) == "unchecked" and set(pl.values()) == {"unsupported"}
    assert all(float(r["call_us"]) > 0 for r in rows if r["status"] in ("ok", "unchecked"))
    md = (out / "scoreboard.md").read_text()
    assert "### rollbuf-torch and rl-triton 0.1.3 (`rl-triton`), case by case" in md
    assert "speedup (device ÷ device)" in md and "speedup (full call ÷ full call)" in md
    assert "PufferLib 3.0 is timed only" in md
    assert "| advantages | term-only | 6 × 40 |" in md


def test_peers_absent_are_reported_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLBUF_PEERS", str(tmp_path / "nothing"))
    monkeypatch.setattr(C, "_PEERS", {})
    import sys

    monkeypatch.setitem(sys.modules, "rl_triton", None)  # an installed rl_triton is not importable here
    rows = run_cases([Case("advantages", 4, 16, mix="term-only")], ["rollbuf-torch", "rl-triton", "pufferlib"],
                     "cpu", reps=1)
    status = {r["impl"]: (r["status"], r.get("note", "")) for r in rows}
    assert status["rollbuf-torch"][0] == "ok"
    for peer in ("rl-triton", "pufferlib"):
        assert status[peer][0] == "unsupported" and "fetch-peers" in status[peer][1], status


def test_the_peers_grid():
    """rl-triton's 40-shape grid (8192 × 128 is in both of its halves: 39 distinct shapes) plus
    256 × 131072, 1 × 2^20 and 16384 × 4096; every estimator both
    have with terminations and [N] window-end values, GAE advantages and V-trace with truncations too;
    the peers are the grid's default competitors."""
    from benchmarks import cases

    shapes = {(c.n, c.t) for c in GRIDS["peers"]}
    assert len(shapes) == 42 and {(256, 131072), (1, 2**20), (16384, 4096)} <= shapes
    assert {(n, t) for n, t in shapes if t >= 128 and n <= 8192 and (n, t) != (256, 131072)} >= {
        (n, t) for t in (128, 512, 1024, 2048, 4096) for n in (128, 512, 2048, 8192)}
    assert {c.estimator for c in GRIDS["peers"]} == set(cases.PEER_ESTIMATORS)
    assert {c.mix for c in GRIDS["peers"] if c.estimator not in ("advantages", "vtrace")} == {"term-only"}
    assert all(c.dtype == "float32" and c.layout == "env" for c in GRIDS["peers"])
    assert cases.GRID_COMPETITORS["peers"] == ("rollbuf-triton", "rl-triton", "pufferlib")


def test_help_lists_commands_grids_and_competitors(capsys):
    from benchmarks.__main__ import COMMANDS

    assert runner(["--help"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in COMMANDS) and "python -m benchmarks" in text
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert all(name in text for name in list(GRIDS) + list(C.COMPETITORS))
    assert "fetch-peers" in text and "--cases" in text and "--grid" in text
    with pytest.raises(SystemExit, match="unknown command"):
        runner(["why"])


def test_llm_command_on_the_cpu(tmp_path):
    """``python -m benchmarks llm --device cpu`` on one tiny size: rollbuf's padded and packed
    calls equal verl's token loop."""
    assert runner(["llm", "--device", "cpu", "--sizes", "2x48", "--out", str(tmp_path)]) == 0
    rows = _csv_rows(tmp_path / "llm_cpu.csv")
    assert len(rows) == 1 and float(rows[0]["max_abs_err"]) < 1e-5


@pytest.mark.parametrize("mix", ["term-only", "term+trunc", "mask"])
def test_device_drawn_inputs_pass_the_gate(mix):
    """The inputs drawn on the device for large GPU cases (here drawn on the CPU): window-end values
    finite, ``[N]`` for term-only, and rollbuf passes the oracle on them for every estimator."""
    from benchmarks import oracles

    for est in ("gae", "vtrace", "retrace", "episodic_sums"):
        case = Case(est, 5, 300, mix=mix)
        f = suite._device_fields(case, "cpu", seed=3)
        bv = f["bootstrap_values"]
        if mix == "term-only":
            assert f["truncated"] is None and bv.shape == (5,) and torch.isfinite(bv).all()
        else:
            assert bv.shape == (5, 300) and bv.isnan().any()
        out = C.rollbuf_backend("torch")(est, f, suite.PARAMS[est])
        assert suite.gate_error(out, oracles.outputs(est, f, **suite.PARAMS[est])) < 1e-5


@pytest.mark.parametrize("host,device", [(10e-6, 3e-6), (3e-6, 10e-6), (20e-6, 20e-6)])
def test_the_full_call_clock_is_the_longer_of_host_and_device(host, device):
    """The scoreboard's full call (``suite.wall_time``): calls back to back with one sync per batch
    cost the host's time per call or the device's, whichever is longer. Simulated: each call spends
    ``host`` on the clock and queues ``device`` of work; a sync waits for the queue."""
    state = {"t": 0.0, "free": 0.0, "calls": 0}

    def clock():
        return state["t"]

    def call():
        state["t"] += host
        state["free"] = max(state["free"], state["t"]) + device
        state["calls"] += 1

    def sync():
        state["t"] = max(state["t"], state["free"])

    got = suite.wall_time([call, call, call], sync, budget_s=0.01, clock=clock)
    assert got == pytest.approx(max(host, device), rel=0.02)
    assert state["calls"] >= 5 * 3


def test_the_full_call_clocks_of_a_case_are_interleaved():
    """``suite.wall_times``: the competitors' batches alternate (batch b of each before batch b + 1 of
    any), so a host that slows down half-way slows both alike: two identical competitors come out
    equal, where timing one after the other would make the second twice as slow."""
    state = {"t": 0.0}
    order = []

    def make(name):
        def call():
            state["t"] += 1e-6 if state["t"] < 0.05 else 2e-6  # the host slows down after 50 ms
            if not order or order[-1] != name:
                order.append(name)
        return call

    got = suite.wall_times({"a": [make("a")], "b": [make("b")]}, lambda: None, budget_s=0.02, batches=5,
                           clock=lambda: state["t"])
    assert got["a"] == pytest.approx(got["b"], rel=0.05)
    assert order[2:] == ["a", "b"] * 5  # after each one's estimate, the batches alternate
    state["t"] = 0.0
    one = suite.wall_time([make("a")], lambda: None, budget_s=0.04, batches=5, clock=lambda: state["t"])
    two = suite.wall_time([make("b")], lambda: None, budget_s=0.04, batches=5, clock=lambda: state["t"])
    assert two > 1.5 * one  # what one after the other would report


def test_a_cuda_case_times_every_competitors_full_call_together(monkeypatch):
    """``run_cases`` on the GPU path (the device simulated on the CPU: fields made on the CPU, a
    no-op sync, a stand-in graph replay): every competitor that passed the gate gets its device
    time and a full call from one interleaved ``wall_times``; no bound call is left in the rows."""
    real_make = suite.make_fields
    monkeypatch.setattr(suite, "make_fields", lambda case, device, seed=0: real_make(case, "cpu", seed))
    monkeypatch.setattr(suite, "provenance", lambda device: {"device": "simulated"})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(suite, "graph_time", lambda fns, reps=10: (1e-6, 0.0))
    seen = []
    real_walls = suite.wall_times

    def walls(timed, sync, *a, **kw):
        seen.append(sorted(timed))
        return real_walls(timed, sync, *a, **kw)

    monkeypatch.setattr(suite, "wall_times", walls)

    def broken(name, f, params):  # forgets truncations: bootstraps nothing, cuts nothing
        return C.rollbuf_backend("torch")(name, dict(f, truncated=None), params)

    monkeypatch.setitem(C.COMPETITORS, "broken", broken)
    rows = run_cases([Case("gae", 4, 200, mix="term+trunc")], ["rollbuf-torch", "loop", "broken"], "cuda")
    by = {r["impl"]: r for r in rows}
    assert by["broken"]["status"] == "wrong" and "call_us" not in by["broken"]
    for name in ("rollbuf-torch", "loop"):
        assert by[name]["status"] == "ok" and by[name]["call_us"] > 0
        assert "_calls" not in by[name]
    assert by["rollbuf-torch"]["device_us"] == pytest.approx(1.0)
    # one interleaved clock for the case's two timed competitors (besides the quick single-competitor
    # estimate that sizes a graph's replays)
    assert [k for k in seen if k != [None]] == [[0, 1]]


def test_the_full_call_clock_times_a_slow_call_a_few_times():
    """A call slower than the clock's budget (an eager loop over time) is timed once per batch, the
    input sets still rotated: a handful of calls, not the batches times the input sets."""
    state = {"t": 0.0}
    used = []

    def make(i):
        def call():
            state["t"] += 1.0  # one second per call
            used.append(i)
        return call

    got = suite.wall_time([make(i) for i in range(8)], lambda: None, budget_s=0.025, clock=lambda: state["t"])
    assert got == pytest.approx(1.0)
    assert len(used) == 8 + 5 and set(used) == set(range(8))


def test_llm_agents_benchmark_dry_run(tmp_path, capsys):
    """benchmarks/llm_agents.py runs on a GPU; its CPU dry run checks every case's outputs against the
    loop it replaces (exit 1 if any differs), writes the CSV and prints the table."""
    from benchmarks import llm_agents

    assert llm_agents.main(["--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(case in out for case in ("otb", "tir_otb", "gigpo", "turn_returns", "turn_gae"))
    assert (tmp_path / "llm_agents.csv").read_text().count("\n") == 6


def test_frameworks_benchmark_dry_run(tmp_path, capsys):
    """benchmarks/frameworks.py runs on a GPU; its CPU dry run checks OpenRLHF's, AReaL's, SkyRL's, slime's and
    TRL's code against rollbuf's calls (exit 1 if any differs), writes the CSV and prints the table."""
    from benchmarks import frameworks

    assert frameworks.main(["--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    cases = ("openrlhf_gae", "openrlhf_returns", "areal_gae", "skyrl_gae", "slime_ppo", "slime_reinforce++",
             "trl_grpo")
    assert all(case in out for case in cases)
    assert (tmp_path / "frameworks.csv").read_text().count("\n") == 1 + len(cases)


def test_frameworks_benchmark_restates_trl():
    """The benchmark's TRL lines are TRL 1.16.0's (``nanstd`` statement for statement), and rollbuf's drop-in
    gives their advantages on random groups with an unscored row."""
    trl = pytest.importorskip("trl", reason="tests/requirements-verl.txt installs TRL 1.16.0")
    import ast
    import inspect
    import textwrap

    from trl.trainer.utils import nanstd

    from benchmarks import frameworks

    def tree(fn):
        return ast.dump(ast.parse(textwrap.dedent(inspect.getsource(fn))))

    assert trl.__version__ == "1.16.0" and tree(frameworks.nanstd) == tree(nanstd)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 2, generator=g)
    x[3] = float("nan")
    w = torch.tensor([1.0, 0.5])
    want = torch.nan_to_num(frameworks.trl_grpo(x, w, 8), nan=0.0)
    torch.testing.assert_close(frameworks.rb_trl.grpo_advantages(x, 8, w), want, rtol=1e-5, atol=1e-5)


def test_wall_benchmark_dry_run(tmp_path, capsys):
    """benchmarks/wall.py runs on a GPU; its CPU dry run (Triton's interpreter, tiny shapes) checks the
    plumbing: the survey's rows and the sweep's forced choices, each compared with the default's outputs."""
    import csv

    from benchmarks import wall

    assert wall.main(["--dry-run", "--sweep", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "wall.csv").read_text().splitlines()))
    forced = [r for r in rows if r["force"]]
    assert len(rows) == 8 and len(forced) == 4
    assert all(float(r["diff"]) <= 1e-4 for r in forced) and all(r["plan"].startswith("bn") for r in rows)
    assert {r["commit"] for r in rows} and "plan" in capsys.readouterr().out


def test_wall_window_dry_run(tmp_path):
    """``--window``: the survey's cases where rows are split (the dry run: GAE over one row), each under
    the look-back's windows, the plan naming the window's words and the outputs as the default's; the
    survey itself not run."""
    import csv

    from benchmarks import wall

    assert wall.main(["--dry-run", "--window", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "wall.csv").read_text().splitlines()))
    assert [(r["estimator"], r["n"]) for r in rows] == [("gae", "1")] * 3
    assert [r["plan"].split()[-1] for r in rows[1:]] == ["poll32", "poll32"], [r["plan"] for r in rows]
    assert all(float(r["diff"]) <= 1e-4 for r in rows[1:])
    assert [dict(f)["presolve"] for f in wall.windows(1)].count(True) == 2  # the table's chunks and 1024 x 4
    assert not any(f["presolve"] for f in wall.windows(64))


def test_wall_one_row_dry_run(tmp_path):
    """``--one-row``: one row of each length (the dry run: GAE over one row of 67 steps), the default beside
    the three passes and the family's one-row program forced, the outputs as the default's; the survey
    itself not run; the forced program is the family's ``split_row``."""
    import csv

    from benchmarks import wall
    from rollbuf.kernels.families import FAMILIES
    from rollbuf.problem import Family

    assert wall.main(["--dry-run", "--one-row", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "wall.csv").read_text().splitlines()))
    assert [(r["estimator"], r["n"], r["t"]) for r in rows] == [("gae", "1", "67")] * 3
    assert [bool(r["force"]) for r in rows] == [False, True, True]
    assert all(float(r["diff"]) <= 1e-4 for r in rows[1:])
    own = FAMILIES[Family.RETRACE].split_row
    assert wall.family_row("retrace") == dict(split=True, block_t=own.chunk, num_warps=own.warps, presolve=False,
                                              poll=own.window, max_chunk=2048)
    assert wall.family_row("gae")["poll"] == FAMILIES[Family.TD_LAMBDA].split_row.window


def test_frameworks_benchmark_restates_openrlhf_verbatim():
    """The benchmark's OpenRLHF loops are the statements of the methods tests/test_openrlhf.py copies from
    OpenRLHF 0.11.2 verbatim (the syntax trees of their bodies, docstrings aside, are equal)."""
    import ast
    import inspect
    import textwrap

    import test_openrlhf
    from benchmarks import frameworks

    def body(fn):
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
        stmts = [s for s in tree.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        return [ast.dump(s) for s in stmts]

    maker = test_openrlhf.RemoteExperienceMaker
    assert body(frameworks.openrlhf_gae) == body(maker.get_advantages_and_returns)
    assert body(frameworks.openrlhf_returns) == body(maker.get_cumulative_returns)


def test_host_path_benchmark_dry_run(tmp_path):
    """benchmarks/host_path.py runs on a GPU; its CPU dry run (torch backend, tiny shapes, no graphs)
    checks its plumbing: every part's rows in the CSV with the provenance, and the table last."""
    import importlib.util
    import io
    from contextlib import redirect_stdout
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "host_path.py"
    spec = importlib.util.spec_from_file_location("host_path", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = io.StringIO()
    with redirect_stdout(out):
        assert mod.main(["--dry-run", "--out", str(tmp_path), "--calls", "3"]) == 0
    rows = list(csv.DictReader((tmp_path / "host_path.csv").read_text().splitlines()))
    eager = [r for r in rows if r["part"] == "eager"]
    assert {r["call"] for r in eager} == {"functional.advantages", "functional.gae", "Rollout.advantages"}
    assert {(r["n"], r["t"]) for r in eager} == {(str(n), str(t)) for n, t in mod.DRY_SHAPES}
    assert all(float(r["wall_us"]) > 0 and float(r["host_us"]) > 0 for r in eager)
    graph = [r for r in rows if r["part"] == "graph"]
    assert sum(r["call"].startswith("device time of ") for r in graph) == 9
    assert any(r["call"].startswith("graph of 9 calls: replay") for r in graph)
    assert {r["call"] for r in rows if r["part"] == "replay"} == {
        "eager functional.advantages", "graph of one functional.advantages", "graph of one 1-element torch kernel"}
    assert all(r["device"] and r["torch"] and r["commit"] and r["sources"] for r in rows)
    text = out.getvalue()
    assert text.rstrip().splitlines()[-1].startswith("  graph of one 1-element torch kernel")
    assert "| N × T | functional.advantages | functional.gae | Rollout.advantages |" in text


def test_help_shows_every_default_and_the_grid_and_out_options(capsys):
    """``python -m benchmarks scoreboard --help``: each option's default after its help (no "(default:
    None)"), and help for ``--grid`` and ``--out``."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "(default: cpu-smoke)" in text and "(default: bench-out)" in text
    assert "the grid of cases to run" in text and "directory for results.csv, scoreboard.md and the plots" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_default_run_scores_what_auto_runs_with_a_readable_header(tmp_path):
    """With the default competitors, the scoreboard divides by the backend ``auto`` runs on this
    machine (numba on a CPU, Triton on a GPU), which is among the rows; its header names the
    provenance in words, not as a Python dict. ``--from-csv`` picks the same row again."""
    from rollbuf import backends

    gpu = torch.cuda.is_available()
    auto = {"numba": "rollbuf-numba", "triton": "rollbuf-triton", "torch": "rollbuf-torch"}[
        backends.resolve("auto", torch.device("cuda" if gpu else "cpu"))]
    out = tmp_path / "run"
    assert cli.main(["--cases", "gae:4x50:term+trunc", "--out", str(out)]) == 0
    rows = _csv_rows(out / "results.csv")
    impls = {r["impl"]: r["status"] for r in rows}
    assert impls[auto] == "ok" and "rollbuf-torch" in impls
    board = (out / "scoreboard.md").read_text()
    first = board.splitlines()[0]
    assert f"the time of `{auto}`" in first
    assert "{" not in first and f"torch {torch.__version__}" in first and f"commit {rows[0]['commit']}" in first
    again = tmp_path / "again"
    assert cli.main(["--from-csv", str(out / "results.csv"), "--out", str(again)]) == 0
    assert f"the time of `{auto}`" in (again / "scoreboard.md").read_text().splitlines()[0]


def test_every_command_shows_its_defaults(capsys):
    """``python -m benchmarks COMMAND --help`` shows each option's default."""
    for command, default in (("cpu", "(default: 20.0)"), ("host", "(default: 3)"), ("backward", "(default: cuda)"),
                             ("memory", "(default: cuda)"), ("llm", "(default: 60.0)"),
                             ("distributed", "(default: 65536)")):
        with pytest.raises(SystemExit) as e:
            runner([command, "--help"])
        assert e.value.code == 0
        assert default in " ".join(capsys.readouterr().out.split()), command


# ------------------------------------------------------------------------------ the naive kernel


def test_the_naive_kernel_passes_the_gate_and_refuses_what_it_does_not_compute():
    """``naive-triton`` (the baseline of the ``naive`` grid; here under Triton's interpreter): GAE's
    two outputs and advantages alone pass the float64 gate with terminations and ``[N]`` window-end
    values; truncations, other estimators and rows longer than one block are ``unsupported``."""
    cs = [Case("gae", 5, 40, mix="term-only"), Case("advantages", 3, 17, mix="term-only"),
          Case("gae", 4, 16, mix="term+trunc"), Case("vtrace", 4, 16, mix="term-only"),
          Case("advantages", 1, C.NAIVE_MAX_T + 1, mix="term-only")]
    rows = run_cases(cs, ["naive-triton"], TRITON_DEVICE, reps=1)
    status = {(r["estimator"], r["t"], r["mix"]): r["status"] for r in rows}
    assert status == {("gae", 40, "term-only"): "ok", ("advantages", 17, "term-only"): "ok",
                      ("gae", 16, "term+trunc"): "unsupported", ("vtrace", 16, "term-only"): "unsupported",
                      ("advantages", C.NAIVE_MAX_T + 1, "term-only"): "unsupported"}
    assert all(r["err"] < 1e-5 for r in rows if r["status"] == "ok")
    assert all(bn > 0 and w > 0 for bn, w in C.naive_configs(40))


# --------------------------------------------------------------------------- the CPU table, host


def test_the_cpu_table_gates_every_row_against_the_oracle(monkeypatch):
    """The CPU table's gate is the scoreboard's (``benchmarks.oracles``, every row): an implementation
    that drops the window-end bootstrap is ``wrong`` and not timed; rollbuf's numba backend passes."""
    from benchmarks import cpu

    def no_window_end_bootstrap(d):
        return C.CPU_GAE["plain-numba"](dict(d, bootstrap_values=torch.zeros_like(d["bootstrap_values"])))

    monkeypatch.setitem(C.CPU_GAE, "wrong", no_window_end_bootstrap)
    rows = cpu.run_grid([(3, 40)], ["rollbuf-numba", "wrong"], budget_s=0.01, max_call_s=20, log=lambda *a: None)
    by = {r["impl"]: r for r in rows}
    assert by["rollbuf-numba"]["status"] == "ok" and float(by["rollbuf-numba"]["err"]) < 1e-5
    assert float(by["rollbuf-numba"]["call_us"]) > 0
    assert by["wrong"]["status"] == "wrong" and "call_us" not in by["wrong"]


def test_the_host_time_calls_pass_the_gate():
    """``python -m benchmarks host`` times these calls on a GPU after gating each (here on the CPU,
    the naive kernel under Triton's interpreter): each gives the oracle's outputs."""
    from benchmarks import host_time, oracles
    from benchmarks.cases import PARAMS

    f = suite.make_fields(Case("gae", 6, 40, mix="term-only"), TRITON_DEVICE)
    calls = host_time.calls(f)
    assert {"F.gae", "F.advantages", "Rollout.gae (adv+ret)", "Rollout.advantages (adv)",
            "naive kernel (adv), Triton's launcher"} <= set(calls)
    for name, (est, fn) in calls.items():
        if name.startswith("rl-triton") and not torch.cuda.is_available():
            continue  # rl-triton (when the peers were fetched into .peers/) takes CUDA tensors only
        out = fn()
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        assert suite.gate_error(out, oracles.outputs(est, f, **PARAMS[est])) < 1e-5, name


# ------------------------------------------------------------------------------------- the tables


def test_tables_check_finds_a_stale_page_and_rewrites_it(tmp_path, capsys):
    """``python -m benchmarks tables --check`` accepts docs/benchmarks.md as committed, refuses a
    page whose table differs from the results or lacks one, and ``tables`` rewrites it."""
    from benchmarks import tables

    text = tables.DOC.read_text(encoding="utf-8")
    assert runner(["tables", "--check"]) == 0
    stale = tmp_path / "benchmarks.md"
    stale.write_text(text.replace("<!-- /table:peers -->", "| a row no result has |\n<!-- /table:peers -->"))
    assert runner(["tables", "--check", "--doc", str(stale)]) == 1
    assert runner(["tables", "--doc", str(stale)]) == 0 and stale.read_text() == text
    a, b = text.index("<!-- table:memory -->"), text.index("<!-- /table:memory -->") + len("<!-- /table:memory -->")
    stale.write_text(text[:a] + text[b:])
    assert runner(["tables", "--check", "--doc", str(stale)]) == 1
    assert "memory" in capsys.readouterr().err


@pytest.mark.skipif(not backends.triton_available(), reason="needs triton (its interpreter on the CPU)")
def test_host_path_floor_call_computes_the_advantages():
    """The host-path benchmark's floor call (the floor of this design: checks, a cached launch, the
    launch) runs the package's cached launch on its own arguments: it must compute what the call
    computes, and refuse a bad γ."""
    from benchmarks.host_path import floor_call
    from rollbuf import functional as F

    g = torch.Generator().manual_seed(3)
    N, T = 37, 13
    kw = dict(rewards=torch.randn(N, T, generator=g), values=torch.randn(N, T, generator=g),
              terminated=torch.rand(N, T, generator=g) < 0.1, bootstrap_values=torch.randn(N, generator=g))
    kw = {k: v.to(TRITON_DEVICE) for k, v in kw.items()} | {"backend": "triton"}
    want = F.advantages(0.99, 0.95, **dict(kw, backend="reference"))
    call = floor_call(kw)
    torch.testing.assert_close(call(), want.float(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="gamma"):
        call(gamma=1.5)
