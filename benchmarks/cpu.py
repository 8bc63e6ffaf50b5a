"""``python -m benchmarks cpu --out DIR``: GAE on the CPU against the loops users run today.

    python -m benchmarks cpu --out bench-cpu                    # the grid (benchmarks.cases.CPU_GRID)
    python -m benchmarks cpu --out bench-cpu --quick            # a few shapes, seconds
    python -m benchmarks cpu --out bench-cpu --shapes 4x128,8x32768 --threads 1

Float32, 2% terminations, no truncation, the window end bootstrapped from ``V(s_T)`` (one value per
row), as an on-policy trainer calls GAE. Every implementation (:data:`benchmarks.competitors.CPU_GAE`:
rollbuf's ``numba`` backend on ``[N, T]`` tensors and on ``[T, N]`` buffers read in place, its
``torch`` backend, a plain ``@njit`` loop, Stable-Baselines3's buffer, CleanRL's loop, TorchRL's
vectorised estimator) computes advantages and returns from the same numbers, in its own layout.

**The gate.** Before it is timed, each implementation's advantages and returns are compared with
the float64 oracle of :mod:`benchmarks.oracles` on every row (the scoreboard's error and fp32
tolerance, :func:`benchmarks.suite.gate_error`); one that fails is reported ``wrong`` and not timed.

**Timing.** One warm-up call (also the first call's time), then single calls until ``--budget-s``
seconds or 200 calls (at least 5), garbage collection off; the median with the 25th and 75th
percentiles, and the 1-minute load average beside each row (the machine may be shared). A call
predicted to exceed ``--max-call-s`` (linearly from the same implementation at the next shorter
``T``) is skipped.

**First call** (on unless ``--no-first-call``): in a fresh process each, the import of numba and the
first call of each estimator family with an empty numba cache (the compile), then again in a new
process with the cache that run left (``cache=True``).

Writes ``cpu.csv`` (one row per case, with provenance) and ``cpu.md`` (the tables of
docs/benchmarks.md) under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from benchmarks import cases, oracles, tables
from benchmarks.competitors import CPU_GAE, CPU_LAYOUT, Unsupported
from benchmarks.suite import TOLERANCE, gate_error

COLUMNS = ["kind", "estimator", "n", "t", "dtype", "layout", "impl", "status", "err", "tol", "call_us", "p25_us",
           "p75_us", "calls", "first_call_us", "note", "cpu", "cores", "threads", "python", "torch", "numba",
           "numpy", "sb3", "torchrl", "commit", "date", "load_1min"]


def make_data(N, T, seed=0):
    """The rollout every implementation gets: ``[N, T]`` float32 rewards and values, bool
    terminations, and ``bootstrap_values`` = ``V(s_T)`` of each row (``[N]``)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(N, T, generator=g)
    v = torch.randn(N, T, generator=g)
    k = torch.rand(N, T, generator=g) < cases.CPU_P_TERMINATED
    return dict(rewards=r, values=v, terminated=k, bootstrap_values=torch.randn(N, generator=g))


def oracle(d):
    """The float64 advantages and returns of :mod:`benchmarks.oracles` on ``d``."""
    return oracles.outputs("gae", d, **cases.PARAMS["gae"])


def time_calls(call, budget_s, max_calls=200, min_calls=5):
    """(median, 25th, 75th percentile µs, calls) of single calls, garbage collection off."""
    samples = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        while len(samples) < min_calls or (len(samples) < max_calls and time.perf_counter() - start < budget_s):
            t0 = time.perf_counter()
            call()
            samples.append(time.perf_counter() - t0)
    finally:
        if gc_was:
            gc.enable()
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else samples * 3
    return statistics.median(samples) * 1e6, q[0] * 1e6, q[2] * 1e6, len(samples)


# ------------------------------------------------------------------------------------- provenance


def _version(mod):
    try:
        return __import__(mod).__version__
    except Exception:
        return ""


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:
        return ""


def provenance():
    return dict(cpu=_cpu_name(), cores=os.cpu_count(), threads=torch.get_num_threads(),
                python=platform.python_version(), torch=torch.__version__, numba=_version("numba"),
                numpy=np.__version__, sb3=_version("stable_baselines3"), torchrl=_version("torchrl"),
                commit=_commit(), date=time.strftime("%Y-%m-%d %H:%M"))


def _load():
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return ""


# ------------------------------------------------------------------ first calls, in fresh processes

