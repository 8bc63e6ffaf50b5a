"""rollbuf.integrations.verl against verl 0.9.1 itself (installed by the README's test command,
tests/requirements-verl.txt: required in CI, where a missing verl fails the collection; skipped on a
machine without it, such as a GPU machine that has only torch and Triton), on random batches with EOS masks, multi-turn
masks, all-masked rows, groups of one, zero-variance groups and a group whose other members are all
equal, with string, int and tensor ids, in float32 and bfloat16. Compared at every token: with
``response_mask = 1`` (what a loss reads) and at the others (where both return 0, or verl's values)."""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest
import torch

if os.environ.get("CI") != "true":  # in CI the oracle must be there: an ImportError fails the run
    pytest.importorskip("omegaconf", reason="verl's extras (tests/requirements-verl.txt) are not installed")
    pytest.importorskip("verl", reason="verl (tests/requirements-verl.txt) is not installed")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

from rollbuf.integrations import verl as R

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel tests: on the GPU, else the interpreter
OUTCOME = ["grpo", "grpo_vectorized", "gdpo", "rloo", "rloo_vectorized", "opo", "gpg",
           "reinforce_plus_plus_baseline", "grpo_passk"]
VERL = {name: core_algos.get_adv_estimator_fn(name) for name in OUTCOME}
OURS = {"gdpo": R.compute_gdpo_outcome_advantage, "grpo": R.compute_grpo_outcome_advantage,
        "grpo_vectorized": R.compute_grpo_vectorized_outcome_advantage, **{
            k: R.ESTIMATORS[k] for k in OUTCOME if k not in ("grpo", "grpo_vectorized", "gdpo")}}


def batch(seed, B=48, L=10, singles=True):
    """Rows of groups of 1-6 (shuffled), EOS masks (some rows empty), tool spans inside rows; dense
    small rewards (verl sums every token) plus a score; some groups with equal scores, one group of
    binary scores with a single 1 (its other members all equal)."""
    g = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < B:
        sizes.append(int(g.choice([1, 2, 3, 4, 6] if singles else [2, 3, 4, 6])))
    sizes[-1] -= sum(sizes) - B
    if sizes[-1] < 2 and not singles:
        sizes[-2] += sizes.pop()
    labels = np.repeat(np.arange(len(sizes)), sizes)
    rewards = torch.tensor(g.normal(size=(B, L)) * 0.1, dtype=torch.float32)
    score = torch.tensor(g.normal(size=B) * 2, dtype=torch.float32)
    rewards[torch.arange(B), torch.tensor(g.integers(0, L, B))] += score
    for k in range(len(sizes)):
        rows = np.flatnonzero(labels == k)
        if k % 4 == 1:  # zero variance: the same rewards (integers: verl's mean of them is exact too)
            rewards[rows] = float(g.integers(-2, 3))
        elif k % 4 == 2 and rows.size > 2:  # binary, a single 1: the others are all equal
            rewards[rows] = 0.0
            rewards[rows[0], -1] = 1.0
    lengths = torch.tensor(g.integers(0, L + 1, B))
    lengths[g.integers(0, B, 3)] = 0  # all-masked rows
    mask = torch.arange(L) < lengths[:, None]
    for i in g.integers(0, B, B // 3):  # multi-turn: a tool span inside the response
        a = int(g.integers(0, L))
        mask[i, a:a + int(g.integers(1, 4))] = False
    perm = torch.tensor(g.permutation(B))
    return rewards[perm], mask[perm].long(), labels[perm.numpy()]


def index_of(labels, kind):
    if kind == "str":
        return np.array([f"uid-{v:04d}" for v in labels], dtype=object)
    return np.array([v * 7919 + 10**11 for v in labels]) if kind == "int" else torch.tensor(labels * 3 - 5)


def _config(norm=True, gamma=0.9):
    return OmegaConf.create({"norm_adv_by_std_in_grpo": norm, "gamma": gamma})


def _call(fn, rewards, mask, index, name, norm=True):
    kw = dict(token_level_rewards=rewards.clone(), response_mask=mask.clone(), index=index, config=_config(norm))
    if name in ("grpo", "grpo_vectorized", "gdpo"):
        kw["norm_adv_by_std_in_grpo"] = norm
    return fn(**kw)


def _close(ours, theirs, dtype, name):
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ours.double(), theirs.double(), **tol, msg=name)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("kind", ["str", "int", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", OUTCOME)
def test_outcome_estimators_equal_verl(name, seed, dtype, kind, norm):
    """verl on the same values in float32 (a bf16 input: its values upcast; rollbuf accumulates them in
    float32 and rounds its output, verl would round every intermediate) at every token; the output
    dtype is verl's for the same input (the vectorized RLOO aside: float32 where verl's bincount gives
    float64)."""
    rewards, mask, labels = batch(seed, singles=name != "grpo_passk")
    rewards = rewards.to(dtype)
    ref_a, ref_r = _call(VERL[name], rewards.float(), mask, index_of(labels, "str"), name, norm)
    a, r = _call(OURS[name], rewards, mask, index_of(labels, kind), name, norm)
    _close(a, ref_a, dtype, name)
    _close(r, ref_r, dtype, name)
    assert (a[mask == 0] == 0).all()
    if not (name == "rloo_vectorized" and dtype != torch.float32):
        assert a.dtype == _call(VERL[name], rewards, mask, index_of(labels, "str"), name, norm)[0].dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1])
