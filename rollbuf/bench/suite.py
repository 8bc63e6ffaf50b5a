"""Cases, the correctness gate, timing, the scoreboard and the regression check."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import time
from typing import Iterable

import attrs
import torch

from rollbuf.bench.competitors import COMPETITORS, Unsupported
from rollbuf.testing import default_tolerance, make_rollout, reference_outputs

L2_BYTES = 60 * 2**20  # H200

PARAMS = {
    "gae": dict(gamma=0.99, lam=0.95), "lambda_returns": dict(gamma=0.99, lam=0.95),
    "discounted_returns": dict(gamma=0.99), "monte_carlo_returns": dict(gamma=0.99),
    "vtrace": dict(gamma=0.99), "retrace": dict(gamma=0.99, lam=0.95),
    "eligibility_traces": dict(gamma=0.99, lam=0.95), "episodic_sums": {},
}
ESTIMATORS = tuple(PARAMS)
MIXES = {  # boundary mixes: (p_terminated, p_truncated, p_masked)
    "none": (0.0, 0.0, 0.0), "term": (0.01, 0.0, 0.0), "term+trunc": (0.01, 0.01, 0.0),
    "mask": (0.01, 0.01, 0.3),
}
_READS = {  # fields each estimator reads (for bytes moved)
    "gae": ("rewards", "values", "terminated", "truncated", "mask"),
    "lambda_returns": ("rewards", "values", "terminated", "truncated", "mask"),
    "discounted_returns": ("rewards", "terminated", "truncated", "mask"),
    "monte_carlo_returns": ("rewards", "terminated", "truncated", "mask"),
    "vtrace": ("rewards", "values", "terminated", "truncated", "mask", "log_probs", "target_log_probs"),
    "retrace": ("rewards", "values", "terminated", "truncated", "mask", "log_probs", "target_log_probs",
                "q_values"),
    "eligibility_traces": ("rewards", "terminated", "truncated", "mask"),
    "episodic_sums": ("rewards", "terminated", "truncated", "mask"),
}


@attrs.frozen
class Case:
    """One benchmark case: an estimator on ``n`` rows of ``t`` steps of ``dtype`` inputs with the
    boundary ``mix`` (one of ``MIXES``: none, term, term+trunc, mask)."""

    estimator: str
    n: int
    t: int
    dtype: str = "float32"
    mix: str = "term+trunc"

    @property
    def key(self):
        return (self.estimator, self.n, self.t, self.dtype, self.mix)


def _grid(estimators, shapes, dtypes=("float32",), mixes=("term+trunc",)) -> list[Case]:
    return [Case(e, n, t, d, m) for e in estimators for (n, t) in shapes for d in dtypes for m in mixes]


SHORT = [(n, t) for t in (8, 16, 32, 64, 128) for n in (4096, 8192, 16384, 32768)]
MEDIUM = [(n, t) for n in (64, 128, 256, 512, 4096, 16384) for t in (128, 512, 1024, 2048, 4096)]
LONG = [(n, t) for n in (1, 8, 64, 256) for t in (16384, 131072, 1048576)]
LLM = [(8, 8192), (64, 32768), (256, 131072)]
GRIDS: dict[str, list[Case]] = {
    "cpu-smoke": _grid(ESTIMATORS, [(16, 64), (2, 1000)], mixes=("term+trunc", "mask"))
    + _grid(["gae"], [(64, 128)], mixes=("none", "term", "term+trunc")),
    "cpu": _grid(ESTIMATORS, [(8, 32768), (1024, 128)], mixes=("term+trunc",)),
    "gpu-quick": _grid(["gae"], [(32768, 8), (4096, 128), (1024, 1024), (256, 131072), (1, 1048576)],
                       dtypes=("float32", "bfloat16")),
    "gpu": _grid(ESTIMATORS, SHORT + MEDIUM + LONG, dtypes=("float32", "bfloat16"))
    + _grid(["gae"], SHORT + MEDIUM + LONG, mixes=("none", "term", "mask")),
    "llm": _grid(["gae", "discounted_returns"], LLM, dtypes=("float32", "bfloat16"), mixes=("mask",)),
}


def provenance(device) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = ""
    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = ""
    dev = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())
    return dict(device=dev, torch=torch.__version__, triton=tv,
                commit=os.environ.get("ROLLBUF_COMMIT", commit) or "unknown", date=time.strftime("%Y-%m-%d"),
                threads=torch.get_num_threads())


def make_fields(case: Case, device, seed=0) -> dict:
    pk, ptr, pm = MIXES[case.mix]
    f = make_rollout(case.n, case.t, seed=seed, dtype=getattr(torch, case.dtype), p_terminated=pk,
                     p_truncated=ptr, p_masked=pm, device=device, garbage=True)
    if not pm:
        f["mask"] = None  # no mask at all, as most trainers call it
    return f


def bytes_moved(case: Case, f, outs) -> int:
    b = sum(f[k].numel() * f[k].element_size() for k in _READS[case.estimator] if f.get(k) is not None)
    return b + sum(o.numel() * o.element_size() for o in outs if o.dim() >= 2)


def rel_err(got, ref) -> float:
    errs = []
    for a, b in zip(got, ref):
        a, b = a.detach().double().cpu(), b.double().cpu()
        if a.shape != b.shape or torch.isnan(a).any():
            return math.inf
        errs.append(((a - b).norm() / b.norm().clamp_min(1e-30)).item())
    return max(errs)


def _oracle(case: Case, f) -> tuple[torch.Tensor, ...]:
    if case.n * case.t <= 2**17:
        cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in f.items()}
        return reference_outputs(case.estimator, cpu, **PARAMS[case.estimator])
    f64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in f.items()}
    return COMPETITORS["rollbuf-torch"](case.estimator, f64, PARAMS[case.estimator])


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _time_cpu(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    half = max(1, len(ts) // 2)
    a, b = statistics.median(ts[:half]), statistics.median(ts[half:] or ts)
    return statistics.median(ts), abs(a - b) / max(min(a, b), 1e-12)


def _time_cuda(fns):
    """(full call s, device s, spread): do_bench median; CUDA-graph replay over rotated inputs."""
    from triton.testing import do_bench

    it = iter(range(10**12))
    call = do_bench(lambda: fns[next(it) % len(fns)](), warmup=10, rep=60, return_mode="median") * 1e-3
    try:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for fn in fns:
                fn()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for fn in fns:
                fn()
        times = []
        for _ in range(6):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(10):
                g.replay()
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) * 1e-3 / (10 * len(fns)))
        dev = statistics.median(times)
        spread = abs(statistics.median(times[:3]) - statistics.median(times[3:])) / dev
    except Exception:  # a competitor that cannot be captured: no device time
        dev, spread = math.nan, math.nan
    return call, dev, spread


def run_cases(cases: Iterable[Case], competitors: Iterable[str], device: str, *, copy_bw: float | None = None,
              progress=None, reps: int = 5) -> list[dict]:
    """Gate, then time, every competitor on every case; one row per (case, competitor)."""
    prov = provenance(device)
    rows = []
    for case in cases:
        f = make_fields(case, device)
        ref = _oracle(case, f)
        tol = default_tolerance(getattr(torch, case.dtype))[0] * 10
        for name in competitors:
            fn = COMPETITORS[name]
            row = dict(estimator=case.estimator, n=case.n, t=case.t, dtype=case.dtype, mix=case.mix,
                       impl=name, **prov)
            try:
                t0 = time.perf_counter()
                out = fn(case.estimator, f, PARAMS[case.estimator])
                _sync(device)
                row["first_call_s"] = time.perf_counter() - t0
            except Unsupported as e:
                row.update(status="unsupported", note=str(e)[:80])
                rows.append(row)
                continue
            except Exception as e:  # a competitor that fails is reported, not hidden
                row.update(status="error", note=f"{type(e).__name__}: {str(e)[:80]}")
                rows.append(row)
                continue
            err = rel_err(out, ref)
            row["rel_err"] = err
            if not err < tol:
                row.update(status="wrong", note=f"relative error {err:.2e} >= {tol:.0e}")
                rows.append(row)
                continue
            nbytes = bytes_moved(case, f, out)
            row.update(status="ok", bytes=nbytes)
            if device == "cuda":
                n_sets = max(1, min(8, -(-3 * L2_BYTES // max(nbytes, 1))))
                sets = [f] + [make_fields(case, device, seed=s) for s in range(1, n_sets)]
                call, dev, spread = _time_cuda([lambda s=s: fn(case.estimator, s, PARAMS[case.estimator])
                                                for s in sets])
                row.update(call_us=call * 1e6, device_us=dev * 1e6, spread=spread)
                if copy_bw and dev == dev:
                    row["pct_copy"] = 100 * nbytes / dev / copy_bw
            else:
                call, spread = _time_cpu(lambda: fn(case.estimator, f, PARAMS[case.estimator]), reps)
                row.update(call_us=call * 1e6, spread=spread)
            rows.append(row)
        if progress is not None:
            progress.update(1)
    return rows


def _time_of(r):
    d = r.get("device_us")
    return d if d is not None and d == d else r.get("call_us")


def scoreboard(rows: list[dict], ours: str) -> list[dict]:
    """Per competitor: pass rate, share of cases where ``ours`` is faster, geomean speedup of ours."""
    mine = {(r["estimator"], r["n"], r["t"], r["dtype"], r["mix"]): r for r in rows if r["impl"] == ours}
    board = []
    for name in sorted({r["impl"] for r in rows}):
        rs = [r for r in rows if r["impl"] == name]
        attempted = [r for r in rs if r.get("status") != "unsupported"]
        ok = [r for r in attempted if r.get("status") == "ok"]
        speed = []
        for r in ok:
            m = mine.get((r["estimator"], r["n"], r["t"], r["dtype"], r["mix"]))
            if m is not None and m.get("status") == "ok" and name != ours:
                speed.append(float(_time_of(r)) / float(_time_of(m)))
        pct = [float(r["pct_copy"]) for r in ok if r.get("pct_copy") is not None]
        board.append(dict(
            impl=name, cases=len(attempted), passed=len(ok),
            pass_rate=len(ok) / len(attempted) if attempted else math.nan,
            ours_faster_share=(sum(s > 1 for s in speed) / len(speed)) if speed else math.nan,
            geomean_speedup=math.exp(sum(math.log(s) for s in speed) / len(speed)) if speed else math.nan,
            median_pct_copy=statistics.median(pct) if pct else math.nan))
    return board


def compare(new: list[dict], baseline: list[dict], impl: str, floor: float = 0.05) -> list[dict]:
    """Cases of ``impl`` slower than the baseline by more than the run-to-run spread measured."""
    key = lambda r: (r["estimator"], int(r["n"]), int(r["t"]), r["dtype"], r["mix"])  # noqa: E731
    old = {key(r): r for r in baseline if r["impl"] == impl and r.get("status") == "ok"}
    slower = []
    for r in new:
        if r["impl"] != impl or r.get("status") != "ok" or key(r) not in old:
            continue
        o = old[key(r)]
        t_new, t_old = float(_time_of(r)), float(_time_of(o))
        spread = max(floor, float(r.get("spread") or 0), float(o.get("spread") or 0))
        if t_new > t_old * (1 + spread):
            slower.append(dict(case=key(r), old_us=t_old, new_us=t_new, ratio=t_new / t_old, spread=spread))
    return slower
