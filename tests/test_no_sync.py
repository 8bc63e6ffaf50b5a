"""No call synchronises the host with the device: every estimator (with masks, truncations, ``[*B]``
window-end columns, carries, returned carries, batch dimensions), every integration call, the
``Rollout`` methods and the context-parallel calls (in a process group of one).

On a GPU (tests marked ``gpu``): each call once outside (its first call compiles its kernel), then
again under ``torch.cuda.set_sync_debug_mode("error")``, where any synchronising operation raises.
On the CPU: the same calls on tensors without data (``meta``) on the ``torch`` backend, where any
host read of a value (``.item()``, ``bool()``, ``.tolist()``, ``nonzero``) raises — the validation,
the window rules and the torch backend read shapes only. The context-parallel calls need a
collective, which tensors without data cannot take: they run on CPU tensors in a one-process gloo
group, where every tensor built from host data (``torch.tensor``, ``torch.as_tensor``,
``torch.asarray``, ``Tensor.new_tensor`` of Python numbers or sequences: on CUDA a synchronising
host-to-device copy) and every host read of a value, made by rollbuf's code, is recorded and fails the test.
"""

from __future__ import annotations

import contextlib
import os
import sys
from unittest import mock

import pytest
import torch

import rollbuf
from rollbuf import Rollout
from rollbuf import context_parallel as CP
from rollbuf import functional as F
from rollbuf.integrations import llm
from rollbuf.testing import make_rollout

CUDA = torch.cuda.is_available()
N, T = 6, 37


def _fields(device, seed=0, batch=None, **kw):
    f = make_rollout(N if batch is None else None, T, seed=seed, batch_shape=batch, **kw)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in f.items()}


def estimator_calls(device, backend) -> dict:
    """Every estimator, in the combinations the validation and the launch treat apart."""
    calls = {}
    base = _fields(device, seed=1)  # terminations, truncations, [N, T] bootstrap values
    masked = _fields(device, seed=2, p_masked=0.2)
    batched = _fields(device, seed=3, batch=(2, 3))
    column = dict(base, bootstrap_values=base["bootstrap_values"][:, -1].contiguous())  # truncations too
    no_trunc = dict(column, truncated=None)
    own = ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")
    carry = torch.randn(N, device=device)
    pair = torch.randn(N, 2, device=device)
    for label, f in (("[N, T] bootstrap", base), ("mask", masked), ("batch [2, 3]", batched),
                     ("[N] column with truncations", column), ("[N] column", no_trunc)):
        kw = {k: f.get(k) for k in own}
        pol = dict(kw, log_probs=f["log_probs"])
        tlp, q = f["target_log_probs"], f["q_values"]
        calls[f"gae, {label}"] = lambda kw=kw: F.gae(0.99, 0.95, **kw, backend=backend)
        calls[f"advantages, {label}"] = lambda kw=kw: F.advantages(0.99, 0.95, **kw, backend=backend)
        calls[f"lambda_returns, {label}"] = lambda kw=kw: F.lambda_returns(0.99, 0.8, **kw, backend=backend)
        calls[f"discounted_returns, {label}"] = lambda kw=kw: F.discounted_returns(0.99, **kw, backend=backend)
        calls[f"monte carlo, {label}"] = lambda kw=kw: F.discounted_returns(0.99, bootstrap=False, **kw,
                                                                             backend=backend)
        calls[f"vtrace, {label}"] = lambda pol=pol, tlp=tlp: F.vtrace(tlp, 0.99, 1.2, 0.9, **pol, backend=backend)
        calls[f"retrace, {label}"] = lambda pol=pol, tlp=tlp, q=q: F.retrace(q, tlp, 0.99, 0.9, **pol,
                                                                             backend=backend)
    kw = {k: base.get(k) for k in own}
    pol = dict(kw, log_probs=base["log_probs"])
    calls["gae, carry in and out"] = lambda: F.gae(0.99, 0.95, **kw, carry=carry, return_carry=True, backend=backend)
    calls["gae, return_carry"] = lambda: F.gae(0.99, 0.95, **kw, return_carry=True, backend=backend)
    calls["gae, terminal window end"] = lambda: F.gae(0.99, 0.95, **kw, window_end="terminal", backend=backend)
    calls["vtrace, carry in and out"] = lambda: F.vtrace(base["target_log_probs"], 0.99, **pol, carry=pair,
                                                         return_carry=True, backend=backend)
    calls["retrace, return_carry"] = lambda: F.retrace(base["q_values"], base["target_log_probs"], 0.99, **pol,
                                                       return_carry=True, backend=backend)
    x = torch.randn(N, T, 3, device=device)
    flags = dict(terminated=masked["terminated"], truncated=masked["truncated"], mask=masked["mask"], backend=backend)
    calls["eligibility_traces, mask, features, initial"] = lambda: F.eligibility_traces(
        x, 0.99, 0.9, torch.randn(N, 3, device=device), **flags)
    calls["eligibility_traces"] = lambda: F.eligibility_traces(base["rewards"], 0.99, 0.9, terminated=base["terminated"],  # noqa: E501
                                                               backend=backend)
    calls["episodic_sums, mask, initial"] = lambda: F.episodic_sums(rewards=masked["rewards"],
                                                                     initial=torch.zeros(N, device=device), **flags)
    calls["affine_scan"] = lambda: F.affine_scan(base["rewards"], base["values"].sigmoid(), backend=backend)
    calls["affine_scan, reverse, initial"] = lambda: F.affine_scan(base["rewards"], base["values"].sigmoid(), True,
                                                                   carry, backend=backend)
    return calls


