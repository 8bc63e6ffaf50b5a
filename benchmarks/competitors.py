"""Every competitor: what users run today, peers' kernels, a naive kernel, rollbuf's backends.

**The scoreboard's competitors** (:data:`COMPETITORS`) share one calling convention:
``fn(name, fields, params) -> tuple of outputs`` (the outputs of ``rollbuf.functional.<name>``, in
order; ``None`` for an output it does not write, which the gate then does not compare). It raises
:class:`Unsupported` for an estimator, dtype or boundary mix it does not offer; whether what it
*does* compute is right is decided by the correctness gate, not here: the loops are written the way
trainers commonly write them (:mod:`benchmarks.oracles`, part 2).

* ``rollbuf-triton``, ``rollbuf-numba``, ``rollbuf-torch``: ``rollbuf.functional.<name>(...)`` on
  that backend, its arguments gathered once;
* ``loop``: CleanRL/SB3's GAE loop over time in torch (eager); ``loop-compiled``: the same loop
  under ``torch.compile``; ``doubling-compiled``: a doubling scan under ``torch.compile`` (what a
  user writes to vectorise it); ``torchrl``: TorchRL's functional GAE;
* ``rl-triton``, ``pufferlib``: the peers (below); ``naive-triton``: the simplest Triton kernel for
  GAE, the whole row in one block, at its fastest tiling per shape: a baseline for rollbuf's kernel.

Optional attributes of a competitor:

* ``prepare(name, fields, params) -> call``: the untimed part (inputs turned into the competitor's
  own convention, as its users' buffers already are: float flags, shifted arrays, preallocated
  outputs); ``call()`` is what is timed and returns the outputs;
* ``graph = False``: launch-bound (the eager loop): no CUDA-graph device time, full call only;
* ``gate = False``: a different convention, so its numbers cannot be compared with the oracle's:
  timed, reported ``unchecked``, never ``ok``;
* ``cuda_only = True``: left out of the default list on a machine without a GPU;
* ``cpu_only = True``: runs CPU tensors only (``rollbuf-numba``), left out of the default list on a
  machine with a GPU, where every case's tensors are CUDA tensors;
* ``peer``: a label; its rows get a case-by-case table in ``scoreboard.md``.

**Peers** (rl-triton 0.1.3's Triton kernels, PufferLib 3.0's CUDA advantage kernel) are not
dependencies: they are imported from the git-ignored folder ``.peers/`` of the checkout (or
``$ROLLBUF_PEERS``), filled once by ``python -m benchmarks fetch-peers DIR`` (copies
``DIR/rl-triton-*`` and ``DIR/pufferlib-*``); an installed ``rl_triton`` is used as well. Absent,
they are reported ``unsupported`` with the reason.

**The CPU table's implementations** (:data:`CPU_GAE`, GAE only, each in its own layout) are at the
end of the module.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchmarks.oracles import gae_doubling, gae_loop
from rollbuf.estimators import REGISTRY
from rollbuf.testing import estimator_call


class Unsupported(Exception):
    """The competitor does not offer this estimator, dtype or boundary mix."""


def _tuple(x):
    return tuple(x) if isinstance(x, tuple) else (x,)


def bind(fn: Callable, name: str, fields: dict, params: dict) -> Callable:
    """The zero-argument call of competitor ``fn`` on this case (its untimed preparation done)."""
    prepare = getattr(fn, "prepare", None)
    if prepare is not None:
        return prepare(name, fields, params)
    return lambda: fn(name, fields, params)


def rollbuf_backend(backend: str, max_gpu_elements: int | None = None) -> Callable:
    def prepare(name, f, params):
        """The user's call ``rollbuf.functional.<name>(...)``, its arguments gathered once (untimed)."""
        r = f["rewards"]
        if max_gpu_elements is not None and r.is_cuda and r.numel() > max_gpu_elements:
            raise Unsupported(f"more than {max_gpu_elements} elements on the GPU (the CPU path; timed smaller)")
        return estimator_call(name, f, backend=backend, **params)

    def fn(name, f, params):
        return _tuple(prepare(name, f, params)())

    fn.__name__ = f"rollbuf_{backend}"
    fn.prepare = prepare
    return fn


