"""``python -m rollbuf.bench.cpu --out DIR``: GAE on the CPU against the loops users run today.

    python -m rollbuf.bench.cpu --out bench-cpu                 # the grid, ~10-20 min on 2 cores
    python -m rollbuf.bench.cpu --out bench-cpu --quick         # a few shapes, seconds
    python -m rollbuf.bench.cpu --out bench-cpu --shapes 4x128,8x32768 --threads 1

The grid is N ∈ {1, 4, 8, 64, 256, 1024} rows × T ∈ {8, 128, 256, 2048, 32768} steps (it holds every
shape of the table SB3/CleanRL users run: 4, 8, 64 and 1024 envs × 128 steps, 256 × 256, 8 × 2048,
8 × 32768), float32, 2% terminations, no truncation, the window end bootstrapped from ``V(s_T)``
(one value per row), as an on-policy trainer calls GAE. Every implementation computes advantages
and returns from the same numbers, in its own layout:

* ``rollbuf-numba``: ``rollbuf.functional.gae(..., backend="numba")``, the full call (validation
  included) on ``[N, T]`` tensors; ``rollbuf-numba-tm``: the same call on time-major ``[T, N]``
  buffers passed as their transposed views (read in place); ``rollbuf-numba-run``: the compiled
  backend's ``run`` on a prepared problem (no validation: what a lean dispatch costs on top of it);
* ``rollbuf-torch``: the same full call with ``backend="torch"`` (the vectorised scan);
* ``plain-numba``: a 12-line ``@njit`` loop over rows then time written for this GAE alone, tensors
  in and out (``.numpy()`` / ``torch.from_numpy``), outputs allocated inside;
* ``sb3``: Stable-Baselines3's ``RolloutBuffer.compute_returns_and_advantage`` (the installed
  package, or a copy of its numpy loop when it is not installed), ``[T, N]`` float32 buffers;
* ``cleanrl``: CleanRL's ``ppo.py`` GAE loop on ``[T, N]`` torch tensors;
* ``torchrl-vec``: TorchRL's ``vec_generalized_advantage_estimate`` (``[N, T, 1]``), when TorchRL is
  installed.

Before it is timed, each implementation's advantages and returns are checked against float64 (the
sequential ``reference`` loop up to 2^15 elements, else the float64 ``torch`` backend) on the first
8 rows; a mismatch is recorded and the implementation is not timed. Timing: one warm-up call (also
the first call's time), then single calls until ``--budget-s`` seconds or 200 calls (at least 5),
garbage collection off; the median is reported with the 25th and 75th percentiles. A call predicted
to exceed ``--max-call-s`` (from the same implementation at the next shorter ``T``) is skipped.

``--first-call`` (default on) also times, each in a fresh process, the import of numba and the
first call of each estimator family with an empty numba cache (the compile) and again with the
cache that run left (``cache=True``).

Writes ``cpu.csv`` (one row per case, with provenance) and ``cpu.md`` (the tables) under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

GRID_N = (1, 4, 8, 64, 256, 1024)
GRID_T = (8, 128, 256, 2048, 32768)
TABLE_SHAPES = ((4, 128), (8, 128), (64, 128), (1024, 128), (256, 256), (8, 2048), (8, 32768))
QUICK_SHAPES = ((1, 8), (4, 128), (64, 128), (8, 2048))
GAMMA, LAM = 0.99, 0.95
P_TERMINATED = 0.02
IMPLS = ("rollbuf-numba", "rollbuf-numba-tm", "rollbuf-numba-run", "rollbuf-torch", "plain-numba", "sb3",
         "cleanrl", "torchrl-vec")
COLUMNS = ["kind", "estimator", "n", "t", "dtype", "layout", "impl", "status", "rel_err", "call_us", "p25_us",
           "p75_us", "calls", "first_call_us", "note", "cpu", "cores", "threads", "python", "torch", "numba",
           "numpy", "sb3", "torchrl", "commit", "date", "load_1min"]


class Unsupported(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# the implementations: prepare(data) -> call() -> (advantages, returns), each in its own layout
# ---------------------------------------------------------------------------------------------


def make_data(N, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(N, T, generator=g)
    v = torch.randn(N, T, generator=g)
    k = torch.rand(N, T, generator=g) < P_TERMINATED
    last = torch.randn(N, generator=g)  # V(s_T) of each row
    return dict(rewards=r, values=v, terminated=k, last_values=last)


def _rollbuf(backend, time_major=False):
    def prepare(d):
        from rollbuf import functional as F

        r, v, k = d["rewards"], d["values"], d["terminated"]
        if time_major:  # the trainer's [T, N] buffers, seen as [N, T]
            r, v, k = (x.mT.contiguous().mT for x in (r, v, k))
        last = d["last_values"]

        def call():
            res = F.gae(GAMMA, LAM, rewards=r, values=v, terminated=k, bootstrap_values=last, backend=backend)
            return res.advantages, res.returns

        return call

    return prepare


def _rollbuf_run(d):
    from rollbuf import estimators, validation
    from rollbuf.backends import compiled_cpu

    p = validation.prepare(estimators.get("gae"), dict(rewards=d["rewards"], values=d["values"],
                                                       terminated=d["terminated"], bootstrap_values=d["last_values"]),
                           dict(gamma=GAMMA, lam=LAM))

    def call():
        return compiled_cpu.run(p)[0]

    return call


def _plain_gae(r, v, k, last, gamma, lam):
    N, T = r.shape
    adv = np.empty_like(r)
    ret = np.empty_like(r)
    for n in range(N):
        a, nv = 0.0, last[n]
        for t in range(T - 1, -1, -1):
            nt = 0.0 if k[n, t] else 1.0
            a = r[n, t] + gamma * nt * nv - v[n, t] + gamma * lam * nt * a
            adv[n, t] = a
            ret[n, t] = a + v[n, t]
            nv = v[n, t]
    return adv, ret


_PLAIN = []


def _plain_kernel():
    if not _PLAIN:
        from numba import njit

        _PLAIN.append(njit(cache=True)(_plain_gae))
    return _PLAIN[0]


def _plain(d):
    kernel = _plain_kernel()
    r, v, k, last = d["rewards"], d["values"], d["terminated"], d["last_values"]

    def call():
        adv, ret = kernel(r.numpy(), v.numpy(), k.numpy(), last.numpy(), GAMMA, LAM)
        return torch.from_numpy(adv), torch.from_numpy(ret)

    return call


def _sb3_inputs(d):
    """SB3's buffers: ``[T, N]`` float32, ``episode_starts[t] = done[t − 1]``."""
    k = d["terminated"].numpy()
    starts = np.zeros(k.shape[::-1], dtype=np.float32)
    starts[1:] = k.T[:-1]
    return (np.ascontiguousarray(d["rewards"].numpy().T), np.ascontiguousarray(d["values"].numpy().T), starts,
            d["last_values"].clone(), k[:, -1].copy())