_FIRST_CALL = r"""
import json, sys, time
import torch
t0 = time.perf_counter(); import numba; t_numba = time.perf_counter() - t0
from rollbuf import functional as F
from rollbuf.testing import make_rollout, run_estimator
n, t, names, params = json.loads(sys.argv[1])
f = make_rollout(n, t, seed=0, p_terminated=0.02, p_truncated=0.02)
out = {"import numba": t_numba}
for name in names:
    t0 = time.perf_counter(); run_estimator(name, f, backend="numba", **params[name])
    out[name] = time.perf_counter() - t0
t0 = time.perf_counter(); F.affine_scan(torch.randn(n, t), torch.rand(n, t), backend="numba")
out["affine_scan"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def first_calls():
    """``{"cold": {...}, "cached": {...}}``: seconds of each first call, with an empty numba cache
    directory, then again in a new process with the cache the first one wrote."""
    arg = json.dumps([*cases.FIRST_CALL_SHAPE, list(cases.FIRST_CALL_ESTIMATORS),
                      {n: cases.PARAMS[n] for n in cases.FIRST_CALL_ESTIMATORS}])
    res = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold", "cached"):
            out = subprocess.run([sys.executable, "-c", _FIRST_CALL, arg], env=env, capture_output=True, text=True,
                                 check=True)
            res[label] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def first_call_rows(res, prov):
    n, t = cases.FIRST_CALL_SHAPE
    rows = []
    for label, times in res.items():
        for name, s in times.items():
            rows.append(dict(kind=f"first_call_{label}", estimator=name, n=n, t=t, dtype="float32", layout="[N,T]",
                             impl="rollbuf-numba" if name != "import numba" else "numba", status="ok",
                             call_us=f"{s * 1e6:.0f}", calls=1,
                             note="fresh process, " + ("empty numba cache" if label == "cold" else
                                                       "numba cache from the cold run"),
                             **prov, load_1min=_load()))
    return rows


# ------------------------------------------------------------------------------------------ the run


def run_grid(shapes, impls, budget_s, max_call_s, log=print):
    prov = provenance()
    rows = []
    last_time = {}  # (impl, N) -> (T, seconds per call) at the previous T
    tol = TOLERANCE[torch.float32]
    for N, T in shapes:
        d = make_data(N, T)
        ref = oracle(d)
        for impl in impls:
            row = dict(kind="steady", estimator="gae", n=N, t=T, dtype="float32", layout=CPU_LAYOUT.get(impl, "[N,T]"),
                       impl=impl, status="ok", tol=tol, **prov, load_1min=_load())
            prev = last_time.get((impl, N))
            if prev is not None and prev[1] * T / prev[0] > max_call_s:
                row.update(status="skipped", note=f"predicted {prev[1] * T / prev[0]:.0f} s per call "
                                                  f"(linear from T={prev[0]})")
                rows.append(row)
                log(f"{N}x{T} {impl}: skipped")
                continue
            try:
                call = CPU_GAE[impl](d)
                t0 = time.perf_counter()
                outs = call()
                first = time.perf_counter() - t0
                err = gate_error(outs, ref)
                row.update(err=f"{err:.2e}", first_call_us=f"{first * 1e6:.1f}")
                if not err < tol:
                    row.update(status="wrong", note=f"max error {err:.2e} of the row scale >= {tol:.0e}")
                else:
                    med, p25, p75, n_calls = time_calls(call, budget_s)
                    row.update(call_us=f"{med:.2f}", p25_us=f"{p25:.2f}", p75_us=f"{p75:.2f}", calls=n_calls)
                    last_time[(impl, N)] = (T, med * 1e-6)
            except Unsupported as e:
                row.update(status="unsupported", note=str(e))
            except (RuntimeError, MemoryError) as e:  # a competitor out of memory is a result, not the end of the run
                row.update(status="failed", note=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            rows.append(row)
            log(f"{N}x{T} {impl}: {row['status']} {row.get('call_us', '')} us (err {row.get('err', '')})")
        del d, ref
    return rows


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, none shown for a required option or where there is none
    to show (a default of None or False: the help says what happens)."""

    def _get_help_string(self, action):
        if action.required or action.default in (None, False, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks cpu", description=__doc__.split("\n")[0],
                                 formatter_class=_HelpFormatter)
    ap.add_argument("--out", required=True, help="directory for cpu.csv and cpu.md (created if missing); required")
    ap.add_argument("--quick", action="store_true", help="four small shapes, short budgets")
    ap.add_argument("--shapes", default=None, help="NxT,NxT,... instead of the grid")
    ap.add_argument("--impls", default=",".join(CPU_GAE), help="comma-separated subset")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="timing budget per case in seconds (default: 1.0; with --quick 0.1)")
    ap.add_argument("--max-call-s", type=float, default=20.0, help="skip a call predicted to take longer")
    ap.add_argument("--no-first-call", action="store_true", help="skip the first-call processes")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = cases.parse_shapes(args.shapes) if args.shapes else cases.CPU_QUICK if args.quick else cases.CPU_GRID
    impls = [i for i in args.impls.split(",") if i]
    unknown = [i for i in impls if i not in CPU_GAE]
    if unknown:
        raise SystemExit(f"unknown implementation(s) {unknown}; known: {', '.join(CPU_GAE)}")
    budget = args.budget_s if args.budget_s is not None else (0.1 if args.quick else 1.0)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    if not args.no_first_call:  # first: before this process has compiled anything
        rows += first_call_rows(first_calls(), provenance())
    rows += run_grid(shapes, impls, budget, args.max_call_s)
    path = os.path.join(args.out, "cpu.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
        w.writeheader()
        w.writerows(rows)
    rows = tables.read_rows([path])
    md = tables.cpu_grid(rows) + "\n" + (tables.first_call(rows) if not args.no_first_call else "")
    with open(os.path.join(args.out, "cpu.md"), "w") as f:
        f.write(md)
    print(md)
    print(f"wrote {path} and cpu.md")
    return 0