def test_token_estimators_equal_verl(seed, dtype):
    """GAE (whitened, verl's carried values at masked tokens), REINFORCE++ (config.gamma, returns
    carried across tool spans) and ReMax, at every token."""
    rewards, mask, _ = batch(seed)
    rewards = rewards.to(dtype)
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(rewards.shape, generator=g).to(dtype)
    baselines = torch.randn(rewards.shape[0], generator=g).to(dtype)
    pairs = [(R.compute_gae_advantage_return(rewards, values, mask, 0.99, 0.9),
              core_algos.compute_gae_advantage_return(rewards.float(), values.float(), mask, 0.99, 0.9)),
             (R.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=_config()),
              core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards.float(), mask, config=_config())),
             (R.compute_remax_outcome_advantage(rewards, baselines, mask),
              core_algos.compute_remax_outcome_advantage(rewards.float(), baselines.float(), mask))]
    for k, (ours, theirs) in enumerate(pairs):
        for o, t in zip(ours, theirs):
            _close(o, t, dtype, f"pair {k}")
            assert o.dtype == dtype


def test_gdpo_reward_components():
    """GDPO with config.gdpo_reward_keys / gdpo_reward_weights read from non_tensor_batch."""
    rewards, mask, labels = batch(3)
    g = np.random.default_rng(0)
    ntb = {"fmt": g.integers(0, 2, 48).astype(np.float32), "acc": g.normal(size=48), "uid": index_of(labels, "str")}
    cfg = OmegaConf.create({"gdpo_reward_keys": ["fmt", "acc"], "gdpo_reward_weights": [0.5, 2.0]})
    prompts = torch.zeros(48, 3, dtype=torch.long)
    b = {"prompts": prompts, "attention_mask": torch.cat([torch.ones(48, 3, dtype=torch.long), mask], 1)}
    kw = dict(token_level_rewards=rewards, response_mask=mask, index=ntb["uid"], config=cfg, non_tensor_batch=ntb,
              batch=b)
    _close(R.compute_gdpo_outcome_advantage(**kw)[0], core_algos.compute_gdpo_outcome_advantage(**kw)[0],
           torch.float32, "gdpo")
    with pytest.raises(ValueError, match="gdpo_reward_keys"):
        R.compute_gdpo_outcome_advantage(**dict(kw, config=OmegaConf.create({"gdpo_reward_keys": ["x"]})))