class _SB3Copy:
    """Stable-Baselines3 2.x ``RolloutBuffer.compute_returns_and_advantage``, its numpy loop as written."""

    def __init__(self, rewards, values, episode_starts, gamma, gae_lambda):
        self.rewards, self.values, self.episode_starts = rewards, values, episode_starts
        self.buffer_size = rewards.shape[0]
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.advantages = np.zeros_like(rewards)

    def compute_returns_and_advantage(self, last_values, dones):
        last_values = last_values.clone().cpu().numpy().flatten()
        last_gae_lam = 0
        for step in reversed(range(self.buffer_size)):
            if step == self.buffer_size - 1:
                next_non_terminal = 1.0 - dones.astype(np.float32)
                next_values = last_values
            else:
                next_non_terminal = 1.0 - self.episode_starts[step + 1]
                next_values = self.values[step + 1]
            delta = self.rewards[step] + self.gamma * next_values * next_non_terminal - self.values[step]
            last_gae_lam = delta + self.gamma * self.gae_lambda * next_non_terminal * last_gae_lam
            self.advantages[step] = last_gae_lam
        self.returns = self.advantages + self.values


def _sb3_buffer(rewards, values, starts):
    try:
        import gymnasium as gym
        from stable_baselines3.common.buffers import RolloutBuffer
    except Exception:
        return _SB3Copy(rewards, values, starts, GAMMA, LAM)
    T, N = rewards.shape
    buf = RolloutBuffer(T, gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), device="cpu", gae_lambda=LAM,
                        gamma=GAMMA, n_envs=N)
    buf.rewards, buf.values, buf.episode_starts = rewards, values, starts
    return buf