def _token_rows(device, seed):
    """Four rows of 40 tokens: rewards, values, a mask, truncated rows and their bootstrap values,
    and the cu_seqlens of four sequences packed in 40 tokens."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(4, 40, generator=g).to(device)
    v = torch.randn(4, 40, generator=g).to(device)
    m = (torch.rand(4, 40, generator=g) < 0.8).to(device)
    tr = torch.tensor([True, False, True, False], device=device)
    bv = torch.randn(4, generator=g).to(device)
    return r, v, m, tr, bv, torch.tensor([0, 7, 19, 30, 40], dtype=torch.int32, device=device)


def llm_calls(device, backend) -> dict:
    """rollbuf.integrations.llm: the verl drop-in (with whitening, verl's fill, truncated rows), the
    REINFORCE returns, the packed functions (cu_seqlens checked), OpenRLHF's mask mode in each, and
    masked_whiten."""
    r, v, m, tr, bv, cu = _token_rows(device, seed=5)
    pr, pv, pm = r.reshape(1, -1)[:, :40], v.reshape(1, -1)[:, :40], m.reshape(1, -1)[:, :40]
    ptr = torch.tensor([False, True, False, True], device=device)
    return {
        "verl GAE, whitened": lambda: llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95, whiten=True,
                                                                       backend=backend),
        "verl GAE, whitened, carry fill, truncated rows": lambda: llm.compute_gae_advantage_return(
            r, v, m, 0.99, 0.95, truncated=tr, bootstrap_values=bv, whiten=True, fill_masked="carry", backend=backend),
        "discounted_returns, truncated rows": lambda: llm.discounted_returns(r, m, 0.99, truncated=tr,
                                                                             bootstrap_values=bv, backend=backend),
        "packed_gae, whitened, truncated": lambda: llm.packed_gae(pr, pv, pm, cu, 0.99, 0.95, ptr, bv, whiten=True,
                                                                  backend=backend),
        "packed_discounted_returns": lambda: llm.packed_discounted_returns(pr, pm, cu, 0.99, fill_masked="carry",
                                                                           backend=backend),
        "OpenRLHF GAE (mask_mode='zero'), whitened, kept, truncated rows": lambda: llm.compute_gae_advantage_return(
            r, v, m, 0.99, 0.95, truncated=tr, bootstrap_values=bv, whiten=True, mask_mode="zero", fill_masked="keep",
            backend=backend),
        "OpenRLHF GAE (mask_mode='zero')": lambda: llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95,
                                                                                    mask_mode="zero", backend=backend),
        "OpenRLHF returns (mask_mode='zero'), truncated rows": lambda: llm.discounted_returns(
            r, m, 0.99, truncated=tr, bootstrap_values=bv, mask_mode="zero", backend=backend),
        "packed_gae, mask_mode='zero', truncated": lambda: llm.packed_gae(pr, pv, pm, cu, 0.99, 0.95, ptr, bv,
                                                                          mask_mode="zero", backend=backend),
        "packed_discounted_returns, mask_mode='zero', kept": lambda: llm.packed_discounted_returns(
            pr, pm, cu, 0.99, mask_mode="zero", fill_masked="keep", backend=backend),
        "masked_whiten": lambda: llm.masked_whiten(v, m),
        "masked_whiten, shift_mean=False": lambda: llm.masked_whiten(v, m, shift_mean=False),
        **per_row_llm_calls(device, backend),
    }


def per_row_llm_calls(device, backend) -> dict:
    """Per-row (per-sequence) ``gamma``/``lam`` tensors (their range is not read back off the CPU),
    ``lam_returns``, VAPO's length-adaptive λ and the turn-level estimators, padded and packed."""
    r, v, m, tr, bv, cu = _token_rows(device, seed=6)
    pr, pv, pm = r.reshape(1, -1)[:, :40], v.reshape(1, -1)[:, :40], m.reshape(1, -1)[:, :40]
    g4 = torch.tensor([0.99, 1.0, 0.0, 0.9], device=device)
    ids = torch.arange(40, device=device).div(6, rounding_mode="floor").expand(4, 40)
    return {
        "GAE, per-row gamma and lam, lam_returns, truncated, whitened": lambda: llm.compute_gae_advantage_return(
            r, v, m, g4, g4.flip(0), lam_returns=1.0, truncated=tr, bootstrap_values=bv, whiten=True, backend=backend),
        "GAE, lam_returns only, mask_mode='zero'": lambda: llm.compute_gae_advantage_return(
            r, v, m, 0.99, 0.95, lam_returns=g4, mask_mode="zero", backend=backend),
        "discounted_returns, per-row gamma, carry fill": lambda: llm.discounted_returns(r, m, g4, fill_masked="carry",
                                                                                        backend=backend),
        "length_adaptive_lam, padded and packed": lambda: (llm.length_adaptive_lam(m, 0.05),
                                                           llm.length_adaptive_lam(pm, 0.05, cu_seqlens=cu)),
        "turn_returns, per-row gamma": lambda: llm.turn_returns(r, m, g4, backend=backend),
        "turn_gae, turn ids, truncated": lambda: llm.turn_gae(r, v, m, 0.99, g4, turn_ids=ids, truncated=tr,
                                                              bootstrap_values=bv, backend=backend),
        "packed_gae, per-sequence gamma, lam_returns": lambda: llm.packed_gae(pr, pv, pm, cu, g4, 0.95, tr, bv,
                                                                              lam_returns=0.9, backend=backend),
        "packed_discounted_returns, per-sequence gamma": lambda: llm.packed_discounted_returns(pr, pm, cu, g4,
                                                                                               backend=backend),
        "packed_turn_returns": lambda: llm.packed_turn_returns(pr, pm, cu, g4, backend=backend),
        "packed_turn_gae, value at the last token": lambda: llm.packed_turn_gae(pr, pv, pm, cu, 0.99, g4, tr, bv,
                                                                                value_at="last", backend=backend),
    }


def verl_calls(device) -> dict:
    """rollbuf.integrations.verl with a tensor ``index`` (what a trainer passes to capture a graph):
    every estimator of its registry, Dr.GRPO, GDPO (its form without config), ReMax and GAE."""
    from types import SimpleNamespace

    from rollbuf.integrations import verl as V

    g = torch.Generator().manual_seed(9)
    r = torch.randn(12, 30, generator=g).to(device)
    m = (torch.rand(12, 30, generator=g) < 0.8).long().to(device)
    idx = torch.tensor([3, 3, 3, 0, 0, 7, 1, 1, 1, 1, 5, 2], device=device)
    cfg = SimpleNamespace(gamma=0.99, norm_adv_by_std_in_grpo=True, get=lambda k, d=None: d)
    calls = {name: (lambda fn=fn: fn(r, m, idx, config=cfg)) for name, fn in V.ESTIMATORS.items()
             if name not in ("reinforce_plus_plus", *V.OWN_INPUTS)}
    lp, spi2 = -torch.rand(12, 30, generator=g).to(device), torch.rand(12, 30, generator=g).to(device)
    for name in V.OWN_INPUTS:  # the optimal token baselines, with the inputs verl's trainer gives them
        calls[name] = lambda fn=V.ESTIMATORS[name]: fn(r, m, idx, old_log_probs=lp, sum_pi_squared=spi2,
                                                       rollout_is_weights=spi2, config=cfg)
    calls["reinforce_plus_plus"] = lambda: V.compute_reinforce_plus_plus_outcome_advantage(r, m, config=cfg)
    calls["Dr.GRPO"] = lambda: V.compute_grpo_outcome_advantage(r, m, idx, norm_adv_by_std_in_grpo=False)
    calls["remax"] = lambda: V.compute_remax_outcome_advantage(r, r[:, 0], m)
    calls["gdpo"] = lambda: V.compute_gdpo_outcome_advantage(r, m, idx)
    calls["gae"] = lambda: V.compute_gae_advantage_return(r, r * 0.5, m, 0.99, 0.95)
    return calls


def rollout_calls(device, backend) -> dict:
    """The collection loop (record every step, close the window) and every estimator method."""
    ro = Rollout.empty(N, T, device=device, with_mask=True)
    g = torch.Generator().manual_seed(7)
    steps = [{k: torch.randn(N, generator=g).to(device) for k in ("rewards", "values", "log_probs",
                                                                   "bootstrap_values")} for _ in range(T)]
    flags = [{"terminated": (torch.rand(N, generator=g) < 0.1).to(device),
              "truncated": (torch.rand(N, generator=g) < 0.05).to(device),
              "mask": (torch.rand(N, generator=g) < 0.9).to(device)} for _ in range(T)]
    last = torch.randn(N, device=device)
    tlp, q = torch.randn(N, T, device=device) * 0.3, torch.randn(N, T, device=device)
    x = torch.randn(N, T, 2, device=device)

    def collect():
        for t in range(T):
            ro.record(t, **steps[t], **flags[t])
        ro.bootstrap(last)

    collect()  # (the methods read a closed window)
    kw = dict(backend=backend)
    return {
        "record and bootstrap": collect,
        "Rollout.gae": lambda: ro.gae(0.99, 0.95, **kw),
        "Rollout.advantages": lambda: ro.advantages(0.99, 0.95, **kw),
        "Rollout.lambda_returns": lambda: ro.lambda_returns(0.99, 0.8, **kw),
        "Rollout.discounted_returns": lambda: ro.discounted_returns(0.99, **kw),
        "Rollout.discounted_returns, monte carlo": lambda: ro.discounted_returns(0.99, bootstrap=False, **kw),
        "Rollout.vtrace": lambda: ro.vtrace(tlp, 0.99, **kw),
        "Rollout.retrace": lambda: ro.retrace(q, tlp, 0.99, **kw),
        "Rollout.eligibility_traces": lambda: ro.eligibility_traces(x, 0.99, 0.9, **kw),
        "Rollout.episodic_sums": lambda: ro.episodic_sums(**kw),
        "Rollout.gae, return_carry": lambda: ro.gae(0.99, 0.95, return_carry=True, **kw),
    }


def torchrl_calls(device) -> dict:
    """The TorchRL drop-ins on a collector-shaped tensordict (values in it: no value network)."""
    pytest.importorskip("torchrl")
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    from rollbuf.integrations import torchrl as rt

    g = torch.Generator().manual_seed(9)
    B, Tn = 4, 33
    done = torch.rand(B, Tn, 1, generator=g) < 0.15
    term = done & (torch.rand(B, Tn, 1, generator=g) < 0.5)

    def td():
        return TensorDict({
            "state_value": torch.randn(B, Tn, 1, generator=g), "observation": torch.randn(B, Tn, 4, generator=g),
            "action": nn.functional.one_hot(torch.randint(0, 2, (B, Tn), generator=g), 2),
            "action_log_prob": -torch.rand(B, Tn, generator=g),
            "next": {"reward": torch.randn(B, Tn, 1, generator=g), "done": done, "terminated": term,
                     "truncated": done & ~term, "state_value": torch.randn(B, Tn, 1, generator=g)},
        }, batch_size=[B, Tn]).to(device)

    actor = ProbabilisticActor(TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"]),
                               in_keys=["logits"], distribution_class=OneHotCategorical,
                               return_log_prob=True).to(device)
    gae = rt.GAE(gamma=0.99, lmbda=0.95, value_network=None)
    tdl = rt.TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=None)
    vt = rt.VTrace(gamma=0.99, actor_network=actor, value_network=None)
    data = td()
    return {"torchrl GAE": lambda: gae(data.clone()), "torchrl TDLambdaEstimator": lambda: tdl(data.clone()),
            "torchrl VTrace": lambda: vt(data.clone())}