def test_register_selects_them_by_name():
    """After register(), verl's registry gives rollbuf's functions; called as verl's trainer calls a
    registered estimator (config, index, no norm_adv_by_std_in_grpo), they equal verl's registered
    functions called so (which do not read config.norm_adv_by_std_in_grpo)."""
    names = R.register()
    assert R.register() == names  # registering again is harmless
    assert set(names) <= set(core_algos.ADV_ESTIMATOR_REGISTRY)
    rewards, mask, labels = batch(4)
    for norm in (True, False):
        kw = dict(token_level_rewards=rewards, response_mask=mask, config=_config(norm), index=index_of(labels, "str"))
        ours = core_algos.get_adv_estimator_fn("rollbuf_grpo")(**kw)[0]
        theirs = core_algos.get_adv_estimator_fn("grpo")(**kw)[0]
        _close(ours, theirs, torch.float32, "rollbuf_grpo")
    ours = core_algos.get_adv_estimator_fn("rollbuf_reinforce_plus_plus")(rewards, mask, config=_config())[0]
    _close(ours, core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=_config())[0],
           torch.float32, "rollbuf_reinforce_plus_plus")


@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized"])
def test_registered_grpo_takes_verls_arguments(name):
    """The registered GRPO forms take verl's signature: explicit ``epsilon`` and
    ``norm_adv_by_std_in_grpo`` (by keyword or position) are used, and ``config`` alone is read as
    verl's own registered function reads it (not at all: verl's trainer passes the argument to its
    ``"grpo"`` branch, and gives a registered name ``config`` only)."""
    R.register()
    ours, theirs = core_algos.get_adv_estimator_fn("rollbuf_" + name), core_algos.get_adv_estimator_fn(name)
    rewards, mask, labels = batch(4)
    index = index_of(labels, "str")
    calls = [((rewards, mask, index), dict(norm_adv_by_std_in_grpo=False)),
             ((rewards, mask, index), dict(epsilon=10.0)),
             ((rewards, mask, index, 10.0, False), {}),
             ((rewards, mask, index, 0.5), dict(norm_adv_by_std_in_grpo=True, config=_config(False))),
             ((rewards, mask, index), dict(norm_adv_by_std_in_grpo=False, config=_config(True))),
             ((), dict(token_level_rewards=rewards, response_mask=mask, index=index, config=_config(False))),
             ((), dict(token_level_rewards=rewards, response_mask=mask, index=index, config=_config(True))),
             ((rewards, mask, index), {})]
    for args, kw in calls:
        for a, b in zip(ours(*args, **kw), theirs(*args, **kw)):
            _close(a, b, torch.float32, f"{name} {len(args)} {sorted(kw)}")


@pytest.mark.parametrize("name", list(OURS))
def test_response_mask_of_another_shape_raises(name):
    """verl broadcasts a response_mask of another shape; rollbuf raises, naming it."""
    rewards, mask, labels = batch(0)
    for bad in (mask[:, :1], mask[:1], mask[:, :-1]):
        kw = dict(token_level_rewards=rewards, response_mask=bad, index=index_of(labels, "str"), config=_config())
        if name in ("grpo", "grpo_vectorized", "gdpo"):
            kw["norm_adv_by_std_in_grpo"] = True
        with pytest.raises(ValueError, match="response_mask"):
            OURS[name](**kw)
    for fn, extra in ((R.compute_reinforce_plus_plus_outcome_advantage, {}),
                      (R.compute_remax_outcome_advantage, dict(reward_baselines=torch.zeros(rewards.shape[0]))),
                      (R.compute_gae_advantage_return, dict(values=torch.zeros_like(rewards), gamma=1.0, lam=1.0))):
        with pytest.raises(ValueError, match="response_mask"):
            fn(token_level_rewards=rewards, response_mask=mask[:, :1], config=_config(), **extra) \
                if fn is R.compute_reinforce_plus_plus_outcome_advantage else \
                fn(token_level_rewards=rewards, response_mask=mask[:, :1], **extra)