def _window_end_value(f) -> torch.Tensor:
    """``[*B, 1]``: each row's window-end bootstrap value (from a ``[*B, T]`` or ``[*B]`` field)."""
    bv = f["bootstrap_values"]
    return bv[..., -1:] if bv.dim() == f["rewards"].dim() else bv.unsqueeze(-1)


def _successor(f):
    """V'_t as a trainer builds it: next value, bootstrap at truncations and the window end."""
    v = f["values"]
    nxt = torch.cat([v[..., 1:], _window_end_value(f).to(v.dtype)], dim=-1)
    if f.get("truncated") is not None:
        nxt = torch.where(f["truncated"], torch.nan_to_num(f["bootstrap_values"]), nxt)
    return nxt


def _flags(f):
    z = torch.zeros_like(f["rewards"], dtype=torch.bool)
    k = f.get("terminated")
    tr = f.get("truncated")
    k = z if k is None else k.bool()
    tr = z if tr is None else tr.bool()
    return k, tr


def _gae_impl(impl, max_t=None):
    def fn(name, f, params):
        if max_t is not None and f["rewards"].is_cuda and f["rewards"].shape[-1] > max_t:
            raise Unsupported(f"T > {max_t} on the GPU: seconds per call, one launch per op per step")
        if name not in ("gae", "advantages"):
            raise Unsupported(name)
        if f.get("mask") is not None:
            raise Unsupported("masks")
        k, tr = _flags(f)
        adv, ret = impl(f["rewards"], f["values"], _successor(f), k, tr, params["gamma"], params["lam"])
        return (adv, ret) if name == "gae" else (adv,)

    return fn


@functools.cache
def _compiled(impl):
    # one graph per T (the doubling passes depend on it) and dtype: allow the recompiles
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 256))
    return torch.compile(impl, dynamic=False)


def compiled(impl, max_t=None):
    def fn(name, f, params):
        if max_t is not None and f["rewards"].shape[-1] > max_t:
            raise Unsupported(f"T > {max_t}: compiling the loop unrolls every step")
        return _gae_impl(_compiled(impl))(name, f, params)

    return fn


def torchrl_gae(name, f, params):
    """TorchRL's functional GAE (``[*B, T, 1]``, time at dim -2), if TorchRL is installed."""
    try:
        from torchrl.objectives.value.functional import generalized_advantage_estimate
    except Exception as e:  # pragma: no cover - optional dependency
        raise Unsupported(f"torchrl not importable: {e}") from None
    if name not in ("gae", "advantages"):
        raise Unsupported(name)
    if f.get("mask") is not None:
        raise Unsupported("masks")
    k, tr = _flags(f)
    u = lambda x: x.unsqueeze(-1)  # noqa: E731
    adv, ret = generalized_advantage_estimate(params["gamma"], params["lam"], u(f["values"]), u(_successor(f)),
                                              u(f["rewards"]), done=u(k | tr), terminated=u(k), time_dim=-2)
    return (adv.squeeze(-1), ret.squeeze(-1)) if name == "gae" else (adv.squeeze(-1),)


# ------------------------------------------------------------------------------------------ peers


def peers_dir() -> Path:
    """Where the peers' sources are looked up: ``$ROLLBUF_PEERS``, else ``.peers/`` of the checkout."""
    env = os.environ.get("ROLLBUF_PEERS")
    return Path(env) if env else Path(__file__).resolve().parents[1] / ".peers"


PEER_GLOBS = ("rl-triton-*", "pufferlib-*")