def _sb3(d):
    rewards, values, starts, last, dones = _sb3_inputs(d)
    buf = _sb3_buffer(rewards, values, starts)

    def call():
        buf.compute_returns_and_advantage(last_values=last, dones=dones)
        return torch.from_numpy(buf.advantages.T), torch.from_numpy(buf.returns.T)

    return call


def _cleanrl(d):
    """CleanRL ``ppo.py``: ``[T, N]`` tensors, ``dones[t]`` = done before step t, ``next_done``."""
    rewards, values, starts, last, dones = _sb3_inputs(d)
    rewards, values, starts = (torch.from_numpy(x) for x in (rewards, values, starts))
    next_value = last.reshape(1, -1)
    next_done = torch.from_numpy(dones.astype(np.float32))
    num_steps = rewards.shape[0]

    def call():
        with torch.no_grad():
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - starts[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + GAMMA * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + GAMMA * LAM * nextnonterminal * lastgaelam
            returns = advantages + values
        return advantages.T, returns.T

    return call


def _torchrl(d):
    try:
        from torchrl.objectives.value.functional import vec_generalized_advantage_estimate
    except Exception as e:
        raise Unsupported(f"torchrl not importable ({type(e).__name__})") from None
    r, v, k, last = d["rewards"], d["values"], d["terminated"], d["last_values"]
    nxt = torch.cat([v[:, 1:], last[:, None]], 1)  # next_state_value, as a TensorDict holds it
    u = [x.unsqueeze(-1) for x in (r, v, nxt, k)]

    def call():
        adv, ret = vec_generalized_advantage_estimate(GAMMA, LAM, u[1], u[2], u[0], done=u[3], terminated=u[3],
                                                      time_dim=-2)
        return adv.squeeze(-1), ret.squeeze(-1)

    return call


PREPARE = {
    "rollbuf-numba": _rollbuf("numba"),
    "rollbuf-numba-tm": _rollbuf("numba", time_major=True),
    "rollbuf-numba-run": _rollbuf_run,
    "rollbuf-torch": _rollbuf("torch"),
    "plain-numba": _plain,
    "sb3": _sb3,
    "cleanrl": _cleanrl,
    "torchrl-vec": _torchrl,
}
LAYOUT = {"rollbuf-numba-tm": "[T,N] view", "sb3": "[T,N]", "cleanrl": "[T,N]", "torchrl-vec": "[N,T,1]"}


# ---------------------------------------------------------------------------------------------
# gate and timing
# ---------------------------------------------------------------------------------------------


def expected(d, rows=8):
    """float64 advantages and returns of the first ``rows`` rows."""
    from rollbuf import functional as F

    sub = {k: v[:rows].double() if v.is_floating_point() else v[:rows] for k, v in d.items()}
    n, t = sub["rewards"].shape
    res = F.gae(GAMMA, LAM, rewards=sub["rewards"], values=sub["values"], terminated=sub["terminated"],
                bootstrap_values=sub["last_values"], backend="reference" if n * t <= 1 << 15 else "torch")
    return res.advantages, res.returns


def rel_err(outs, exp, rows=8):
    err = 0.0
    for a, e in zip(outs, exp):
        a = a[:rows].double()
        err = max(err, float((a - e).norm() / e.norm().clamp_min(1e-30)))
    return err


def time_calls(call, budget_s, max_calls=200, min_calls=5):
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


# ---------------------------------------------------------------------------------------------
# provenance
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# first calls, each in a fresh process
# ---------------------------------------------------------------------------------------------

_FIRST_CALL = r"""
import json, sys, time
import torch
t0 = time.perf_counter(); import numba; t_numba = time.perf_counter() - t0
from rollbuf import functional as F
from rollbuf.testing import make_rollout, run_estimator
f = make_rollout(4, 128, seed=0, p_terminated=0.02, p_truncated=0.02)
out = {"import numba": t_numba}
for name, params in json.loads(sys.argv[1]):
    t0 = time.perf_counter(); run_estimator(name, f, backend="numba", **params)
    out[name] = time.perf_counter() - t0
t0 = time.perf_counter(); F.affine_scan(torch.randn(4, 128), torch.rand(4, 128), backend="numba")
out["affine_scan"] = time.perf_counter() - t0
print(json.dumps(out))
"""
FIRST_CALL_ESTIMATORS = [("gae", dict(gamma=GAMMA, lam=LAM)), ("lambda_returns", dict(gamma=GAMMA, lam=LAM)),
                         ("vtrace", dict(gamma=GAMMA)), ("retrace", dict(gamma=GAMMA)),
                         ("eligibility_traces", dict(gamma=GAMMA, lam=LAM))]


def first_calls():
    """``{"cold": {...}, "cached": {...}}``: seconds of each first call, with an empty numba cache
    directory, then again in a new process with the cache the first one wrote."""
    res = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold", "cached"):
            out = subprocess.run([sys.executable, "-c", _FIRST_CALL, json.dumps(FIRST_CALL_ESTIMATORS)], env=env,
                                 capture_output=True, text=True, check=True)
            res[label] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------


def run_grid(shapes, impls, budget_s, max_call_s, log=print):
    prov = provenance()
    rows = []
    last_time = {}  # (impl, N) -> (T, seconds per call) at the previous T
    for N, T in shapes:
        d = make_data(N, T)
        exp = expected(d)
        for impl in impls:
            row = dict(kind="steady", estimator="gae", n=N, t=T, dtype="float32", layout=LAYOUT.get(impl, "[N,T]"),
                       impl=impl, status="ok", rel_err="", call_us="", p25_us="", p75_us="", calls="",
                       first_call_us="", note="", **prov, load_1min=_load())
            prev = last_time.get((impl, N))
            if prev is not None and prev[1] * T / prev[0] > max_call_s:
                row.update(status="skipped", note=f"predicted {prev[1] * T / prev[0]:.0f} s per call "
                                                  f"(linear from T={prev[0]})")
                rows.append(row)
                log(f"{N}x{T} {impl}: skipped")
                continue
            try:
                call = PREPARE[impl](d)
                t0 = time.perf_counter()
                outs = call()
                first = time.perf_counter() - t0
                err = rel_err(outs, exp)
                row.update(rel_err=f"{err:.2e}", first_call_us=f"{first * 1e6:.1f}")
                if not err < 1e-4:
                    row.update(status="wrong", note="differs from float64 on the first rows")
                else:
                    med, p25, p75, n_calls = time_calls(call, budget_s)
                    row.update(call_us=f"{med:.2f}", p25_us=f"{p25:.2f}", p75_us=f"{p75:.2f}", calls=n_calls)
                    last_time[(impl, N)] = (T, med * 1e-6)
            except Unsupported as e:
                row.update(status="unsupported", note=str(e))
            rows.append(row)
            log(f"{N}x{T} {impl}: {row['status']} {row['call_us']} us (err {row['rel_err']})")
        del d
    return rows


def first_call_rows(res, prov):
    rows = []
    for label, times in res.items():
        for name, s in times.items():
            rows.append(dict(kind=f"first_call_{label}", estimator=name, n=4, t=128, dtype="float32", layout="[N,T]",
                             impl="rollbuf-numba" if name != "import numba" else "numba", status="ok",
                             rel_err="", call_us=f"{s * 1e6:.0f}", p25_us="", p75_us="", calls=1, first_call_us="",
                             note="fresh process, " + ("empty numba cache" if label == "cold" else
                                                       "numba cache from the cold run"),
                             **prov, load_1min=_load()))
    return rows


def _fmt_ms(us):
    return f"{float(us) / 1e3:.3f}" if us not in ("", None) else "—"


def markdown(rows):
    steady = [r for r in rows if r["kind"] == "steady"]
    by = {(r["n"], r["t"], r["impl"]): r for r in steady}
    shapes = sorted({(r["n"], r["t"]) for r in steady})
    impls = [i for i in IMPLS if any(r["impl"] == i for r in steady)]
    prov = steady[0] if steady else rows[0]
    lines = [f"Machine: {prov['cpu']}, {prov['cores']} cores, {prov['threads']} torch threads; Python {prov['python']}, "
             f"torch {prov['torch']}, numba {prov['numba']}, numpy {prov['numpy']}, stable-baselines3 "
             f"{prov['sb3'] or '(not installed: the copy of its loop)'}, torchrl {prov['torchrl'] or '(not installed)'}; "
             f"rollbuf at {prov['commit']}; {prov['date']}.", "",
             "Median ms of one full call (advantages and returns from the inputs), float32, 2% terminations, "
             "window end bootstrapped; `—`: not run (see the CSV's status).", "",
             "| N×T | " + " | ".join(impls) + " |", "|---|" + "---|" * len(impls)]
    for N, T in shapes:
        cells = []
        for i in impls:
            r = by.get((N, T, i))
            cells.append(_fmt_ms(r["call_us"]) if r and r["status"] == "ok" else "—")
        lines.append(f"| {N}×{T} | " + " | ".join(cells) + " |")
    lines += ["", "Targets, as measured (`rollbuf-numba`, the full call):", "",
              "| N×T | vs fastest of SB3, CleanRL, TorchRL | vs plain numba loop | `run` alone vs plain loop |",
              "|---|---|---|---|"]
    for N, T in shapes:
        ours = by.get((N, T, "rollbuf-numba"))
        if not ours or ours["status"] != "ok":
            continue
        t_ours = float(ours["call_us"])
        others = [float(by[(N, T, i)]["call_us"]) for i in ("sb3", "cleanrl", "torchrl-vec")
                  if (N, T, i) in by and by[(N, T, i)]["status"] == "ok"]
        plain = by.get((N, T, "plain-numba"))
        run_ = by.get((N, T, "rollbuf-numba-run"))
        c1 = f"{min(others) / t_ours:.1f}× faster" if others else "—"
        c2 = f"{t_ours / float(plain['call_us']):.2f}× its time" if plain and plain["status"] == "ok" else "—"
        c3 = (f"{float(run_['call_us']) / float(plain['call_us']):.2f}× its time"
              if run_ and plain and run_["status"] == "ok" and plain["status"] == "ok" else "—")
        lines.append(f"| {N}×{T} | {c1} | {c2} | {c3} |")
    first = [r for r in rows if r["kind"].startswith("first_call")]
    if first:
        names = list(dict.fromkeys(r["estimator"] for r in first))
        lines += ["", "First call in a fresh process (seconds; 4×128, inputs made before the clock starts):", "",
                  "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for label in ("cold", "cached"):
            sel = {r["estimator"]: r for r in first if r["kind"] == f"first_call_{label}"}
            lines.append(f"| {'empty cache (compile)' if label == 'cold' else 'cached (cache=True)'} | "
                         + " | ".join(f"{float(sel[n]['call_us']) / 1e6:.3f}" if n in sel else "—" for n in names)
                         + " |")
    return "\n".join(lines) + "\n"


def parse_shapes(text):
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",") if s]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="four small shapes, short budgets")
    ap.add_argument("--shapes", default=None, help="NxT,NxT,... instead of the grid")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--budget-s", type=float, default=None, help="timing budget per case (default 1.0; quick 0.1)")
    ap.add_argument("--max-call-s", type=float, default=20.0)
    ap.add_argument("--no-first-call", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.shapes:
        shapes = parse_shapes(args.shapes)
    elif args.quick:
        shapes = list(QUICK_SHAPES)
    else:
        shapes = [(n, t) for n in GRID_N for t in GRID_T]
    impls = [i for i in args.impls.split(",") if i]
    for i in impls:
        if i not in PREPARE:
            raise SystemExit(f"unknown impl {i!r}; known: {', '.join(PREPARE)}")
    budget = args.budget_s if args.budget_s is not None else (0.1 if args.quick else 1.0)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    if not args.no_first_call:  # first: before this process has compiled anything
        rows += first_call_rows(first_calls(), provenance())
    rows += run_grid(shapes, impls, budget, args.max_call_s)
    path = os.path.join(args.out, "cpu.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(args.out, "cpu.md"), "w") as f:
        f.write(markdown(rows))
    print(f"wrote {path} and cpu.md")
    return rows


if __name__ == "__main__":
    main()
