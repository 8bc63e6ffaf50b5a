"""The host path of an estimator call on a CUDA GPU: what an eager call costs, and what a CUDA graph saves.

    python3 benchmarks/host_path.py --out DIR [--budget-s 150] [--calls N]   (the repository root on PYTHONPATH)
    python -m benchmarks host-path --out DIR                                 (from the repository root: the same)
    python3 benchmarks/host_path.py --dry-run --out DIR     # the same plumbing on the CPU, tiny shapes

Parts (every time in µs; CSV ``DIR/host_path.csv``, a short table printed last):

* ``eager``: ``functional.advantages``, ``functional.gae`` and ``Rollout.advantages`` called back to
  back, on rl-triton's 40-shape grid (T 128…4096 × N 128…8192 and T 8…128 × N 4096…32768, 39
  distinct; ``benchmarks.cases.PEER_SHAPES``), with rl-triton's ``compute_gae`` beside them when
  ``rl_triton`` is importable (rl-triton's ``src`` on ``PYTHONPATH``). Inputs as the peers'
  benchmarks pass them: fp32 rewards and values,
  bool terminations at 2%, the ``[N]`` window-end values (rl-triton: float32 flags, ``last_value``);
  the ``Rollout`` holds them as its per-step ``bootstrap_values`` (what ``Rollout.bootstrap``
  writes). Each measurement: ``--calls`` calls (fewer for long calls) with ``torch.cuda.synchronize()``
  only before and after them, repeated 7 times; ``wall_us`` is the median of the wall time per
  call, ``host_us`` the median of the time the calls took to return before the final sync (the host's
  own cost where the GPU keeps up).
* ``graph``: one CUDA graph holding nine estimator calls at 4096 × 128 (GAE, advantages, λ-returns,
  discounted and Monte-Carlo returns, V-trace, Retrace, eligibility traces, episodic sums; fp32,
  terminations and truncations, ``[N, T]`` bootstrap values): its replay time per call (replays
  back to back, wall clock) against the calls' device time (each call's own: a graph of 20 copies
  of it, timed with CUDA events, per copy).
* ``split`` (CUDA only): at 128 × 128, 4096 × 128 and 8192 × 1024, an eager ``functional.advantages``
  call (and the same call with every launch through Triton's JIT by keyword, ``host.DIRECT = False``)
  beside its Triton launch alone (the kernel's JIT call with the arguments one call passes; and the
  plan's compiled kernel called with them, as the call's later launches go),
  the call with that launch replaced by nothing (rollbuf's own host code), the least a call that
  checks its inputs could cost (:func:`floor_call`), and rl-triton's ``compute_gae`` beside its
  kernel's launch alone; and a 1000-iteration Python loop (the host's speed).
* ``replay``: a graph of one ``functional.advantages`` call at 4096 × 128 and a graph of one
  1-element torch kernel, replayed back to back (wall per replay), and the eager call beside them.

``--dry-run``: CPU tensors on the ``torch`` backend, two tiny shapes, no CUDA graph (the graph and
replay rows are eager calls timed the same way, marked ``dry-run``); checks the script's logic
where no GPU is (``tests/test_bench.py``). Provenance (device, torch, triton, commit, the hash of the
package's sources) goes in every row and in the header of the table.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the benchmarks package is imported from the root
    sys.path.insert(0, str(ROOT))
FALLBACK_SHAPES = ([(n, t) for n in (128, 512, 2048, 8192) for t in (128, 512, 2048)]
                   + [(32768, 8), (1, 1 << 20)])
DRY_SHAPES = [(16, 8), (4, 32)]
REPEATS = 7


# ---- provenance ------------------------------------------------------------------------------


def provenance(device: str) -> dict:
    """Device, torch, triton, commit (``ROLLBUF_COMMIT`` overrides git), date, and the sha1 of the
    package's sources (``rollbuf/**/*.py``: names the code measured where no git is)."""
    from benchmarks.suite import provenance as prov

    h = hashlib.sha1()
    for p in sorted((ROOT / "rollbuf").rglob("*.py")):
        h.update(str(p.relative_to(ROOT)).encode())
        h.update(p.read_bytes())
    out = prov(device)
    out["sources"] = h.hexdigest()[:12]
    return out