def test_documented_differences_from_verl():
    """docs/llm.md, "Where the outputs differ from verl's": a tensor index (verl's RLOO loop makes
    every row a group of one, its pass@k raises, its GRPO loop a KeyError; rollbuf groups equal ids)
    and an infinite score (RLOO)."""
    r, m, idx = torch.tensor([[1.0, 0], [3, 0], [2, 0], [5, 0]]), torch.ones(4, 2), torch.tensor([0, 0, 1, 1])
    kw = dict(token_level_rewards=r, response_mask=m, index=idx, config=_config())
    assert VERL["rloo"](**kw)[0][:, 0].tolist() == [1.0, 3.0, 2.0, 5.0]
    assert OURS["rloo"](**kw)[0][:, 0].tolist() == [-2.0, 2.0, -3.0, 3.0]
    with pytest.raises(ValueError):
        VERL["grpo_passk"](**kw)
    with pytest.raises(KeyError):
        VERL["grpo"](**kw)
    r = torch.tensor([[float("inf")], [1.0], [2.0], [3.0]])
    kw = dict(token_level_rewards=r, response_mask=torch.ones(4, 1), index=np.array(["a", "a", "b", "b"], dtype=object))
    for name in ("rloo", "rloo_vectorized"):
        theirs, ours = VERL[name](**kw)[0][:, 0], OURS[name](**kw)[0][:, 0]
        assert theirs[0].isnan() and theirs[1] == -math.inf and theirs[2:].tolist() == [-1.0, 1.0]
        assert ours[:2].isnan().all() and ours[2:].tolist() == [-1.0, 1.0]


OTB = ("optimal_token_baseline", "tir_optimal_token_baseline")


def _otb_inputs(seed, B=48, L=10):
    """:func:`batch` (EOS and multi-turn masks, all-masked rows, groups of 1-6) with the policy's
    log-probabilities, Σπ² and importance weights, and rows made to tie for a group's longest."""
    rewards, mask, labels = batch(seed, B, L)
    g = torch.Generator().manual_seed(seed)
    lp = -3 * torch.rand(B, L, generator=g)
    spi2 = 0.5 * torch.rand(B, L, generator=g)
    isw = 2 * torch.rand(B, L, generator=g)
    for k in range(0, labels.max() + 1, 3):  # every third group: its rows as long as its first
        rows = np.flatnonzero(labels == k)
        mask[rows] = mask[rows[0]].clone()
    return rewards, mask, labels, lp, spi2, isw