def fetch_peers(src, dest=None) -> list[str]:
    """Copy the peers' source folders (``rl-triton-*``, ``pufferlib-*``) from ``src`` into
    ``dest`` (default :func:`peers_dir`); returns the folders copied."""
    src, dest = Path(src), Path(dest) if dest is not None else peers_dir()
    found = [p for g in PEER_GLOBS for p in sorted(src.glob(g)) if p.is_dir()]
    if not found:
        raise FileNotFoundError(f"no {' or '.join(PEER_GLOBS)} folder under {src}")
    dest.mkdir(parents=True, exist_ok=True)
    for p in found:
        shutil.copytree(p, dest / p.name, dirs_exist_ok=True)
    return [p.name for p in found]


_PEERS: dict = {}  # name -> loaded module / op, or the Unsupported explaining why not


def _load(key, loader):
    if key not in _PEERS:
        try:
            _PEERS[key] = loader()
        except Unsupported as e:
            _PEERS[key] = e
        except Exception as e:  # a broken or unbuildable peer is reported, not fatal
            _PEERS[key] = Unsupported(f"{key} failed to load: {type(e).__name__}: {str(e)[:120]}")
    got = _PEERS[key]
    if isinstance(got, Unsupported):
        raise got
    return got


def _rl_triton():
    def load():
        roots = sorted(glob.glob(str(peers_dir() / "rl-triton-*" / "src")))
        if roots and "rl_triton" not in sys.modules:
            sys.path.insert(0, roots[-1])
            try:
                import rl_triton
            finally:
                sys.path.remove(roots[-1])
            return rl_triton
        try:
            import rl_triton
        except ImportError:
            raise Unsupported(f"rl-triton absent: python -m benchmarks fetch-peers DIR "
                              f"(looked for {peers_dir()}/rl-triton-*)") from None
        return rl_triton

    return _load("rl-triton", load)


def _pufferlib_op():
    def load():
        builds = sorted(glob.glob(str(peers_dir() / "pufferlib-*" / "build.py")))
        if not builds:
            raise Unsupported(f"PufferLib absent: python -m benchmarks fetch-peers DIR "
                              f"(looked for {peers_dir()}/pufferlib-*)")
        spec = importlib.util.spec_from_file_location("_rollbuf_peer_pufferlib_build", builds[-1])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        got = mod.load_puff_advantage()  # JIT-compiled with torch's cpp_extension (nvcc) the first time
        return got[0] if isinstance(got, tuple) else got

    return _load("pufferlib", load)


def _f32(f, keys):
    for k in keys:
        x = f.get(k)
        if x is not None and x.dtype != torch.float32:
            raise Unsupported(f"float32 inputs only ({k} is {str(x.dtype).replace('torch.', '')})")
    if f.get("mask") is not None:
        raise Unsupported("masks")


def _boundaries(f):
    """rl-triton's boundary convention: float 0/1 flags, terminated and truncated exclusive
    (terminated wins, as in rollbuf); ``bootstrap_values`` zero except where it is read (truncated
    steps and the window end), or ``last_value`` ``[N]`` when there is no truncated tensor."""
    k = f["terminated"].bool()
    kf = k.float().contiguous()
    if f.get("truncated") is None:
        return kf, None, None, _window_end_value(f)[..., 0].float().contiguous()
    tr = f["truncated"].bool() & ~k
    read = tr.clone()
    read[..., -1] |= ~k[..., -1]
    bv = torch.where(read, torch.nan_to_num(f["bootstrap_values"].float()), 0.0).contiguous()
    return kf, tr.float().contiguous(), bv, None