# ---- inputs --------------------------------------------------------------------------------


def inputs(N, T, device, seed=0) -> dict:
    """fp32 rewards and values, bool terminations at 2%, ``[N]`` window-end values; for the graph
    part also 1% truncations, ``[N, T]`` bootstrap values, log-probabilities, Q-values, features."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=g)

    f = dict(rewards=randn(N, T), values=randn(N, T),
             terminated=torch.rand(N, T, device=device, generator=g) < 0.02, last=randn(N))
    return f


def graph_inputs(N, T, device, seed=1) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=g)

    k = torch.rand(N, T, device=device, generator=g) < 0.02
    tr = (torch.rand(N, T, device=device, generator=g) < 0.01) & ~k
    lp = 0.3 * randn(N, T)
    return dict(rewards=randn(N, T), values=randn(N, T), terminated=k, truncated=tr,
                bootstrap_values=randn(N, T), log_probs=lp, target_log_probs=lp + 0.1 * randn(N, T),
                q_values=randn(N, T), x=randn(N, T, 2))


def rollout_of(f):
    """A ``Rollout`` of ``inputs``: the window-end values in its per-step ``bootstrap_values`` at the
    last step, as ``Rollout.bootstrap`` writes them."""
    from rollbuf import Rollout

    bv = torch.full_like(f["values"], float("nan"))
    bv[:, -1] = f["last"]
    return Rollout(rewards=f["rewards"], values=f["values"], terminated=f["terminated"], bootstrap_values=bv,
                   batch_size=list(f["rewards"].shape))


def eager_calls(f, backend, rl_triton=None) -> dict:
    """The calls of the eager part on inputs ``f``: name -> zero-argument function."""
    from rollbuf import functional as F

    kw = dict(rewards=f["rewards"], values=f["values"], terminated=f["terminated"], bootstrap_values=f["last"])
    ro = rollout_of(f)
    calls = {
        "functional.advantages": lambda: F.advantages(0.99, 0.95, **kw, backend=backend),
        "functional.gae": lambda: F.gae(0.99, 0.95, **kw, backend=backend),
        "Rollout.advantages": lambda: ro.advantages(0.99, 0.95, backend=backend),
    }
    if rl_triton is not None:
        tf = f["terminated"].float()
        calls["rl_triton.compute_gae"] = lambda: rl_triton.compute_gae(
            f["rewards"], f["values"], tf, gamma=0.99, lambda_=0.95, last_value=f["last"])
    return calls


def graph_calls(f, backend) -> dict:
    """The nine estimator calls of the graph part: name -> zero-argument function."""
    from rollbuf import functional as F

    b = dict(rewards=f["rewards"], values=f["values"], terminated=f["terminated"], truncated=f["truncated"],
             bootstrap_values=f["bootstrap_values"], backend=backend)
    flags = dict(terminated=f["terminated"], truncated=f["truncated"], backend=backend)
    pol = dict(b, log_probs=f["log_probs"])
    return {
        "gae": lambda: F.gae(0.99, 0.95, **b),
        "advantages": lambda: F.advantages(0.99, 0.95, **b),
        "lambda_returns": lambda: F.lambda_returns(0.99, 0.8, **b),
        "discounted_returns": lambda: F.discounted_returns(0.99, **b),
        "monte_carlo_returns": lambda: F.discounted_returns(0.99, bootstrap=False, **b),
        "vtrace": lambda: F.vtrace(f["target_log_probs"], 0.99, **pol),
        "retrace": lambda: F.retrace(f["q_values"], f["target_log_probs"], 0.99, lam=0.9, **pol),
        "eligibility_traces": lambda: F.eligibility_traces(f["x"], 0.99, 0.9, **flags),
        "episodic_sums": lambda: F.episodic_sums(rewards=f["rewards"], **flags),
    }


# ---- clocks --------------------------------------------------------------------------------


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def back_to_back(fn, device, calls) -> tuple[float, float]:
    """``(wall µs, host µs)`` per call, medians of ``REPEATS`` runs of ``calls`` calls back to back:
    wall to the sync after them, host to the return of the last call."""
    walls, hosts = [], []
    for _ in range(REPEATS):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        sync(device)
        t2 = time.perf_counter()
        walls.append((t2 - t0) / calls * 1e6)
        hosts.append((t1 - t0) / calls * 1e6)
    return statistics.median(walls), statistics.median(hosts)


def n_calls(fn, device, most) -> int:
    """How many calls one measurement takes: ``most``, fewer where a call is long (≈ 20 ms a run)."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    sync(device)
    per = (time.perf_counter() - t0) / 3
    return max(5, min(most, int(0.02 / max(per, 1e-7))))