@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("name", OTB)
def test_optimal_token_baselines_equal_verl(name, seed, weighted, zero_tail):
    """OTB and TIR-OTB against verl 0.9.1's loops (float32: within 1e-5 of each row's scale; returns bit
    for bit): EOS and multi-turn masks, all-masked rows, singleton and uneven groups, rows tied for a
    group's longest and a unique longest, with and without importance weights, both zero-tail modes."""
    rewards, mask, labels, lp, spi2, isw = _otb_inputs(seed)
    kw = dict(token_level_rewards=rewards, response_mask=mask, index=index_of(labels, "str"), old_log_probs=lp,
              sum_pi_squared=spi2, rollout_is_weights=isw if weighted else None, handle_zero_tail=zero_tail)
    (ours, g_ours), (theirs, g_theirs) = R.ESTIMATORS[name](**kw), core_algos.get_adv_estimator_fn(name)(**kw)
    assert torch.equal(g_ours, g_theirs) and ours.dtype == theirs.dtype
    scale = theirs.abs().amax(-1, keepdim=True).clamp_min(1e-6)
    torch.testing.assert_close(ours / scale, theirs / scale, rtol=0, atol=1e-5)
    assert (ours[mask == 0] == 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_optimal_token_baseline_kernel_is_as_exact_as_verl(seed, monkeypatch):
    """OTB on its kernel (one program per group; under Triton's interpreter on a CPU machine) against verl
    0.9.1's loop run in float64: every row within verl's own float32 error of it (the kernel sums in
    float64; verl's float32 ``Σ W`` can cancel) plus 1e-6 of the row's return scale, and the returns
    verl's bit for bit. EOS and multi-turn masks, all-masked rows, singleton and uneven groups, tied and
    unique longest rows, with and without importance weights, both zero-tail modes, an int64 and a bool
    mask, odd lengths and chunk edges inside the rows (L = 37 in 16-token chunks: W's running sum carried
    across chunks); the calls ran on the kernel."""
    from rollbuf.kernels import token_baseline

    monkeypatch.setattr(token_baseline, "TILE", 128)  # 8 rows (groups of up to 6) x 16 tokens a chunk
    runs, run = [], token_baseline.run
    monkeypatch.setattr(token_baseline, "run", lambda *a, **k: runs.append(1) or run(*a, **k))
    rewards, mask, labels, lp, spi2, isw = _otb_inputs(seed, B=40, L=37)
    index = index_of(labels, "str")
    for weighted, zero_tail, m in ((False, True, mask), (True, False, mask), (True, True, mask.bool())):
        kw = dict(token_level_rewards=rewards.to(DEV), response_mask=m.to(DEV), index=index, old_log_probs=lp.to(DEV),
                  sum_pi_squared=spi2.to(DEV), rollout_is_weights=isw.to(DEV) if weighted else None,
                  handle_zero_tail=zero_tail)
        ours, g = R.compute_optimal_token_baseline_advantage(**kw, backend="triton")
        theirs, g_theirs = core_algos.compute_optimal_token_baseline_advantage(**kw)
        exact, _ = core_algos.compute_optimal_token_baseline_advantage(
            **{k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kw.items()})
        assert torch.equal(g, g_theirs) and ours.dtype == theirs.dtype == torch.float32
        scale = g.abs().amax(-1).double().clamp_min(1e-6)
        err, verl_err = (ours - exact).abs().amax(-1), (theirs - exact).abs().amax(-1)
        assert (err <= verl_err + 1e-6 * scale).all(), (err / scale).max()
        assert (ours[m.to(DEV) == 0] == 0).all()
    assert len(runs) == 3
    # a fractional float mask: its lengths truncated to integers for the tail rule, as on the torch path
    frac = mask.float() * torch.where(torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed)) < 0.3,
                                      0.5, 1.0)
    kw = dict(token_level_rewards=rewards.to(DEV), response_mask=frac.to(DEV), index=index, old_log_probs=lp.to(DEV),
              sum_pi_squared=spi2.to(DEV))
    ours = R.compute_optimal_token_baseline_advantage(**kw, backend="triton")[0]
    torch_path = R.compute_optimal_token_baseline_advantage(**kw, backend="torch")[0]
    assert len(runs) == 4
    scale = rewards.abs().sum(-1, keepdim=True).to(DEV).clamp_min(1e-6)
    torch.testing.assert_close(ours / scale, torch_path / scale, rtol=0, atol=1e-5)


def test_optimal_token_baseline_kernel_leaves_large_groups_and_tensor_ids_to_torch(monkeypatch):
    """A group larger than the kernel's largest (``MAX_GROUP`` rows) or a tensor ``index`` (its groups'
    sizes would need a host read) takes the torch path: verl's float32 values bit for bit."""
    from rollbuf.kernels import token_baseline

    rewards, mask, labels, lp, spi2, isw = _otb_inputs(5, B=40, L=37)
    kw = dict(token_level_rewards=rewards.to(DEV), response_mask=mask.to(DEV), old_log_probs=lp.to(DEV),
              sum_pi_squared=spi2.to(DEV), rollout_is_weights=isw.to(DEV))
    theirs = core_algos.compute_optimal_token_baseline_advantage(index=index_of(labels, "str"), **kw)[0]
    monkeypatch.setattr(token_baseline, "MAX_GROUP", 4)
    assert torch.equal(R.compute_optimal_token_baseline_advantage(index=index_of(labels, "str"), backend="triton",
                                                                  **kw)[0], theirs)
    monkeypatch.undo()
    ids = torch.as_tensor(labels, device=DEV)
    assert torch.equal(R.compute_optimal_token_baseline_advantage(index=ids, backend="triton", **kw)[0],
                       core_algos.compute_optimal_token_baseline_advantage(index=labels, **kw)[0])


