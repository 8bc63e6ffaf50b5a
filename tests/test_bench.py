"""The benchmark suite's CPU smoke run (what CI runs), its correctness gate and its regression check."""

from __future__ import annotations

import csv

import pytest
import torch

from rollbuf.bench import GRIDS, Case, compare, run_cases, scoreboard
from rollbuf.bench import __main__ as cli
from rollbuf.bench import competitors as C


def test_cpu_smoke_run_writes_scoreboard_and_csv(tmp_path):
    rc = cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch,loop", "--out", str(tmp_path)])
    assert rc == 0
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 2 * len(GRIDS["cpu-smoke"])
    ours = [r for r in rows if r["impl"] == "rollbuf-torch"]
    assert all(r["status"] == "ok" and float(r["rel_err"]) < 1e-4 for r in ours)
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
    assert "call_us" not in [r for r in rows if r["impl"] == "broken"][0]
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


def test_end_to_end_ppo_benchmark_runs(tmp_path):
    """benchmarks/e2e_ppo.py (a PPO update with the loop's GAE and rollbuf's) on a tiny buffer."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "e2e.csv"
    res = subprocess.run([sys.executable, str(root / "benchmarks" / "e2e_ppo.py"), "--envs", "16", "--steps", "9",
                          "--hidden", "8", "--reps", "1", "--out", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 1 and 0 < float(rows[0]["loop_adv_share"]) < 1


def test_parts_cover_the_grid_once_with_whole_shapes():
    cases = GRIDS["gpu"]
    from rollbuf.bench import suite

    parts = [suite.part(cases, i, 3) for i in range(3)]
    assert sorted(c.key for p in parts for c in p) == sorted(c.key for c in cases)
    shapes = [{(c.n, c.t) for c in p} for p in parts]
    assert not (shapes[0] & shapes[1]) and not (shapes[1] & shapes[2]) and not (shapes[0] & shapes[2])
    cost = [sum(suite.shape_cost(c.n, c.t) for c in p) for p in parts]
    assert max(cost) < 1.5 * min(cost)  # dealt out by cost


def test_budget_skips_and_scoreboard_from_csv_parts(tmp_path):
    """A spent budget reports the remaining cases as skipped (not failed); the parts of a run merge
    into one scoreboard with --from-csv."""
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    assert cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch", "--part", "0/2", "--out", str(a)]) == 0
    assert cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch", "--part", "1/2", "--budget-s", "0",
                     "--out", str(b)]) == 0
    rows_b = list(csv.DictReader(open(b / "results.csv")))
    assert rows_b and {r["status"] for r in rows_b} == {"skipped"}
    assert cli.main(["--from-csv", str(a / "results.csv"), str(b / "results.csv"), "--out", str(merged)]) == 0
    board = (merged / "scoreboard.md").read_text()
    n_a = len(list(csv.DictReader(open(a / "results.csv"))))
    assert f"| rollbuf-torch | {n_a} | {n_a} | 100% |" in board  # skipped cases are not counted as attempted


def test_time_major_cases_are_views_and_pass_the_gate():
    """``layout="time"``: the fields are [T, N] buffers passed as [N, T] views (time stride N), and
    both the competitors and rollbuf read them in place and pass the float64 gate."""
    from rollbuf.bench import suite

    case = Case("gae", 16, 64, layout="time")
    f = suite.make_fields(case, "cpu")
    assert f["rewards"].shape == (16, 64) and f["rewards"].stride() == (1, 16)
    rows = run_cases([case, Case("gae", 16, 64)], ["rollbuf-torch", "loop"], "cpu", reps=1)
    assert {(r["layout"], r["impl"]): r["status"] for r in rows} == {
        ("time", "rollbuf-torch"): "ok", ("time", "loop"): "ok", ("env", "rollbuf-torch"): "ok", ("env", "loop"): "ok"}


def test_rows_from_csvs_before_the_layout_column_are_env_major():
    from rollbuf.bench import suite

    old = dict(estimator="gae", n="8", t="64", dtype="float32", mix="none", impl="x")
    assert suite.row_key(old) == ("gae", 8, 64, "float32", "none", "env")
    assert suite.row_key(dict(old, layout="time"))[-1] == "time"


def test_window_end_bootstrap_is_finite_in_small_cases():
    """Loops that compute γ·(1 − done)·V' must not be failed by a NaN no trainer passes: the
    window-end bootstrap value is finite even where the last step terminated (found on the H200:
    10 GAE cases at 128 × 128 failed the gate before), while the slots that are never read stay NaN."""
    from rollbuf.bench import suite

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
    first, again, merged = tmp_path / "a", tmp_path / "b", tmp_path / "m"
    assert cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch", "--out", str(first)]) == 0
    rows = list(csv.DictReader(open(first / "results.csv")))
    rows[0]["status"] = "wrong"  # as if one case had failed
    with open(first / "results.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert cli.main(["--grid", "cpu-smoke", "--competitors", "rollbuf-torch", "--redo", str(first / "results.csv"),
                     "--out", str(again)]) == 0
    redo = list(csv.DictReader(open(again / "results.csv")))
    assert [(r["estimator"], r["n"], r["t"], r["mix"]) for r in redo] == [
        (rows[0]["estimator"], rows[0]["n"], rows[0]["t"], rows[0]["mix"])]
    assert redo[0]["status"] == "ok"
    merged_rows = cli._read_csv([str(first / "results.csv"), str(again / "results.csv")])
    assert len(merged_rows) == len(rows) and all(r["status"] == "ok" for r in merged_rows)


@pytest.mark.parametrize("script,argv", [
    ("launch_overhead.py", ["--device", "cpu"]),
    ("time_major.py", ["--device", "cpu", "--estimators", "gae", "--sweep", "none"]),
    ("ab.py", ["--device", "cpu", "--variants", "new=,general=ROLLBUF_K_SPLIT=True",
               "--cases", "gae:4096x128:mask,vtrace:8x8:term+trunc:bfloat16:time"]),
    ("memory.py", ["--device", "cpu"]),
])
def test_gpu_session_scripts_dry_run(script, argv, tmp_path):
    """The scripts `benchmarks/gpu_session.sh` runs on the lent GPU, in their CPU dry-run mode under
    the interpreter: their logic (argument recording, every variant's float64 gate) must not fail
    where device time is scarce."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, str(root / "benchmarks" / script), *argv, "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    if script == "time_major.py":
        assert "0 wrong variant(s)" in res.stdout
    if script == "ab.py":
        import csv

        rows = list(csv.DictReader(open(tmp_path / "ab.csv")))
        assert len(rows) == 4 and all(r["status"] == "ok" for r in rows), rows
        assert {r["variant"] for r in rows} == {"new", "general"} and "0 rows not ok" in res.stdout
    if script == "memory.py":  # every case ran; outputs counted (3 x 37 fp32: 444 B, a 512-byte block)
        import csv

        rows = list(csv.DictReader(open(tmp_path / "memory.csv")))
        assert len(rows) == 15 and all(int(r["output_bytes"]) > 0 for r in rows), rows
        assert all(int(r["output_alloc_bytes"]) % 512 == 0 for r in rows)


def test_ab_lists_the_compiled_kernels():
    """benchmarks/ab.py's register report reads the cached launches (GPU only at run time): one line
    per compiled kernel, with its family, strategy and pass."""
    import importlib.util
    import types
    from pathlib import Path

    from rollbuf.kernels.host import Strategy

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "ab.py"
    spec = importlib.util.spec_from_file_location("_ab", path)
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    fake = types.SimpleNamespace(n_regs=80, n_spills=0)
    compiled = types.SimpleNamespace(compiled=(None, None, None, fake), warps=8)
    never = types.SimpleNamespace(compiled=None, warps=1)
    launch = types.SimpleNamespace(family="lambda", strategy=Strategy(1, 2048, True, 8, 8, True, True),
                                   passes=(compiled, never))
    lines = ab.compiled_kernels({"key": launch})
    assert lines == ["kernel lambda BLOCK_N=1 BLOCK_T=2048 SPLIT=True PRESOLVE=True SHIFT_LOAD=True pass=0 "
                     "warps=8: 80 registers, 0 spills"]