def capture(fn, copies=1):
    """A CUDA graph of ``copies`` calls of ``fn`` (warmed up on a side stream first)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(copies):
            fn()
    return g


def device_us(fn, copies=20) -> float:
    """Device time of one call of ``fn``: a graph of ``copies`` calls, replayed between CUDA events
    (median of ``REPEATS`` replays after one warm-up replay), per copy."""
    g = capture(fn, copies)
    g.replay()
    times = []
    for _ in range(REPEATS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / copies)
    return statistics.median(times)


# ---- the parts -------------------------------------------------------------------------------


def eager_part(rows, shapes, device, backend, most, deadline, rl_triton):
    for N, T in shapes:
        if time.time() > deadline:
            rows.append(dict(part="eager", call="(budget spent: shapes left out)", n=N, t=T))
            break
        f = inputs(N, T, device)
        for name, fn in eager_calls(f, backend, rl_triton).items():
            fn()  # compiles the kernel of this specialisation (first call of it)
            k = n_calls(fn, device, most)
            wall, host = back_to_back(fn, device, k)
            rows.append(dict(part="eager", call=name, n=N, t=T, calls=k, wall_us=wall, host_us=host))
        del f
        if device == "cuda":
            torch.cuda.empty_cache()


def graph_part(rows, N, T, device, backend, most):
    f = graph_inputs(N, T, device)
    calls = graph_calls(f, backend)
    if device == "cuda":
        dev = {name: device_us(fn) for name, fn in calls.items()}

        def all_calls():
            for fn in calls.values():
                fn()

        g = capture(all_calls)
        wall, host = back_to_back(g.replay, device, most)
        note = ""
    else:  # the dry run: the nine calls eagerly, no graph
        dev = {name: back_to_back(fn, device, 3)[0] for name, fn in calls.items()}
        wall, host = back_to_back(lambda: [fn() for fn in calls.values()], device, 3)
        note = "dry-run: eager calls, no graph"
    n = len(calls)
    for name, us in dev.items():
        rows.append(dict(part="graph", call=f"device time of {name}", n=N, t=T, calls=1, wall_us=us, note=note))
    rows.append(dict(part="graph", call=f"graph of {n} calls: replay per call", n=N, t=T, calls=n,
                     wall_us=wall / n, host_us=host / n, note=note))
    rows.append(dict(part="graph", call=f"graph of {n} calls: device time per call", n=N, t=T, calls=n,
                     wall_us=sum(dev.values()) / n, note=note))


def replay_part(rows, N, T, device, backend, most):
    from rollbuf import functional as F

    f = inputs(N, T, device)
    kw = dict(rewards=f["rewards"], values=f["values"], terminated=f["terminated"], bootstrap_values=f["last"],
              backend=backend)

    def one():
        return F.advantages(0.99, 0.95, **kw)

    tiny = torch.zeros(1, device=device)

    def minimal():
        tiny.add_(1.0)

    eager_wall, eager_host = back_to_back(one, device, most)
    rows.append(dict(part="replay", call="eager functional.advantages", n=N, t=T, calls=most,
                     wall_us=eager_wall, host_us=eager_host))
    if device == "cuda":
        targets = {"graph of one functional.advantages": capture(one).replay,
                   "graph of one 1-element torch kernel": capture(minimal).replay}
        note = ""
    else:
        targets = {"graph of one functional.advantages": one, "graph of one 1-element torch kernel": minimal}
        note = "dry-run: eager calls, no graph"
    for name, fn in targets.items():
        wall, host = back_to_back(fn, device, most)
        rows.append(dict(part="replay", call=name, n=N, t=T, calls=most, wall_us=wall, host_us=host, note=note))


SPLIT_SHAPES = ((128, 128), (4096, 128), (8192, 1024))


def python_loop():
    """The host's speed: a 1000-iteration Python loop (compare hosts by it)."""
    s = 0
    for i in range(1000):
        s += i
    return s