@pytest.mark.parametrize("name", OTB)
def test_the_benchmarks_restated_otb_loops_equal_verl(name):
    """benchmarks/llm_agents.py times verl's OTB and TIR-OTB restated (verl is not installed on the GPU
    machine): the restatements equal verl's functions."""
    from benchmarks import llm_agents

    rewards, mask, labels, lp, spi2, isw = _otb_inputs(7)
    restated = llm_agents.verl_otb if name == "optimal_token_baseline" else llm_agents.verl_tir_otb
    index = index_of(labels, "str")
    for w, zt in ((None, True), (isw, False)):
        theirs = core_algos.get_adv_estimator_fn(name)(rewards, mask, index, lp, spi2, w, zt)
        for a, b in zip(restated(rewards, mask, index, lp, spi2, w, zt), theirs, strict=True):
            assert torch.equal(a, b)


def test_optimal_token_baseline_zero_tail_and_groups():
    """One group of three rows (lengths 5, 3, 2), one of two tied rows (4, 4), one singleton: the unique
    longest row's baseline is 0 from the second longest's length on (its advantage is its return
    there), tied rows keep theirs, a singleton's advantage is its return; verl agrees."""
    L = 6
    lengths = torch.tensor([5, 3, 2, 4, 4, 6])
    mask = (torch.arange(L) < lengths[:, None]).long()
    rewards = torch.arange(6 * L, dtype=torch.float32).reshape(6, L) / 10
    labels = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    kw = dict(token_level_rewards=rewards, response_mask=mask, index=labels, old_log_probs=torch.full((6, L), -1.0),
              sum_pi_squared=torch.full((6, L), 0.3))
    adv, g = R.compute_optimal_token_baseline_advantage(**kw)
    assert torch.equal(adv[0, 3:5], g[0, 3:5]) and not torch.equal(adv[0, :3], g[0, :3])
    assert not torch.equal(adv[3, :4], g[3, :4]) and torch.equal(adv[5], g[5] * mask[5])
    torch.testing.assert_close(adv, core_algos.compute_optimal_token_baseline_advantage(**kw)[0])


def test_optimal_token_baselines_read_nothing_back():
    """No host read but the NumPy uid ranking (meta tensors have no data), and a clear error where
    verl's trainer gave the estimator no sum_pi_squared."""
    B, L = 6, 9
    labels = np.array(list("aabbbc"), dtype=object)
    t = [torch.empty(B, L, device="meta") for _ in range(4)]
    for name in OTB:
        a, g = R.ESTIMATORS[name](t[0], t[1], labels, old_log_probs=t[2], sum_pi_squared=t[3])
        assert a.shape == g.shape == (B, L) and a.device.type == "meta"
        with pytest.raises(ValueError, match="sum_pi_squared"):
            R.ESTIMATORS[name](torch.zeros(B, L), torch.ones(B, L), labels, old_log_probs=torch.zeros(B, L))


def test_register_replace_puts_them_under_verls_names():
    """register(replace=True): verl's own two names (the only ones its trainer hands old_log_probs and
    sum_pi_squared) give rollbuf's functions; verl's entries are put back after the test."""
    saved = {n: core_algos.ADV_ESTIMATOR_REGISTRY[n] for n in OTB}
    try:
        names = R.register(replace=True)
        assert set(OTB) <= set(names) and {"rollbuf_" + n for n in OTB} <= set(names)
        assert all(core_algos.get_adv_estimator_fn(n) is R.ESTIMATORS[n] for n in OTB)
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.update(saved)


def test_passk_all_equal_group_at_epsilon_zero():
    """docs/llm.md: with epsilon=0 an all-equal group's pass@k advantage is 0/0 at its best member. verl
    puts that NaN at the one member torch.topk picks, 0 at the others; rollbuf gives every member 0
    (a tie has no unique best). Every other group equals verl's."""
    r = torch.tensor([[1.0], [1.0], [1.0], [0.0], [2.0], [1.0]])
    kw = dict(token_level_rewards=r, response_mask=torch.ones(6, 1),
              index=np.array(["a", "a", "a", "b", "b", "b"], dtype=object), epsilon=0.0, config=_config())
    theirs, ours = VERL["grpo_passk"](**kw)[0][:, 0], OURS["grpo_passk"](**kw)[0][:, 0]
    assert int(theirs[:3].isnan().sum()) == 1 and theirs[:3].nan_to_num().tolist() == [0.0, 0.0, 0.0]
    assert ours[:3].tolist() == [0.0, 0.0, 0.0]
    torch.testing.assert_close(ours[3:], theirs[3:])