def sb3_call():
    """The SB3 buffer: NumPy arrays on the host, so last_values come as SB3 passes them on the CPU
    (a CUDA ``last_values`` is copied to the host, by nature a sync)."""
    pytest.importorskip("stable_baselines3")
    import numpy as np
    from gymnasium import spaces

    from rollbuf.integrations.sb3 import RolloutBuffer

    buf = RolloutBuffer(16, spaces.Box(-1, 1, (3,), dtype=np.float32), spaces.Discrete(2), device="cpu", n_envs=4)
    rng = np.random.default_rng(0)
    buf.rewards[:] = rng.normal(size=(16, 4))
    buf.values[:] = rng.normal(size=(16, 4))
    buf.episode_starts[:] = rng.random((16, 4)) < 0.1
    buf.pos, buf.full = 16, True
    last, dones = torch.randn(4, 1), rng.random(4) < 0.5
    return {"sb3 RolloutBuffer.compute_returns_and_advantage":
            lambda: buf.compute_returns_and_advantage(last.clone(), dones.copy())}


def cp_calls(device) -> dict:
    """rollbuf.context_parallel (in a group of one): both layouts of the padded and packed GAE and
    returns (whitened, truncated rows, zigzag splits), masked_whiten, sequence_sums and the outcome
    estimators with a tensor index."""
    r, v, m, tr, bv, cu = _token_rows(device, seed=11)
    sp = torch.tensor([3, 5, 4, 6], dtype=torch.int32, device=device)  # within each segment
    pr, pv, pm = r[:1], v[:1], m[:1]
    idx = torch.tensor([0, 0, 1, 1], device=device)
    return {
        "GAE, contiguous": lambda: CP.compute_gae_advantage_return(r, v, m, 0.99, 0.95),
        "GAE, zigzag, whitened, truncated rows": lambda: CP.compute_gae_advantage_return(
            r, v, m, 0.99, 0.95, layout="zigzag", split=17, whiten=True, truncated=tr, bootstrap_values=bv),
        "discounted_returns, zigzag, truncated rows": lambda: CP.discounted_returns(
            r, m, 0.99, layout="zigzag", truncated=tr, bootstrap_values=bv),
        "packed_gae, contiguous, truncated": lambda: CP.packed_gae(pr, pv, pm, cu, 0.99, 0.95, tr, bv),
        "packed_gae, zigzag, whitened": lambda: CP.packed_gae(pr, pv, pm, cu, 0.99, 0.95, layout="zigzag", split=sp,
                                                              whiten=True),
        "packed_discounted_returns, zigzag": lambda: CP.packed_discounted_returns(pr, pm, cu, 0.99, layout="zigzag"),
        "masked_whiten": lambda: CP.masked_whiten(v, m),
        "sequence_sums": lambda: CP.sequence_sums(v, m),
        "sequence_sums, packed": lambda: CP.sequence_sums(pv, pm, cu_seqlens=cu),
        "outcome_advantages, grpo": lambda: CP.outcome_advantages(r, m, idx, "grpo"),
        "outcome_advantages, rloo, packed": lambda: CP.outcome_advantages(pr, pm, idx, "rloo", cu_seqlens=cu),
    }