def _rl_triton_prepare(name, f, params):
    rt = _rl_triton()
    g = params.get("gamma", 0.99)
    T = f["rewards"].shape[-1]
    if f["rewards"].dim() != 2:
        raise Unsupported("[N, T] inputs only")
    if REGISTRY[name].direction == "backward":
        _f32(f, ("rewards", "values", "log_probs", "target_log_probs", "q_values", "bootstrap_values"))
    else:
        _f32(f, ("rewards",))
    r, v = f["rewards"], f["values"]
    if name == "advantages":  # compute_gae writes advantages only
        k, tr, bv, last = _boundaries(f)
        return lambda: (rt.compute_gae(r, v, k, tr, gamma=g, lambda_=params["lam"], bootstrap_values=bv,
                                       last_value=last),)
    if name == "vtrace":
        if params.get("lam", 1.0) != 1.0 or params.get("pg_rho_bar") not in (None, params.get("rho_bar", 1.0)):
            raise Unsupported("V-trace with λ = 1 and ρ̄_pg = ρ̄ only")
        k, tr, bv, last = _boundaries(f)
        lp, tlp = f["log_probs"], f["target_log_probs"]
        return lambda: tuple(rt.compute_vtrace(tlp, lp, v, r, k, tr, gamma=g, rho_bar=params.get("rho_bar", 1.0),
                                               c_bar=params.get("c_bar", 1.0), bootstrap_values=bv,
                                               last_value=last))
    if name in ("lambda_returns", "discounted_returns"):
        k, tr, bv, last = _boundaries(f)
        if bv is None:  # these take no last_value: the window-end column of a [N, T] array
            bv = torch.zeros_like(r)
            bv[:, -1] = last
        # next_values: V(s_{t+1}), zero at truncated steps (their value comes from bootstrap_values),
        # the window-end value in the last column
        nv = torch.cat([v[:, 1:], bv[:, -1:]], dim=-1)
        if tr is not None:
            nv = torch.where(tr.bool(), 0.0, nv)
        nv = nv.contiguous()
        if name == "lambda_returns":
            return lambda: (rt.compute_lambda_returns(r, nv, k, tr, gamma=g, lambda_=params["lam"],
                                                      bootstrap_values=bv),)
        return lambda: (rt.compute_discounted_returns(r, k, tr, gamma=g, bootstrap_values=bv),)
    if name == "monte_carlo_returns":  # no bootstrap at all: a zero carry past the window
        k, tr, _, _ = _boundaries(f)
        return lambda: (rt.compute_discounted_returns(r, k, tr, gamma=g),)
    if name == "retrace":
        # rl-triton's Retrace takes discrete-action tensors: E_π Q(s_{t+1}, ·) from target
        # probabilities and next Q-values over all actions, π(a_t) by the action's index. Two
        # actions with equal next Q-values (= V'_t) give E = V'_t; action 0 with π = exp(target
        # log-prob) and μ = exp(behaviour log-prob) gives the ratio.
        k, tr, bv, last = _boundaries(f)
        if tr is None:
            tr = torch.zeros_like(k)
        nxt = torch.cat([v[:, 1:], (last[:, None] if last is not None else bv[:, -1:])], dim=-1)
        if bv is not None:
            nxt = torch.where(tr.bool(), bv, nxt)
        p = torch.exp(f["target_log_probs"])
        probs = torch.stack([p, 1.0 - p], dim=-1).contiguous()
        next_q = torch.stack([nxt, nxt], dim=-1).contiguous()
        mu = torch.exp(f["log_probs"]).contiguous()
        actions = torch.zeros(r.shape, dtype=torch.int64, device=r.device)
        q = f["q_values"]
        return lambda: (rt.compute_retrace(probs, mu, q, next_q, actions, r, k, tr, gamma=g,
                                           lambda_=params.get("lam", 1.0), c_bar=params.get("c_bar", 1.0))[0],)
    if name in ("eligibility_traces", "episodic_sums"):
        if T > 131072:
            raise Unsupported("rl-triton's forward scans stop at T = 131072")
        k, trf = _flags(f)
        done = (k | trf).float().contiguous()
        x = f.get("x") if f.get("x") is not None else r
        if x.dim() != 2:
            raise Unsupported("[N, T] x only")
        if name == "eligibility_traces":  # traces only (no final)
            return lambda: (rt.compute_eligibility_traces(x, done, g, params["lam"]), None)
        return lambda: (rt.compute_episodic_prefix_sum(x, done), None)
    raise Unsupported(name)