def split_part(rows, device, most, rl_triton, backend="auto"):
    """Where an eager ``functional.advantages`` call's host time goes, against rl-triton's: the
    Triton launch alone (the kernel's JIT call with the keyword arguments one call passes, called
    again and again), the call with that launch replaced by nothing (rollbuf's own host code), and
    rl-triton's ``gae_fused_kernel`` launch alone with the arguments its ``compute_gae`` passes."""
    from rollbuf import functional as F
    from rollbuf.kernels import host

    wall, h = back_to_back(python_loop, "cpu", most)
    rows.append(dict(part="split", call="python: a 1000-iteration loop", n=0, t=0, calls=most, wall_us=wall,
                     host_us=h))
    launch = host.Kernel.__call__
    for N, T in SPLIT_SHAPES:
        f = inputs(N, T, device)
        kw = dict(rewards=f["rewards"], values=f["values"], terminated=f["terminated"], bootstrap_values=f["last"],
                  backend=backend)
        seen = {}

        def keep(self, grid, arguments, dev, seen=seen):
            seen.update(k=self, grid=grid, arguments=dict(arguments))
            return launch(self, grid, arguments, dev)

        def call(kw=kw):
            return F.advantages(0.99, 0.95, **kw)

        host.Kernel.__call__ = keep
        try:
            call()
        finally:
            host.Kernel.__call__ = launch
        k, grid, args = seen["k"], seen["grid"], seen["arguments"]
        def by_keyword(call=call):
            host.DIRECT = False
            try:
                return call()
            finally:
                host.DIRECT = True

        timed = {"functional.advantages": call,
                 "functional.advantages, every launch by keyword": by_keyword,
                 "  rollbuf's Triton launch alone": lambda k=k, g=grid, a=args: k.jit[(g,)](
                     **a, **k.const, num_warps=k.warps)}
        if k.runner is not None:  # the plan's compiled kernel, as its later calls launch it
            timed["  rollbuf's compiled-kernel launch alone"] = lambda k=k, a=args: k.runner[1](
                *[a[n] for n in k.names], *k.tail)
        if rl_triton is not None:
            import triton
            from rl_triton.kernels.gae import gae_fused_kernel

            tf, out, bs = f["terminated"].float(), torch.empty_like(f["rewards"]), triton.next_power_of_2(T)
            timed["rl_triton.compute_gae"] = lambda tf=tf: rl_triton.compute_gae(
                f["rewards"], f["values"], tf, gamma=0.99, lambda_=0.95, last_value=f["last"])
            timed["  rl-triton's Triton launch alone"] = lambda tf=tf, out=out, bs=bs: gae_fused_kernel[(N,)](
                f["rewards"], f["values"], tf, None, out, f["last"], T, f["rewards"].stride(0), gamma=0.99,
                lambda_=0.95, BLOCK_SIZE=bs, num_warps=rl_triton_warps(bs), num_stages=2 if bs >= 2048 else 1,
                HAS_TRUNCATIONS=False, HAS_BOOTSTRAP=True)
        timed["  a minimal checked call (the floor)"] = floor_call(kw)
        for name, fn in timed.items():
            fn()
            wall, h = back_to_back(fn, device, most)
            rows.append(dict(part="split", call=name, n=N, t=T, calls=most, wall_us=wall, host_us=h))
        host.Kernel.__call__ = lambda self, grid, arguments, dev: None
        try:
            wall, h = back_to_back(call, device, most)
        finally:
            host.Kernel.__call__ = launch
        rows.append(dict(part="split", call="  functional.advantages, launch replaced by nothing", n=N, t=T,
                         calls=most, wall_us=wall, host_us=h))