@contextlib.contextmanager
def _one_process_group(backend, tmp_path):
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _sync_is_an_error():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _run_without_sync(calls: dict):
    """Each call once (compiles), then again where a synchronising operation raises, naming the call."""
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    failed = {}
    with _sync_is_an_error():
        for name, fn in calls.items():
            try:
                fn()
            except RuntimeError as e:
                failed[name] = str(e).splitlines()[0]
    torch.cuda.synchronize()
    assert not failed, f"calls that synchronised the host with the device: {failed}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_estimators_do_not_sync(backend):
    _run_without_sync(estimator_calls("cuda", backend))


@pytest.mark.gpu
def test_llm_integration_does_not_sync():
    _run_without_sync(llm_calls("cuda", "auto"))


@pytest.mark.gpu
def test_verl_estimators_do_not_sync_and_capture_in_a_graph():
    """With a tensor index, verl's estimators run without a sync and replay from one CUDA graph with
    the eager call's values."""
    calls = verl_calls("cuda")
    _run_without_sync(calls)
    eager = {name: fn() for name, fn in calls.items()}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # (warmed up above, on the side stream torch.cuda.graph uses too)
        captured = {name: fn() for name, fn in calls.items()}
    for out in captured.values():
        for t in out:
            t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for name, out in captured.items():
        for got, want in zip(out, eager[name], strict=True):
            torch.testing.assert_close(got, want, equal_nan=True, msg=name)


