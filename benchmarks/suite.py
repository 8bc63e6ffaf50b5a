"""The scoreboard's machinery: inputs, the correctness gate, the two clocks, the run, the
scoreboard and the regression check.

**The gate.** Before a competitor is timed on a case, its outputs are compared with
:mod:`benchmarks.oracles` (float64 recursions written apart from rollbuf's arithmetic) on the same
inputs, at every case size. The error is the largest absolute error over each row's scale,
``max |got − oracle| / max(1, max |oracle| over the row)``, over every output the competitor
writes; a case passes below :data:`TOLERANCE` of its dtype. A bf16 (or fp16) case is also run at
fp32 on the same inputs (the bf16 values, exactly converted) and must pass the fp32 tolerance too,
so that a semantic error cannot hide behind bf16 rounding.

**The clocks.** *Device time*: one CUDA graph of one call per input set, the sets rotated past the
L2, replayed (:func:`benchmarks.clocks.graph_time`, imported here). *Full call*: the wall time per
call of calls made back to back, one sync per batch, the competitors of a case timed together with
their batches interleaved (:func:`wall_times`): the host's cost per call or the device's, whichever
is longer. A ratio always divides one clock by the same clock.
"""

from __future__ import annotations

import csv
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Iterable

import torch

from benchmarks import oracles
from benchmarks.cases import MIXES, PARAMS, Case, row_key
from benchmarks.clocks import graph_time
from benchmarks.competitors import COMPETITORS, Unsupported, bind
from rollbuf.estimators import REGISTRY
from rollbuf.testing import make_rollout, window_end_index

L2_BYTES = 60 * 2**20  # H200
#: The full call of a case (:func:`wall_times`): each competitor's calls back to back in this many
#: batches over this many seconds, the competitors' batches interleaved.
FULL_CALL_BUDGET_S = 0.045
FULL_CALL_BATCHES = 9