def floor_call(kw):
    """The least an eager call of this design could cost: it checks its inputs, keeps one signature
    cache and launches this kernel by keyword. Each tensor's type, dtype, shape and device is checked,
    γ and λ range-checked, the launch of ``kw``'s call found in a dict under a tuple of the tensors'
    dtypes, shapes and strides, the output allocated, and the same keyword launch made (the package's
    cached launch of that call, found once here). No estimator, boundary rule or backend choice is
    looked at: a bound, not a design."""
    from rollbuf import estimators, validation
    from rollbuf.kernels import host

    names = ("rewards", "values", "terminated", "bootstrap_values")
    floats, flags = (torch.float16, torch.bfloat16, torch.float32, torch.float64), (torch.bool, torch.uint8)
    T_ = torch.Tensor
    cache: dict = {}

    def key(r, v, d, last):
        if type(r) is not T_ or type(v) is not T_ or type(d) is not T_ or type(last) is not T_:
            raise TypeError("rewards, values, terminated and bootstrap_values must be tensors")
        if r.dtype not in floats or v.dtype not in floats or last.dtype not in floats or d.dtype not in flags:
            raise TypeError("a field has the wrong dtype")
        dev = r.device
        if v.device != dev or d.device != dev or last.device != dev:
            raise ValueError("the fields are on different devices")
        return (r.dtype, r.shape, r.stride(), v.dtype, v.stride(), d.dtype, d.stride(), last.dtype, last.stride())

    tensors = tuple(kw[n] for n in names)
    launch = host.launch_for(validation.prepare(estimators.get("advantages"), dict(zip(names, tensors)),
                                                dict(gamma=0.99, lam=0.95)))
    if (launch.conv or len(launch.passes) != 1 or not launch.column or launch.scratch_len or launch.want_carry
            or len(launch.out_slots) != 1 or launch.out_dtype != tensors[0].dtype):
        raise ValueError("the floor call runs a launch that reads its fields as they are, in one pass, "
                         "with no scratch and no carry out, its one output in the rewards' dtype")
    cache[key(*tensors)] = launch
    (kernel,) = launch.passes
    slots = launch.slot_names
    if slots[:3] != names[:3] or any(n is not None and kw.get(n) is not None for n in slots[3:]):
        raise ValueError(f"the floor call passes rewards, values and terminated alone, not {slots}")
    rest = (None,) * (len(slots) - 3)  # the fields this call does not pass (truncated, mask)

    def call(gamma=0.99, lam=0.95, r=tensors[0], v=tensors[1], d=tensors[2], last=tensors[3]):
        if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
            raise ValueError("gamma and lam must be in [0, 1]")
        shape = r.shape
        if v.shape != shape or d.shape != shape or last.shape != shape[:-1]:
            raise ValueError("shapes differ")
        hit = cache[key(r, v, d, last)]
        out = torch.empty_like(r)
        outputs = [None] * hit.n_slots
        outputs[hit.out_slots[0]] = out
        arguments = dict(fields=(r, v, d, *rest), outputs=tuple(outputs), carries=(last, None, None), sizes=hit.sizes,
                         gamma=gamma, lam=lam)
        kernel(hit.grid, arguments, hit.dev_index)
        return out

    return call


def rl_triton_warps(block):
    """rl-triton's ``compute_gae`` warps for a row block (its ``_WARPS`` table, 16 beyond it)."""
    from rl_triton.ops import gae

    return gae._WARPS.get(block, 16)


# ---- output --------------------------------------------------------------------------------

COLUMNS = ["part", "call", "n", "t", "calls", "wall_us", "host_us", "note"]


def write(rows, prov, out):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "host_path.csv")
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS + list(prov))
        w.writeheader()
        for r in rows:
            w.writerow({**{k: (f"{r[k]:.3f}" if isinstance(r.get(k), float) else r.get(k, "")) for k in COLUMNS},
                        **prov})
    return path