def rl_triton(name, f, params):
    """rl-triton 0.1.3: ``compute_gae`` (advantages only: the ``advantages`` estimator),
    ``compute_vtrace`` (vs and pg advantages), ``compute_lambda_returns``,
    ``compute_discounted_returns`` (bootstrapped and Monte Carlo), ``compute_retrace`` (Q targets;
    it also writes advantages, not compared), ``compute_eligibility_traces`` and
    ``compute_episodic_prefix_sum`` (per-step outputs; no ``final``)."""
    return _rl_triton_prepare(name, f, params)()


rl_triton.prepare = _rl_triton_prepare


def _pufferlib_prepare(name, f, params):
    if name != "advantages":
        raise Unsupported("PufferLib's kernel writes GAE advantages only")
    if f.get("truncated") is not None or f.get("mask") is not None:
        raise Unsupported("PufferLib has one done flag: no truncations, no masks")
    _f32(f, ("rewards", "values"))
    op = _pufferlib_op()
    r, v = f["rewards"], f["values"]
    # PufferLib's buffer convention: rewards and dones one slot ahead of values (it reads
    # r[t+1], done[t+1] with V[t]); importance 1 (on-policy, the V-trace clips inactive); it
    # writes advantages in place into the caller's buffer and leaves the last step unwritten
    pr, pd = torch.zeros_like(r), torch.zeros_like(r)
    pr[:, 1:] = r[:, :-1]
    pd[:, 1:] = f["terminated"][:, :-1].float()
    vv, imp, adv = v.contiguous(), torch.ones_like(r), torch.zeros_like(r)
    g, lam = float(params["gamma"]), float(params["lam"])

    def call():
        op(vv, pr, pd, imp, adv, g, lam, 1.0, 1.0)
        return (adv,)

    return call


def pufferlib(name, f, params):
    """PufferLib 3.0's CUDA advantage kernel (one thread per row, sequential in time): GAE
    advantages in its own done convention (``dones[t+1]``, the last step not written), so it is
    timed against rollbuf's ``advantages`` on the same arrays but not gated."""
    return _pufferlib_prepare(name, f, params)()


pufferlib.prepare = _pufferlib_prepare
# its extension launches on the legacy default stream, which a CUDA graph captured on a side stream
# does not record (the graph comes out empty and its replay times nothing): no device time, the
# full call only
pufferlib.graph = False
pufferlib.gate = False
for _p, _label in ((rl_triton, "rl-triton 0.1.3"), (pufferlib, "PufferLib 3.0")):
    _p.cuda_only = True
    _p.peer = _label


# ------------------------------------------------------------------ the naive kernel (a baseline)