#: The gate's tolerance per dtype on ``max |got − oracle|`` over the row's scale. The bf16 bound
#: admits honest bf16 arithmetic (outputs rounded to 2^-9 of their value, loops that round every
#: step), so it cannot tell every semantic error from rounding: the fp32 rerun of every bf16 case,
#: at the fp32 bound, decides semantics (tests/test_bench.py feeds the gate wrong implementations).
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}
_READS = {  # per-step fields each estimator reads (for bytes moved; x is the rollout's rewards here)
    name: tuple("rewards" if f.name == "x" else f.name for f in e.fields if f.read and f.kind != "bootstrap")
    for name, e in REGISTRY.items()
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
    """Inputs of ``case``: :func:`rollbuf.testing.make_rollout` (float64 draws on the CPU, garbage at
    masked steps) on the CPU and for small GPU cases; large GPU cases draw on the device
    (:func:`_device_fields`: the same distributions, seconds instead of minutes at 2^28 elements).
    ``layout="time"``: every per-step field is stored ``[T, N]`` and passed as its ``[N, T]`` view.
    The mix ``term-only`` has no truncated tensor and ``[N]`` window-end ``bootstrap_values``."""
    pk, ptr, pm = MIXES[case.mix]
    if device != "cpu" and case.n * case.t > 2**14:
        f = _device_fields(case, device, seed)
    else:
        f = make_rollout(case.n, case.t, seed=seed, dtype=getattr(torch, case.dtype), p_terminated=pk,
                         p_truncated=ptr or 0.0, p_masked=pm, device=device, garbage=True)
        if not pm:
            f["mask"] = None  # no mask at all, as most trainers call it
        # the window-end bootstrap finite even where the last step terminates (as _device_fields
        # makes it): a trainer always has a value there, and loops that multiply it by 0 must not
        # be failed by a NaN no trainer passes
        bv = f["bootstrap_values"]
        end = window_end_index(f["mask"], tuple(bv.shape)).clamp_min(0).to(bv.device).unsqueeze(-1)
        fill = torch.randn(bv.shape[:-1] + (1,), generator=torch.Generator().manual_seed(seed + 7)).to(bv)
        at_end = bv.gather(-1, end)
        f["bootstrap_values"] = bv.scatter(-1, end, torch.where(at_end.isnan(), fill, at_end))
        if ptr is None:
            f["truncated"] = None
            f["bootstrap_values"] = f["bootstrap_values"].gather(-1, end)[..., 0].contiguous()
    if case.layout == "time":
        f = {k: (v.mT.contiguous().mT if isinstance(v, torch.Tensor) and v.dim() == 2 else v) for k, v in f.items()}
    return f


def _device_fields(case: Case, device, seed) -> dict:
    pk, ptr, pm = MIXES[case.mix]
    g = torch.Generator(device=device).manual_seed(seed)
    N, T, dt = case.n, case.t, getattr(torch, case.dtype)
    rn = lambda: torch.randn(N, T, device=device, generator=g)  # noqa: E731
    u = lambda: torch.rand(N, T, device=device, generator=g)  # noqa: E731
    lp = -rn().abs()
    tlp = torch.where(u() < 0.25, lp, lp + 0.5 * rn())
    v = rn()
    f = dict(rewards=rn().to(dt), values=v.to(dt), q_values=(v + rn()).to(dt), log_probs=lp.to(dt),
             target_log_probs=tlp.to(dt), terminated=u() < pk, truncated=u() < (ptr or 0.0))
    mask = None
    if pm:  # spans of mean length 4: a step starts a masked span w.p. pm/4, ends one w.p. 1/4
        # a span starts at a start toggle and ends at the next end toggle
        starts, ends = u() < pm / 4, u() < 0.25
        last_start = torch.cummax(torch.where(starts, torch.arange(T, device=device), -1), dim=-1).values
        last_end = torch.cummax(torch.where(ends, torch.arange(T, device=device), -1), dim=-1).values
        mask = ~(last_start > last_end)
        for k in ("rewards", "values", "q_values", "log_probs", "target_log_probs"):
            f[k] = torch.where(mask, f[k], torch.nan)  # garbage where masked
    f["mask"] = mask
    # bootstrap values: finite where read (truncated, not terminated; the window end), NaN elsewhere
    bv = torch.full((N, T), torch.nan, device=device)
    read = f["truncated"] & ~f["terminated"]
    if mask is not None:
        read &= mask
    end = torch.zeros_like(read)
    last = (T - 1 - torch.flip(mask.int(), [-1]).argmax(-1)) if mask is not None else torch.full(
        (N,), T - 1, device=device)
    end[torch.arange(N, device=device), last] = True
    bv = torch.where(read | end, rn(), bv)
    f["bootstrap_values"] = bv.to(dt)
    if ptr is None:
        f["truncated"] = None
        f["bootstrap_values"] = f["bootstrap_values"][torch.arange(N, device=device), last].contiguous()
    return f


def bytes_moved(case: Case, f, outs) -> int:
    b = sum(f[k].numel() * f[k].element_size() for k in _READS[case.estimator] if f.get(k) is not None)
    return b + sum(o.numel() * o.element_size() for o in outs if o.dim() >= 2)


def rel_err(got, ref) -> float:
    """Relative L2 error, the largest over the outputs compared (reported, not gated)."""
    errs = []
    for g, r in zip(got, ref):
        if g is None:
            continue
        a, b = g.detach().to(r.device, torch.float64), r.double()  # where the oracle ran
        if a.shape != b.shape or torch.isnan(a).any():
            return math.inf
        errs.append(((a - b).norm() / b.norm().clamp_min(1e-30)).item())
    return max(errs) if errs else math.inf


def gate_error(got, ref) -> float:
    """The gated error: ``max |got − ref| / scale`` over every output ``got`` holds (``None`` =
    not written, not compared), ``scale`` = ``max(1, max |ref| over the row)`` (for a per-row
    output such as ``final``: ``max(1, |ref|)``). ``inf`` for a NaN, a wrong shape or a missing
    output."""
    if len(got) != len(ref) or all(a is None for a in got):
        return math.inf
    worst = 0.0
    for g, r in zip(got, ref):
        if g is None:
            continue
        if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(r.shape):
            return math.inf
        a, b = g.detach().to(r.device, torch.float64), r.to(torch.float64)
        if b.numel() == 0:
            continue
        rows = b.reshape(b.shape[0], -1) if b.dim() >= 2 else b.reshape(-1, 1)
        scale = rows.abs().amax(1).clamp_min(1.0)
        err = (a.reshape(rows.shape) - rows).abs() / scale[:, None]
        e = float(err.max()) if not bool(err.isnan().any()) else math.inf
        worst = max(worst, e)
    return worst


def oracle(case: Case, f) -> tuple[torch.Tensor, ...]:
    """The float64 outputs of :mod:`benchmarks.oracles` for ``case`` on ``f``, on ``f``'s device."""
    return oracles.outputs(case.estimator, f, **PARAMS[case.estimator])


def _as_fp32(f) -> dict:
    """The same inputs in float32 (bf16/fp16 values convert exactly; strides kept)."""
    return {k: (v.to(torch.float32) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for k, v in f.items()}


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


def wall_time(fns, sync, budget_s=0.025, batches=5, clock=time.perf_counter):
    """Seconds per call of calls made back to back, inputs rotated, one ``sync`` per batch (median of
    ``batches``): what a loop of calls pays per call, the host's cost or the device's, whichever is
    longer. (``triton.testing.do_bench`` records its events around each call after a 256 MB memset
    that clears the L2, so a host cost shorter than that memset is hidden in it: its median is close
    to the device time for any call whose host part is that short.)"""
    return wall_times({None: fns}, sync, budget_s, batches, clock)[None]


def wall_times(timed: dict, sync, budget_s=0.025, batches=5, clock=time.perf_counter) -> dict:
    """:func:`wall_time` of several competitors' calls (``timed``: name -> the calls over rotated
    input sets), their batches interleaved: batch ``b`` of every competitor runs before batch
    ``b + 1`` of any, so that a host that slows down for a while slows each of them alike, and the
    comparison of two medians is one of the same moments. Seconds per call by name."""
    state = {}
    for name, fns in timed.items():
        sync()
        t0, k = clock(), 0
        while k < len(fns) or clock() - t0 < budget_s / (4 * batches):  # the estimate, and warm-up
            fns[k % len(fns)]()
            k += 1
        sync()
        per = (clock() - t0) / k
        # a slow call (an eager loop over time) is timed one call per batch; the input sets keep rotating
        n = max(1, min(100_000, int(budget_s / batches / max(per, 1e-9))))
        state[name] = [k, n, []]
    for _ in range(batches):
        for name, fns in timed.items():
            st = state[name]
            k, n = st[0], st[1]
            sync()
            t0 = clock()
            for _ in range(n):
                fns[k % len(fns)]()
                k += 1
            sync()
            st[2].append((clock() - t0) / n)
            st[0] = k
    return {name: statistics.median(st[2]) for name, st in state.items()}


def _device_time(fns, graph: bool, per_call: float | None = None):
    """(device s, spread) of :func:`graph_time`, NaN where the calls are not captured (``graph``
    false: launch-bound competitors such as the eager loop) or cannot be; ``per_call``: seconds per
    call already measured (else a quick estimate), to size the replays."""
    if not graph:
        return math.nan, math.nan
    per_call = _quick_call(fns) if per_call is None else per_call
    reps = max(1, min(10, int(2e-3 / max(per_call * len(fns), 1e-7))))
    try:
        return graph_time(fns, reps)
    except Exception:  # a competitor that cannot be captured: no device time
        torch.cuda.synchronize()
        return math.nan, math.nan


def _quick_call(fns) -> float:
    """A rough seconds per call (a few calls back to back), to size the graph replays."""
    return wall_time(fns, torch.cuda.synchronize, budget_s=0.005, batches=1)


def time_cuda(fns, graph=True):
    """(full call s, device s, spread): :func:`wall_time` of back-to-back calls; CUDA-graph replay over
    rotated inputs (``graph=False``: launch-bound competitors such as the eager loop, device time not
    taken)."""
    call = wall_time(fns, torch.cuda.synchronize)
    return (call, *_device_time(fns, graph, call))


def run_cases(cases: Iterable[Case], competitors: Iterable[str], device: str, *, copy_bw: float | None = None,
              progress=None, reps: int = 5, on_row=None, budget_s: float | None = None) -> list[dict]:
    """Gate, then time, every competitor on every case; one row per (case, competitor).

    Cases are run grouped by shape, dtype and mix, so inputs are made once for all estimators.
    ``on_row(row)`` is called as each row is finished (incremental CSV); with ``budget_s``, cases
    not started within that many seconds are reported ``status="skipped"`` (budget), not run."""
    prov = provenance(device)
    rows = []
    t_start = time.perf_counter()
    # largest first: if the budget runs out, the many small cases go, not the bandwidth-bound ones
    cases = sorted(cases, key=lambda c: (-c.n * c.t, c.n, c.dtype, c.mix, c.layout, c.estimator))
    cached_key, sets, competitors = None, None, list(competitors)
    for case in cases:
        if budget_s is not None and time.perf_counter() - t_start > budget_s:
            for name in competitors:
                row = dict(estimator=case.estimator, n=case.n, t=case.t, dtype=case.dtype, mix=case.mix,
                           layout=case.layout, impl=name, status="skipped",
                           note=f"time budget of {budget_s:.0f} s spent", **prov)
                rows.append(row)
                if on_row:
                    on_row(row)
            if progress is not None:
                progress.update(1)
            continue
        key = (case.n, case.t, case.dtype, case.mix, case.layout)
        if key != cached_key:
            sets = None
            if device == "cuda":
                torch.cuda.empty_cache()
            sets = [make_fields(case, device)]
            cached_key = key
        f = sets[0]
        ref = oracle(case, f)
        done = [_run_one(case, name, f, ref, device, sets, copy_bw, reps, prov) for name in competitors]
        timed = {i: row.pop("_calls") for i, row in enumerate(done) if "_calls" in row}
        if timed:  # the full calls of the case's competitors, batches interleaved (wall_times)
            for i, sec in wall_times(timed, torch.cuda.synchronize, budget_s=FULL_CALL_BUDGET_S,
                                     batches=FULL_CALL_BATCHES).items():
                done[i]["call_us"] = sec * 1e6
        del timed
        for row in done:
            rows.append(row)
            if on_row:
                on_row(row)
        del ref, done
        if progress is not None:
            progress.update(1)
    return rows


def _check(case, fn, f, ref) -> tuple[dict, object]:
    """Gate ``fn`` on ``case``: ``(row fields, the bound call)``; the row has ``status`` set when the
    competitor is unsupported, failed or wrong. bf16/fp16 cases are also run on the same inputs in
    fp32 against the fp32 tolerance."""
    dtype = getattr(torch, case.dtype)
    params = PARAMS[case.estimator]
    row: dict = {}
    try:
        t0 = time.perf_counter()
        call = bind(fn, case.estimator, f, params)
        out = call()
        _sync(f["rewards"].device.type)
        row["first_call_s"] = time.perf_counter() - t0
        out32 = None
        if dtype in (torch.bfloat16, torch.float16):
            out32 = bind(fn, case.estimator, _as_fp32(f), params)()
    except Unsupported as e:
        row.update(status="unsupported", note=str(e)[:200])
        return row, None
    except Exception as e:  # a competitor that fails is reported, not hidden
        row.update(status="error", note=f"{type(e).__name__}: {str(e)[:100]}")
        return row, None
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    row["rel_err"] = rel_err(out, ref)
    row["err"] = err = gate_error(out, ref)
    row["tol"] = tol = TOLERANCE[dtype]
    problems = []
    if not err < tol:
        problems.append(f"max error {err:.2e} of the row scale >= {tol:.0e} ({case.dtype})")
    if out32 is not None:
        out32 = tuple(out32) if isinstance(out32, (tuple, list)) else (out32,)
        row["err_fp32"] = err32 = gate_error(out32, ref)
        if not err32 < TOLERANCE[torch.float32]:
            problems.append(f"the same inputs in fp32: max error {err32:.2e} >= {TOLERANCE[torch.float32]:.0e}")
    if not getattr(fn, "gate", True):
        row.update(status="unchecked", note="its own convention: timed, not gated")
    elif problems:
        row.update(status="wrong", note="; ".join(problems))
    row["_outs"] = out
    return row, call


def _run_one(case, name, f, ref, device, sets, copy_bw, reps, prov):
    fn = COMPETITORS[name]
    row = dict(estimator=case.estimator, n=case.n, t=case.t, dtype=case.dtype, mix=case.mix, layout=case.layout,
               impl=name, **prov)
    checked, call = _check(case, fn, f, ref)
    outs = checked.pop("_outs", None)
    row.update(checked)
    if row.get("status") in ("unsupported", "error", "wrong"):
        return row
    nbytes = bytes_moved(case, f, [o for o in outs if o is not None])
    del outs
    row.setdefault("status", "ok")
    row["bytes"] = nbytes
    params = PARAMS[case.estimator]
    if device == "cuda":
        n_sets = max(1, min(8, -(-3 * L2_BYTES // max(nbytes, 1))))
        while len(sets) < n_sets:  # input sets rotated past the L2, made once per shape
            sets.append(make_fields(case, device, seed=len(sets)))
        calls = [call] + [bind(fn, case.estimator, s, params) for s in sets[1:n_sets]]
        dev, spread = _device_time(calls, getattr(fn, "graph", True))
        row.update(device_us=dev * 1e6, spread=spread)
        if copy_bw and dev == dev:
            row["pct_copy"] = 100 * nbytes / dev / copy_bw
        row["_calls"] = calls  # the full call: timed with the case's other competitors (run_cases)
    else:
        call_s, spread = _time_cpu(call, reps)
        row.update(call_us=call_s * 1e6, spread=spread)
    return row


#: The two clocks a ratio may use; a ratio never divides one by the other.
CLOCKS = ("device_us", "call_us")


def _clock(r, key):
    v = r.get(key)
    return float(v) if v is not None and v == v and float(v) > 0 else None


def speedups(rows: list[dict], ours: str, impl: str, clock: str) -> list[float]:
    """``time(impl) / time(ours)`` on the cases both passed (``ok``, or ``unchecked`` for a
    competitor that is timed only), on one clock: ``device_us`` over ``device_us`` or ``call_us``
    over ``call_us``; a case where either lacks that clock is left out."""
    mine = {row_key(r): r for r in rows if r["impl"] == ours and r.get("status") == "ok"}
    out = []
    for r in rows:
        if r["impl"] != impl or r.get("status") not in ("ok", "unchecked"):
            continue
        m = mine.get(row_key(r))
        if m is None:
            continue
        a, b = _clock(r, clock), _clock(m, clock)
        if a is not None and b is not None:
            out.append(a / b)
    return out


def _geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def scoreboard(rows: list[dict], ours: str) -> list[dict]:
    """Per competitor: pass rate, and per clock (device time, full call) the cases compared, the share
    where ``ours`` is faster and the geomean speedup of ours — each ratio on one clock."""
    board = []
    for name in sorted({r["impl"] for r in rows}):
        rs = [r for r in rows if r["impl"] == name]
        attempted = [r for r in rs if r.get("status") not in ("unsupported", "skipped")]
        gated = [r for r in attempted if r.get("status") != "unchecked"]
        ok = [r for r in attempted if r.get("status") == "ok"]
        pct = [float(r["pct_copy"]) for r in ok if r.get("pct_copy") is not None]
        entry = dict(impl=name, cases=len(attempted), passed=len(ok),
                     unchecked=len(attempted) - len(gated),
                     pass_rate=len(ok) / len(gated) if gated else math.nan,
                     median_pct_copy=statistics.median(pct) if pct else math.nan)
        for clock in CLOCKS:
            sp = speedups(rows, ours, name, clock) if name != ours else []
            tag = clock.split("_")[0]
            entry[f"{tag}_compared"] = len(sp)
            entry[f"{tag}_ours_faster_share"] = (sum(s > 1 for s in sp) / len(sp)) if sp else math.nan
            entry[f"{tag}_geomean_speedup"] = _geomean(sp)
        board.append(entry)
    return board


def compare(new: list[dict], baseline: list[dict], impl: str, floor: float = 0.05) -> list[dict]:
    """Cases of ``impl`` slower than the baseline by more than the run-to-run spread measured, on
    the device time where both runs have it, else on the full call (never one against the other)."""
    key = row_key
    old = {key(r): r for r in baseline if r["impl"] == impl and r.get("status") == "ok"}
    slower = []
    for r in new:
        if r["impl"] != impl or r.get("status") != "ok" or key(r) not in old:
            continue
        o = old[key(r)]
        for clock in CLOCKS:
            t_new, t_old = _clock(r, clock), _clock(o, clock)
            if t_new is not None and t_old is not None:
                break
        else:
            continue
        spread = max(floor, float(r.get("spread") or 0), float(o.get("spread") or 0))
        if t_new > t_old * (1 + spread):
            slower.append(dict(case=key(r), old_us=t_old, new_us=t_new, ratio=t_new / t_old, spread=spread,
                               clock=clock))
    return slower


#: The columns of ``results.csv``, one row per case and competitor.
COLUMNS = ["estimator", "n", "t", "dtype", "mix", "layout", "impl", "status", "err", "err_fp32", "tol", "rel_err",
           "call_us", "device_us", "spread", "bytes", "pct_copy", "first_call_s", "note", "device", "torch",
           "triton", "commit", "date", "threads", "copy_GBps"]
_FLOATS = ("err", "err_fp32", "tol", "rel_err", "call_us", "device_us", "spread", "pct_copy", "bytes",
           "first_call_s")


def read_csv(paths) -> list[dict]:
    """The rows of ``paths``, one per (case, implementation): a row of a later file replaces one of an
    earlier file (a case run again), except that a ``skipped`` row (budget) never replaces a result."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        with open(path) as fh:
            for r in csv.DictReader(fh):
                for k in ("n", "t"):
                    r[k] = int(r[k])
                for k in _FLOATS:
                    r[k] = float(r[k]) if r.get(k) not in (None, "") else None
                key = row_key(r) + (r["impl"],)
                if r.get("status") == "skipped" and key in rows:
                    continue
                rows[key] = r
    return list(rows.values())


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (1 GiB of fp32 copied, ``do_bench`` median)."""
    from triton.testing import do_bench

    a = torch.empty(2**28, device="cuda").uniform_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * a.numel() * 4 / (ms * 1e-3)


def interpreted(command: str, argv) -> int | None:
    """Triton's interpreter must be chosen before rollbuf's kernels are imported. When
    ``TRITON_INTERPRET=1`` is set already, returns None (run here); otherwise runs
    ``python -m benchmarks command argv`` with it set, in a new process, and returns its exit status."""
    import sys

    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    return subprocess.call([sys.executable, "-m", "benchmarks", command, *argv], env=env)