@pytest.mark.gpu
def test_rollout_does_not_sync():
    _run_without_sync(rollout_calls("cuda", "auto"))


@pytest.mark.gpu
def test_context_parallel_does_not_sync(tmp_path):
    """In an NCCL group of one: the collectives aside, no call synchronises (no tensor of host data,
    no host read)."""
    torch.cuda.set_device(0)
    with _one_process_group("nccl", tmp_path):
        _run_without_sync(cp_calls("cuda"))


@pytest.mark.gpu
def test_torchrl_drop_ins_do_not_sync():
    from torch.distributions import Distribution

    previous = Distribution._validate_args
    Distribution.set_default_validate_args(False)  # (the distributions' own argument checks read values)
    try:
        _run_without_sync(torchrl_calls("cuda"))
    finally:
        Distribution.set_default_validate_args(previous)


@pytest.mark.gpu
def test_sb3_buffer_does_not_sync():
    _run_without_sync(sb3_call())


# ---- the CPU side: tensors without data --------------------------------------------------------


def _on_meta(calls: dict):
    failed = {}
    for name, fn in calls.items():
        try:
            out = fn()
        except (RuntimeError, NotImplementedError) as e:  # e.g. "Tensor.item() cannot be called on meta tensors"
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            continue
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            for t in (o if isinstance(o, tuple) else (o,)):
                assert not isinstance(t, torch.Tensor) or t.device.type == "meta", name
    assert not failed, f"calls that read a value on the host: {failed}"