def test_passk_and_config_errors():
    rewards, mask, labels = batch(5)  # with groups of one
    with pytest.raises(ValueError, match="index"):
        R.compute_grpo_passk_outcome_advantage(rewards, mask, index_of(labels, "str"), config=_config())
    with pytest.raises(ValueError, match="config"):
        R.compute_grpo_passk_outcome_advantage(rewards, mask, index_of(labels, "str"))
    with pytest.raises(ValueError, match="config"):
        R.compute_reinforce_plus_plus_outcome_advantage(rewards, mask)
    with pytest.raises(ValueError, match="index"):
        R.compute_grpo_outcome_advantage(rewards, mask, index_of(labels, "str")[:-1])


def test_opo_all_masked_group_is_finite():
    """verl's OPO divides by the group's total length: NaN for a group whose rows are all masked
    (NaN·0 at every token); rollbuf uses the group's plain mean there (outputs 0)."""
    rewards = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 1.0]])
    mask = torch.tensor([[0, 0], [0, 0], [1, 1]])
    index = np.array(["a", "a", "b"], dtype=object)
    a, _ = R.compute_opo_outcome_advantage(rewards, mask, index)
    assert (a[:2] == 0).all() and a[2].tolist() == [3.0, 3.0]
    assert core_algos.compute_opo_outcome_advantage(rewards, mask, index)[0][:2].isnan().all()


@pytest.mark.parametrize("name", OUTCOME)
def test_no_host_read_of_a_value(name):
    """With a tensor index, the outcome estimators read no value back (meta tensors have none)."""
    rewards = torch.empty(12, 7, device="meta")
    mask = torch.empty(12, 7, dtype=torch.long, device="meta")
    a, r = _call(OURS[name], rewards, mask, torch.empty(12, dtype=torch.long, device="meta"), name)
    assert a.shape == r.shape == (12, 7) and a.device.type == "meta"


@pytest.mark.parametrize("seed", [0, 1])
def test_the_benchmarks_restatements_equal_verl(seed):
    """``python -m benchmarks llm-groups`` times verl's vectorized GRPO and RLOO restated (the GPU
    machine has no verl); the restatements give verl's own outputs, bit for bit."""
    from benchmarks import llm_groups

    rewards, mask, labels = batch(seed, singles=False)
    uid = np.array([f"uid-{k}" for k in labels], dtype=object)
    for ours, theirs in ((llm_groups.verl_grpo_vectorized, VERL["grpo_vectorized"]),
                         (llm_groups.verl_rloo_vectorized, VERL["rloo_vectorized"])):
        for got, want in zip(ours(rewards, mask, uid), theirs(rewards, mask, uid)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.interpret
@pytest.mark.parametrize("name", OUTCOME)
def test_outcome_estimators_on_the_triton_backend_equal_verl(name, monkeypatch):
    """The group statistics' kernel (fused GRPO and vectorized RLOO) under verl's estimators: verl's values."""
    from rollbuf import groups

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter takes CPU tensors
    orig = groups.outcome_advantages
    monkeypatch.setattr(groups, "outcome_advantages", lambda *a, **kw: orig(*a, **kw, backend="triton"))
    rewards, mask, labels = batch(1, singles=name != "grpo_passk")  # seed 1: test_outcome_estimators_equal_verl's
    ref_a, _ = _call(VERL[name], rewards, mask, index_of(labels, "str"), name)
    a, _ = _call(OURS[name], rewards.to(dev), mask.to(dev), index_of(labels, "int"), name)
    _close(a.cpu(), ref_a, torch.float32, name)