def naive_configs(T: int) -> list[tuple[int, int]]:
    """The (rows per program, warps) the naive kernel is tried with at rows of ``T`` steps."""
    bt = 1 << (T - 1).bit_length()
    base = max(1, 2048 // bt)
    out = []
    for bn in sorted({max(1, base // 2), base, min(64, base * 2)}):
        w = max(1, min(16, bn * bt // 256))
        out.append((bn, w))
        if bn * bt >= 4096:
            out.append((bn, min(16, w * 2)))
    return out


NAIVE_MAX_T = 16384  # one block holds a whole row
_NAIVE_BEST: dict = {}  # (N, T, both outputs) -> the (rows per program, warps) of the fastest device time


def _naive_prepare(name, f, params):
    if name not in ("gae", "advantages"):
        raise Unsupported("the naive kernel computes GAE only")
    if f.get("truncated") is not None or f.get("bootstrap_values") is None or f["bootstrap_values"].dim() != 1:
        raise Unsupported("the naive kernel takes terminations and [N] window-end values only")
    _f32(f, ("rewards", "values"))
    r, v, k = f["rewards"], f["values"], f["terminated"]
    if r.dim() != 2 or not (r.is_contiguous() and v.is_contiguous() and k.is_contiguous()):
        raise Unsupported("the naive kernel reads contiguous [N, T] fields only")
    N, T = r.shape
    if T > NAIVE_MAX_T:
        raise Unsupported(f"the naive kernel holds a row in one block: T <= {NAIVE_MAX_T}")
    import triton

    from benchmarks.naive_kernel import naive_gae as kernel

    last, both = f["bootstrap_values"].contiguous(), name == "gae"
    block_t = triton.next_power_of_2(T)

    def launch(block_n, warps):
        def call():
            adv = torch.empty_like(r)
            ret = torch.empty_like(r) if both else adv
            kernel[(triton.cdiv(N, block_n),)](r, v, k, last, adv, ret, N, T, params["gamma"], params["lam"],
                                               BLOCK_N=block_n, BLOCK_T=block_t, WRITE_RET=both, num_warps=warps)
            return (adv, ret) if both else (adv,)

        return call

    key = (N, T, both)
    if key not in _NAIVE_BEST:  # its best tiling per shape (untimed: part of the preparation)
        configs = naive_configs(T)
        if r.is_cuda and len(configs) > 1:
            from benchmarks.clocks import graph_time

            _NAIVE_BEST[key] = min(configs, key=lambda c: graph_time([launch(*c)])[0])
        else:
            _NAIVE_BEST[key] = configs[0]
    return launch(*_NAIVE_BEST[key])


def naive_triton(name, f, params):
    """The naive one-block GAE kernel (:mod:`benchmarks.naive_kernel`), at its fastest tiling for the shape."""
    return _naive_prepare(name, f, params)()


naive_triton.prepare = _naive_prepare
naive_triton.cuda_only = True
naive_triton.peer = "the naive kernel"


COMPETITORS: dict[str, Callable] = {
    "rollbuf-triton": rollbuf_backend("triton"),
    "rollbuf-numba": rollbuf_backend("numba"),  # what backend="auto" runs on CPU tensors
    "rollbuf-torch": rollbuf_backend("torch", max_gpu_elements=2**25),
    "loop": _gae_impl(gae_loop, max_t=1024),
    "loop-compiled": compiled(gae_loop, max_t=128),
    "doubling-compiled": compiled(gae_doubling),
    "torchrl": torchrl_gae,
    "rl-triton": rl_triton,
    "pufferlib": pufferlib,
    "naive-triton": naive_triton,
}
COMPETITORS["loop"].graph = False  # launch-bound: its full-call time is what users pay
COMPETITORS["rollbuf-triton"].cuda_only = True
COMPETITORS["rollbuf-numba"].cpu_only = True


# ------------------------------------------------------------------ GAE on the CPU (the CPU table)
#
# Each entry: ``prepare(d) -> call``, ``call() -> (advantages, returns)`` as ``[N, T]`` tensors (or
# views), ``d`` the rollout of :func:`benchmarks.cpu.make_data`: ``rewards``, ``values`` (``[N, T]``
# float32), ``terminated`` (bool) and ``bootstrap_values`` (``[N]``, ``V(s_T)`` of each row). The
# preparation (the competitor's own layout, as its users' buffers already hold it) is not timed.


def _cpu_rollbuf(backend, time_major=False):
    def prepare(d):
        from rollbuf import functional as F

        r, v, k = d["rewards"], d["values"], d["terminated"]
        if time_major:  # the trainer's [T, N] buffers, seen as [N, T]
            r, v, k = (x.mT.contiguous().mT for x in (r, v, k))
        last = d["bootstrap_values"]

        def call():
            res = F.gae(0.99, 0.95, rewards=r, values=v, terminated=k, bootstrap_values=last, backend=backend)
            return res.advantages, res.returns

        return call

    return prepare


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


@functools.cache
def _plain_kernel():
    from numba import njit

    return njit(cache=True)(_plain_gae)


def _cpu_plain(d):
    """A 12-line ``@njit`` loop over rows then time written for this GAE alone, tensors in and out."""
    kernel = _plain_kernel()
    r, v, k, last = d["rewards"], d["values"], d["terminated"], d["bootstrap_values"]

    def call():
        adv, ret = kernel(r.numpy(), v.numpy(), k.numpy(), last.numpy(), 0.99, 0.95)
        return torch.from_numpy(adv), torch.from_numpy(ret)

    return call


def _sb3_inputs(d):
    """SB3's buffers: ``[T, N]`` float32, ``episode_starts[t] = done[t − 1]``."""
    k = d["terminated"].numpy()
    starts = np.zeros(k.shape[::-1], dtype=np.float32)
    starts[1:] = k.T[:-1]
    return (np.ascontiguousarray(d["rewards"].numpy().T), np.ascontiguousarray(d["values"].numpy().T), starts,
            d["bootstrap_values"].clone(), k[:, -1].copy())


def _cpu_sb3(d):
    """Stable-Baselines3's ``RolloutBuffer.compute_returns_and_advantage`` on its ``[T, N]`` buffers."""
    try:
        import gymnasium as gym
        from stable_baselines3.common.buffers import RolloutBuffer
    except Exception as e:
        raise Unsupported(f"stable-baselines3 not importable ({type(e).__name__})") from None
    rewards, values, starts, last, dones = _sb3_inputs(d)
    T, N = rewards.shape
    buf = RolloutBuffer(T, gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), device="cpu", gae_lambda=0.95,
                        gamma=0.99, n_envs=N)
    buf.rewards, buf.values, buf.episode_starts = rewards, values, starts

    def call():
        buf.compute_returns_and_advantage(last_values=last, dones=dones)
        return torch.from_numpy(buf.advantages.T), torch.from_numpy(buf.returns.T)

    return call


def _cpu_cleanrl(d):
    """CleanRL ``ppo.py``'s loop: ``[T, N]`` tensors, ``dones[t]`` = done before step t, ``next_done``."""
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
                delta = rewards[t] + 0.99 * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + 0.99 * 0.95 * nextnonterminal * lastgaelam
            returns = advantages + values
        return advantages.T, returns.T

    return call


def _cpu_torchrl(d):
    """TorchRL's ``vec_generalized_advantage_estimate`` on ``[N, T, 1]`` tensors."""
    try:
        from torchrl.objectives.value.functional import vec_generalized_advantage_estimate
    except Exception as e:
        raise Unsupported(f"torchrl not importable ({type(e).__name__})") from None
    r, v, k, last = d["rewards"], d["values"], d["terminated"], d["bootstrap_values"]
    nxt = torch.cat([v[:, 1:], last[:, None]], 1)  # next_state_value, as a TensorDict holds it
    u = [x.unsqueeze(-1) for x in (r, v, nxt, k)]

    def call():
        adv, ret = vec_generalized_advantage_estimate(0.99, 0.95, u[1], u[2], u[0], done=u[3], terminated=u[3],
                                                      time_dim=-2)
        return adv.squeeze(-1), ret.squeeze(-1)

    return call


#: The CPU table's implementations, in its column order.
CPU_GAE: dict[str, Callable] = {
    "rollbuf-numba": _cpu_rollbuf("numba"),  # what backend="auto" runs on CPU tensors
    "rollbuf-numba-tm": _cpu_rollbuf("numba", time_major=True),  # on [T, N] buffers, read in place
    "rollbuf-torch": _cpu_rollbuf("torch"),
    "plain-numba": _cpu_plain,
    "sb3": _cpu_sb3,
    "cleanrl": _cpu_cleanrl,
    "torchrl-vec": _cpu_torchrl,
}
#: the layout each one reads, where it is not [N, T]
CPU_LAYOUT = {"rollbuf-numba-tm": "[T,N] view", "sb3": "[T,N]", "cleanrl": "[T,N]", "torchrl-vec": "[N,T,1]"}