def test_estimators_read_no_values_on_the_host():
    """Every estimator call validates and runs (torch backend) on tensors that hold no data."""
    _on_meta(estimator_calls("meta", "torch"))


def test_llm_integration_reads_no_values_on_the_host():
    _on_meta(llm_calls("meta", "torch"))


def test_verl_estimators_read_no_values_on_the_host():
    _on_meta(verl_calls("meta"))


def test_rollout_reads_no_values_on_the_host():
    _on_meta(rollout_calls("meta", "torch"))


# ---- the CPU side of the context-parallel calls: host data and host reads, recorded ----------

_PACKAGE = os.path.dirname(rollbuf.__file__) + os.sep
_BUILDERS = ((torch, "tensor"), (torch, "as_tensor"), (torch, "asarray"), (torch.Tensor, "new_tensor"))
_READS = ((torch.Tensor, "item"), (torch.Tensor, "tolist"), (torch.Tensor, "__bool__"), (torch.Tensor, "__int__"),
          (torch.Tensor, "__float__"), (torch.Tensor, "nonzero"), (torch, "nonzero"))


@contextlib.contextmanager
def _host_data_and_reads_recorded(found: list):
    """Records ``(what, file:line)`` of each tensor built from host data (not from a tensor) and each
    host read of a tensor's value whose caller is a file of the rollbuf package."""

    def record(what):
        f = sys._getframe(2)  # the caller of the wrapper below
        if f.f_code.co_filename.startswith(_PACKAGE):
            found.append((what, f"{os.path.relpath(f.f_code.co_filename, _PACKAGE)}:{f.f_lineno}"))

    def wrap(owner, name, real):
        if (owner, name) in _READS:
            def call(*args, **kw):
                record(f"{'Tensor' if owner is torch.Tensor else 'torch'}.{name}")
                return real(*args, **kw)
        elif owner is torch.Tensor:  # the method: the tensor, then the data
            def call(self, data, *args, **kw):
                if not isinstance(data, torch.Tensor):
                    record(f"{name} of {type(data).__name__}")
                return real(self, data, *args, **kw)
        else:
            def call(data, *args, **kw):
                if not isinstance(data, torch.Tensor):
                    record(f"{name} of {type(data).__name__}")
                return real(data, *args, **kw)
        return call

    with contextlib.ExitStack() as stack:
        for owner, name in _BUILDERS + _READS:
            stack.enter_context(mock.patch.object(owner, name, wrap(owner, name, getattr(owner, name))))
        yield


