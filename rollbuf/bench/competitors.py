"""What users run today, and rollbuf's backends, behind one calling convention.

A competitor is ``fn(name, fields, params) -> tuple of outputs`` (the outputs of
``rollbuf.functional.<name>``, in order). It raises :class:`Unsupported` for an estimator or a boundary
mix it does not offer; whether what it *does* compute is right is decided by the correctness gate,
not here: the loops below are written the way trainers commonly write them.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from rollbuf.testing import run_estimator


class Unsupported(Exception):
    """The competitor does not offer this estimator or boundary mix."""


def _tuple(x):
    return tuple(x) if isinstance(x, tuple) else (x,)


def rollbuf_backend(backend: str, max_gpu_elements: int | None = None) -> Callable:
    def fn(name, f, params):
        r = f["rewards"]
        if max_gpu_elements is not None and r.is_cuda and r.numel() > max_gpu_elements:
            raise Unsupported(f"more than {max_gpu_elements} elements on the GPU (the CPU path; timed smaller)")
        return _tuple(run_estimator(name, f, backend=backend, **params))

    fn.__name__ = f"rollbuf_{backend}"
    return fn


def _successor(f):
    """V'_t as a trainer builds it: next value, bootstrap at truncations and the window end."""
    v, bv = f["values"], f["bootstrap_values"]
    nxt = torch.cat([v[..., 1:], bv[..., -1:]], dim=-1)
    if f.get("truncated") is not None:
        nxt = torch.where(f["truncated"], torch.nan_to_num(bv), nxt)
    return nxt


def _flags(f):
    z = torch.zeros_like(f["rewards"], dtype=torch.bool)
    k = f.get("terminated")
    tr = f.get("truncated")
    k = z if k is None else k.bool()
    tr = z if tr is None else tr.bool()
    return k, tr


def gae_loop(r, v, nxt, k, tr, gamma: float, lam: float):
    """The CleanRL/SB3 loop: one small kernel per op per step."""
    T = r.shape[-1]
    nterm = 1.0 - k.to(r.dtype)
    ndone = 1.0 - (k | tr).to(r.dtype)
    adv = torch.empty_like(r)
    last = torch.zeros_like(r[..., 0])
    for t in range(T - 1, -1, -1):
        delta = r[..., t] + gamma * nterm[..., t] * nxt[..., t] - v[..., t]
        cont = ndone[..., t] if t < T - 1 else torch.zeros_like(last)
        last = delta + gamma * lam * cont * last
        adv[..., t] = last
    return adv, adv + v


def gae_doubling(r, v, nxt, k, tr, gamma: float, lam: float):
    """A linear-space doubling scan (log2 T passes through memory), as in ``torch.compile``d code."""
    nterm = 1.0 - k.to(r.dtype)
    a = r + gamma * nterm * nxt - v
    b = gamma * lam * (1.0 - (k | tr).to(r.dtype))
    b = torch.cat([b[..., :-1], torch.zeros_like(b[..., -1:])], dim=-1)
    T = r.shape[-1]
    off = 1
    while off < T:
        a = a + b * torch.nn.functional.pad(a[..., off:], (0, off))
        b = b * torch.nn.functional.pad(b[..., off:], (0, off), value=1.0)
        off *= 2
    return a, a + v


def _gae_impl(impl, max_t=None):
    def fn(name, f, params):
        if max_t is not None and f["rewards"].is_cuda and f["rewards"].shape[-1] > max_t:
            raise Unsupported(f"T > {max_t} on the GPU: seconds per call, one launch per op per step")
        if name != "gae":
            raise Unsupported(name)
        if f.get("mask") is not None:
            raise Unsupported("masks")
        k, tr = _flags(f)
        return impl(f["rewards"], f["values"], _successor(f), k, tr, params["gamma"], params["lam"])

    return fn


@functools.lru_cache(maxsize=None)
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
    if name != "gae":
        raise Unsupported(name)
    if f.get("mask") is not None:
        raise Unsupported("masks")
    k, tr = _flags(f)
    u = lambda x: x.unsqueeze(-1)  # noqa: E731
    adv, ret = generalized_advantage_estimate(params["gamma"], params["lam"], u(f["values"]), u(_successor(f)),
                                              u(f["rewards"]), done=u(k | tr), terminated=u(k), time_dim=-2)
    return adv.squeeze(-1), ret.squeeze(-1)


def verl_multi_turn_gae(token_level_rewards, values, response_mask, gamma, lam):
    """verl's multi-turn GAE loop as written (``verl/trainer/ppo/core_algos.py``, without the final
    ``masked_whiten``): one token per step, the response end terminal, masked tokens carried
    forward by mask arithmetic (finite inputs only)."""
    nextvalues = 0
    lastgaelam = 0
    advantages_reversed = []
    gen_len = token_level_rewards.shape[-1]
    for t in reversed(range(gen_len)):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values


COMPETITORS: dict[str, Callable] = {
    "rollbuf-triton": rollbuf_backend("triton"),
    "rollbuf-torch": rollbuf_backend("torch", max_gpu_elements=2**25),
    "loop": _gae_impl(gae_loop, max_t=1024),
    "loop-compiled": compiled(gae_loop, max_t=128),
    "doubling-compiled": compiled(gae_doubling),
    "torchrl": torchrl_gae,
}
COMPETITORS["loop"].graph = False  # launch-bound: its full-call time is what users pay