def table(rows, prov) -> str:
    """The short table: per shape the eager calls' wall µs (host µs), then the graph and replay rows."""
    lines = [" ".join(f"{k}={v}" for k, v in prov.items()), ""]
    eager = [r for r in rows if r["part"] == "eager" and "wall_us" in r]
    names = list(dict.fromkeys(r["call"] for r in eager))
    if eager:
        lines.append("eager, back to back: wall µs per call (host µs)")
        lines.append("| N × T | " + " | ".join(names) + " |")
        lines.append("|---" * (len(names) + 1) + "|")
        by = {(r["n"], r["t"], r["call"]): r for r in eager}
        for n, t in dict.fromkeys((r["n"], r["t"]) for r in eager):
            cells = []
            for c in names:
                r = by.get((n, t, c))
                cells.append("–" if r is None else f"{r['wall_us']:.1f} ({r['host_us']:.1f})")
            lines.append(f"| {n} × {t} | " + " | ".join(cells) + " |")
        lines.append("")
    split = [r for r in rows if r["part"] == "split"]
    if split:
        lines.append("split: µs per call, back to back (host µs: until the calls returned)")
        for r in split:
            shape = "" if not r["n"] else f"{r['n']} × {r['t']}"
            lines.append(f"  {shape:12s} {r['call']:52s} {r['wall_us']:9.2f} (host {r['host_us']:.1f})")
        lines.append("")
    for part in ("graph", "replay"):
        sel = [r for r in rows if r["part"] == part and not r["call"].startswith("device time of ")]
        if sel:
            lines.append(f"{part} ({sel[0]['n']} × {sel[0]['t']}): wall µs per call or replay")
            for r in sel:
                host = f" (host {r['host_us']:.1f})" if "host_us" in r else ""
                note = f"  [{r['note']}]" if r.get("note") else ""
                lines.append(f"  {r['call']:48s} {r['wall_us']:9.2f}{host}{note}")
            lines.append("")
    left = [r for r in rows if r.get("call", "").startswith("(budget")]
    if left:
        lines.append(f"budget spent: shapes from {left[0]['n']} × {left[0]['t']} on were left out")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks host-path", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out"),
                    help="directory for host_path.csv (default: $OUT, else out)")
    ap.add_argument("--dry-run", action="store_true", help="CPU tensors, torch backend, tiny shapes, no graphs")
    ap.add_argument("--calls", type=int, default=500, help="calls per measurement at most (default: 500)")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="stop the eager grid after this many seconds (default: 150; the whole run stays under "
                         "4 minutes)")
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.dry_run:
        device, backend, shapes, most, gshape = "cpu", "torch", DRY_SHAPES, min(args.calls, 20), (8, 16)
        rl_triton = None
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --dry-run for the CPU plumbing", file=sys.stderr)
            return 2
        device, backend, most, gshape = "cuda", "auto", args.calls, (4096, 128)
        try:
            from benchmarks.cases import PEER_SHAPES

            shapes = list(dict.fromkeys(PEER_SHAPES[:40]))  # rl-triton's grid: 39 distinct shapes
        except ImportError:  # (the package not importable: the fallback grid)
            shapes = FALLBACK_SHAPES
        try:
            import rl_triton
        except ImportError:
            rl_triton = None
    prov = provenance(device)
    rows: list[dict] = []
    eager_part(rows, shapes, device, backend, most, t0 + args.budget_s, rl_triton)
    graph_part(rows, *gshape, device, backend, most)
    replay_part(rows, *gshape, device, backend, most)
    if device == "cuda":
        split_part(rows, device, most, rl_triton, backend)
    path = write(rows, prov, args.out)
    print(f"wrote {path} ({len(rows)} rows, {time.time() - t0:.0f} s; rl_triton "
          f"{'compared' if rl_triton is not None else 'not importable'})\n")
    print(table(rows, prov))
    return 0


if __name__ == "__main__":
    sys.exit(main())