def test_context_parallel_builds_no_tensor_of_host_data_and_reads_none(tmp_path):
    """The context-parallel calls on CPU tensors in a gloo group of one make no tensor from host data
    (on CUDA: a synchronising copy) and read no value on the host."""
    calls = cp_calls("cpu")
    failed = {}
    with _one_process_group("gloo", tmp_path):
        for name, fn in calls.items():
            found = []
            with _host_data_and_reads_recorded(found):
                fn()
            if found:
                failed[name] = found
    assert not failed, f"calls that built tensors of host data or read values on the host: {failed}"


def test_the_recorder_records():
    """The recorder sees a tensor of host data and a host read in a rollbuf file, and nothing in this one."""
    found = []
    with _host_data_and_reads_recorded(found):
        torch.tensor([1.0])
        torch.ones(2).new_tensor([0.0])
        llm.masked_whiten(torch.randn(2, 3), torch.ones(2, 3, dtype=torch.bool))  # rollbuf code that does neither
    assert found == []
    code = compile("import torch\nx = torch.tensor([1.0]); y = x.new_tensor(0.0); bool(x); x.item()\n",
                   os.path.join(_PACKAGE, "_probe.py"), "exec")  # as though from a rollbuf file (not written)
    with _host_data_and_reads_recorded(found):
        exec(code, {})
    assert [what for what, _ in found] == ["tensor of list", "new_tensor of float", "Tensor.__bool__",
                                           "Tensor.item"], found
