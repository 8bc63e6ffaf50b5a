"""rollbuf.integrations.trl against the real TRL (1.16.0, tests/requirements-verl.txt installs it).

* TRL's own ``GRPOTrainer`` and rollbuf's run one training step each on a tiny Llama built from a
  config here (no download), with a tokenizer built here, under the same seed: the same completions
  and rewards, and the same advantages (to 1e-5 of the group's largest; exactly for equal-reward
  groups) for every ``scale_rewards`` mode, both booleans, both ``multi_objective_aggregation``
  modes, with reward functions that return None; multi-turn runs through a ``rollout_func`` with an
  ``env_mask`` (TRL's ``tool_mask``), truncated completions masked; the slice of a second process.
* :func:`grpo_advantages` alone against TRL's formula restated (TRL's ``nanstd``, the code of
  ``_generate_and_score_completions``), in float64: random rewards with NaNs, singleton and
  equal-reward groups, bf16 rewards; the restatement is held equal to TRL's trainer, bit for bit.
* Errors name the argument.
"""

from __future__ import annotations

import math

import pytest
import torch

trl = pytest.importorskip("trl", reason="tests/requirements-verl.txt installs TRL 1.16.0")
pytest.importorskip("datasets", reason="TRL's dependency (tests/requirements-verl.txt)")
pytest.importorskip("accelerate", reason="TRL's dependency (tests/requirements-verl.txt)")

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402

from rollbuf.integrations import trl as rb_trl  # noqa: E402

G = 4  # num_generations
WORDS = ["<pad>", "<eos>", "<unk>", *"abcdefghij"]
PROMPTS = ["aaaa", "ab", "cd", "ef"]


# ------------------------------------------------------------------------------ TRL's formula, restated

def trl_formula(rewards_per_func, num_generations, reward_weights, scale_rewards, aggregation="sum_then_normalize"):
    """TRL 1.16.0's advantages (``GRPOTrainer._generate_and_score_completions``), restated: the same
    operations, in the dtype of ``rewards_per_func`` (TRL's ``reward_weights`` are float32: a tensor of
    another dtype stands for a trainer whose weights are in that dtype)."""
    scale_rewards = {True: "group", False: "none"}.get(scale_rewards, scale_rewards)
    w = reward_weights if isinstance(reward_weights, torch.Tensor) else torch.tensor(reward_weights,
                                                                                     dtype=torch.float32)
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * w.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
        if scale_rewards in ["group", "none"]:
            std = (nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
                   if num_generations > 1 else torch.zeros_like(rewards))
        else:
            std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        adv = rewards - mean
        if scale_rewards != "none":
            adv = adv / (std + 1e-4)
    else:
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
        reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, rewards_per_func.shape[1])
        rewards = (reward_k * w.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        adv = (rewards - torch.nanmean(rewards)) / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


def assert_rows_close(got, want, num_generations, aggregation="sum_then_normalize", rtol=1e-5):
    """Each group's advantages to ``rtol`` of the group's largest |advantage| (a group of zeros exactly);
    ``"normalize_then_sum"``, whose last step standardises over the batch: of the batch's largest."""
    assert got.shape == want.shape
    g, w = got.double().view(-1, num_generations), want.double().view(-1, num_generations)
    scale = w.abs().amax(1, keepdim=True) if aggregation == "sum_then_normalize" else w.abs().max()
    bad = (g - w).abs() > rtol * scale
    assert not bad.any(), f"groups {bad.any(1).nonzero().flatten().tolist()}:\n{g[bad.any(1)]}\n{w[bad.any(1)]}"


def _random_rewards(n_groups, g, f, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_groups * g, f, generator=gen)
    x[torch.rand(x.shape, generator=gen) < 0.15] = math.nan           # a function returned None
    x[torch.rand(x.shape[0], generator=gen) < 0.1] = math.nan         # no function scored the row
    if n_groups > 1:
        x[:g] = torch.randn(1, f, generator=gen)                       # an equal-reward group
    if n_groups > 2 and g > 1:
        x[g:2 * g - 1] = math.nan                                      # a group with one scored member
    return x.to(dtype)


SCALES = ["group", "batch", "none", True, False]
CASES = [(s, "sum_then_normalize") for s in SCALES] + [("group", "normalize_then_sum"), ("none", "normalize_then_sum")]


# ------------------------------------------------------------------------ the advantage function alone

@pytest.mark.parametrize(("scale", "aggregation"), CASES)
@pytest.mark.parametrize(("n_groups", "g", "f"), [(1, 1, 1), (6, 1, 2), (5, 2, 1), (7, 3, 3), (9, 4, 2), (3, 8, 1)])
def test_against_trl_formula(scale, aggregation, n_groups, g, f):
    x = _random_rewards(n_groups, g, f, seed=n_groups * 100 + g * 10 + f)
    w = torch.linspace(1.0, 0.5, f)
    got = rb_trl.grpo_advantages(x, g, w, scale_rewards=scale, multi_objective_aggregation=aggregation)
    want = trl_formula(x.double(), g, w, scale, aggregation)
    assert got.dtype == torch.float32
    assert_rows_close(got, want, g, aggregation)


@pytest.mark.interpret
@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")  # NumPy on the kernel's idle lanes
@pytest.mark.parametrize(("scale", "aggregation"), CASES)
def test_the_kernel_backend_gives_the_same(scale, aggregation):
    """backend="triton" (the group-statistics kernel, which "auto" picks on CUDA tensors; here under
    Triton's interpreter on the CPU) against the torch path: equal groups exactly 0 on both."""
    pytest.importorskip("triton")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = _random_rewards(9, 4, 2, seed=7).to(dev)
    kw = {"scale_rewards": scale, "multi_objective_aggregation": aggregation}
    got = rb_trl.grpo_advantages(x, 4, [1.0, 0.5], backend="triton", **kw)
    want = rb_trl.grpo_advantages(x, 4, [1.0, 0.5], backend="torch", **kw)
    assert got.device.type == dev and got.dtype == torch.float32
    assert_rows_close(got.cpu(), want.cpu(), 4, aggregation, rtol=2e-6)
    if aggregation == "sum_then_normalize":
        assert (got[:4] == 0).all() and (want[:4] == 0).all()


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_equal_reward_groups_are_exactly_zero(scale, dtype):
    x = torch.tensor([0.1] * 3 + [7.3] * 3 + [-2.9] * 3 + [0.1, 0.2, 0.4], dtype=dtype)
    got = rb_trl.grpo_advantages(x, 3, scale_rewards=scale)
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert (got[:9] == 0).all(), got
    assert (got[9:] != 0).all()


def test_equal_rewards_where_trl_float32_mean_rounds():
    """Seven rewards of 0.3: TRL's float32 mean is one rounding off, and the division by std + 1e-4 makes
    advantages of 3e-4 of it; rollbuf's are 0."""
    x = torch.full((7, 1), 0.3)
    assert (rb_trl.grpo_advantages(x, 7) == 0).all()
    assert trl_formula(x, 7, [1.0], "group").abs().min() > 1e-4


def test_bf16_rewards_get_float32_statistics():
    """bf16 rewards [256, 256, 256, 258]: their mean, 256.5, is 256 in bf16. TRL 1.16's default
    aggregation multiplies the rewards by its float32 weights first (float32 statistics); with bf16
    weights, or in ``"normalize_then_sum"`` (per-function statistics in the reward matrix's dtype), the
    statistics are bf16's."""
    x = torch.tensor([[256.0], [256.0], [256.0], [258.0]], dtype=torch.bfloat16)
    got = rb_trl.grpo_advantages(x, 4, scale_rewards="none")
    assert got.dtype == torch.float32 and got.tolist() == [-0.5, -0.5, -0.5, 1.5]
    assert trl_formula(x, 4, torch.ones(1, dtype=torch.bfloat16), "none").tolist() == [0.0, 0.0, 0.0, 2.0]
    for scale in ("group", "batch"):
        want = trl_formula(x.double(), 4, [1.0], scale)
        assert_rows_close(rb_trl.grpo_advantages(x, 4, scale_rewards=scale), want, 4)
    y = torch.cat([x, torch.tensor([[0.0], [1.0], [0.0], [1.0]], dtype=torch.bfloat16)])
    want = trl_formula(y.double(), 4, [1.0], "group", "normalize_then_sum")
    got = rb_trl.grpo_advantages(y, 4, multi_objective_aggregation="normalize_then_sum")
    assert_rows_close(got, want, 4, "normalize_then_sum")
    in_bf16 = trl_formula(y, 4, [1.0], "group", "normalize_then_sum")
    assert (in_bf16.double() - want).abs().max() > 0.2  # e.g. 0.72 for 0.94


def test_singleton_and_unscored():
    x = torch.tensor([[1.0], [2.0], [math.nan], [5.0]])
    for scale in SCALES:  # groups of one: 0 whatever the scaling (TRL: std 0 or NaN, then 0)
        assert rb_trl.grpo_advantages(x, 1, scale_rewards=scale).tolist() == [0.0] * 4
    y = torch.tensor([[1.0, math.nan], [math.nan, math.nan], [3.0, 1.0], [math.nan, 2.0]])
    for scale in SCALES:
        got = rb_trl.grpo_advantages(y, 2, [1.0, 2.0], scale_rewards=scale)
        assert got[:2].tolist() == [0.0, 0.0]  # one scored member, one unscored row
        assert_rows_close(got, trl_formula(y.double(), 2, [1.0, 2.0], scale), 2)
    assert rb_trl.grpo_advantages(torch.full((4, 2), math.nan), 2).tolist() == [0.0] * 4
    assert rb_trl.grpo_advantages(torch.zeros(0, 2), 2).shape == (0,)


def test_epsilon_and_float64():
    x = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    got = rb_trl.grpo_advantages(x, 4, epsilon=0.0)
    assert got.dtype == torch.float64
    want = (x - x.mean()) / x.std()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize(("kwargs", "err", "match"), [
    ({"rewards_per_func": torch.ones(4, dtype=torch.int64)}, TypeError, "rewards_per_func"),
    ({"rewards_per_func": [1.0, 2.0]}, TypeError, "rewards_per_func"),
    ({"rewards_per_func": torch.ones(4, 1, 1)}, ValueError, "rewards_per_func"),
    ({"rewards_per_func": torch.ones(4, 0)}, ValueError, "rewards_per_func"),
    ({"rewards_per_func": torch.tensor([1.0, math.inf, 0.0, 0.0])}, ValueError, "rewards_per_func.*row 1"),
    ({"num_generations": 3}, ValueError, "num_generations"),
    ({"num_generations": 0}, ValueError, "num_generations"),
    ({"num_generations": True}, ValueError, "num_generations"),
    ({"reward_weights": [1.0, 2.0]}, ValueError, "reward_weights"),
    ({"scale_rewards": "std"}, ValueError, "scale_rewards"),
    ({"scale_rewards": None}, ValueError, "scale_rewards"),
    ({"multi_objective_aggregation": "sum"}, ValueError, "multi_objective_aggregation"),
    ({"epsilon": -1.0}, ValueError, "epsilon"),
    ({"backend": "numba"}, ValueError, "backend"),
])
def test_bad_arguments_are_named(kwargs, err, match):
    args = {"rewards_per_func": torch.ones(4, 1), "num_generations": 2, **kwargs}
    with pytest.raises(err, match=match):
        rb_trl.grpo_advantages(**args)


def test_check_tool_mask():
    rb_trl.check_tool_mask(None, [[1, 2]])
    rb_trl.check_tool_mask([[1, 0], [1]], [[5, 6], [7]])
    with pytest.raises(ValueError, match="tool_mask row 1 has 3 entries for a completion of 1 tokens"):
        rb_trl.check_tool_mask([[1, 0], [1, 0, 1]], [[5, 6], [7]])
    with pytest.raises(ValueError, match="tool_mask must hold one row per completion"):
        rb_trl.check_tool_mask([[1, 0]], [[5, 6], [7]])


# --------------------------------------------------------------- one training step, TRL's and rollbuf's

def _tokenizer():
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def _model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                        max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=None))


def _first_of(prompts, prompt, k=0):
    return [i for i, p in enumerate(prompts) if p == prompt][k]


def letters(prompts, completions, **kwargs):
    """Dyadic rewards (TRL's float32 sums exact); prompt "aaaa": an equal-reward group; the first
    completion of "ab": None."""
    out = [1.0 if p == "aaaa" else c.count("a") + 0.5 * c.count("b") - 0.25 * len(c.replace(" ", ""))
           for p, c in zip(prompts, completions)]
    out[_first_of(prompts, "ab")] = None
    return out


def cs(prompts, completions, **kwargs):
    """A second reward: "aaaa" equal again; the first two completions of "ab" None (the first unscored)."""
    out = [2.0 if p == "aaaa" else float(c.count("c") - c.count("d")) for p, c in zip(prompts, completions)]
    for k in (0, 1):
        out[_first_of(prompts, "ab", k)] = None
    return out


class _Capture:
    """Keeps what each step's ``_calculate_rewards`` and ``_generate_and_score_completions`` returned."""

    def _calculate_rewards(self, *args, **kwargs):
        rewards = super()._calculate_rewards(*args, **kwargs)
        self.captured_rewards.append(rewards.clone())
        return rewards

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.captured.append({k: v.clone() for k, v in out.items() if isinstance(v, torch.Tensor)})
        return out


class TRLTrainer(_Capture, trl.GRPOTrainer):
    pass


class RollbufTrainer(_Capture, rb_trl.GRPOTrainer):
    pass


def _train(cls, tmp_path, reward_funcs=(letters,), **config):
    config = {"per_device_train_batch_size": len(PROMPTS) * G, "num_generations": G, "max_completion_length": 6,
              **config}
    args = trl.GRPOConfig(output_dir=str(tmp_path / cls.__name__), use_cpu=True, bf16=False, max_steps=1, seed=0,
                          report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, **config)
    trainer = cls(model=_model(), reward_funcs=list(reward_funcs), args=args, processing_class=_tokenizer(),
                  train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    trainer.captured, trainer.captured_rewards = [], []
    trainer.train()
    assert len(trainer.captured) == 1 and len(trainer.captured_rewards) == 1
    return trainer


def _same_step(theirs, ours):
    """The same completions and rewards (the seed and the model are the same): a comparison of advantages."""
    a, b = theirs.captured[0], ours.captured[0]
    assert torch.equal(a["completion_ids"], b["completion_ids"])
    torch.testing.assert_close(theirs.captured_rewards[0], ours.captured_rewards[0], equal_nan=True, rtol=0, atol=0)
    return a["advantages"], b["advantages"]


@pytest.mark.parametrize(("scale", "aggregation"), CASES)
def test_one_step_same_advantages_as_trl(tmp_path, scale, aggregation):
    funcs = (letters,) if aggregation == "sum_then_normalize" and scale != "batch" else (letters, cs)
    kw = {"scale_rewards": scale, "multi_objective_aggregation": aggregation, "reward_weights": [1.0, 0.5][:len(funcs)]}
    theirs, ours = _train(TRLTrainer, tmp_path, funcs, **kw), _train(RollbufTrainer, tmp_path, funcs, **kw)
    want, got = _same_step(theirs, ours)
    rewards = ours.captured_rewards[0]
    assert torch.equal(want, trl_formula(rewards, G, kw["reward_weights"], scale, aggregation))  # the restatement
    assert_rows_close(got, want, G, aggregation)
    assert torch.equal(got, rb_trl.grpo_advantages(rewards, G, kw["reward_weights"], scale_rewards=scale,
                                                   multi_objective_aggregation=aggregation))  # rollbuf's, not TRL's
    groups = rewards.nan_to_num(-1.0).view(-1, G, rewards.shape[1])
    varied = (groups != groups[:, :1]).any(2).any(1)
    assert varied.any() and not varied.all(), "the batch must hold equal-reward groups and others"
    assert rewards.isnan().any()  # a reward function returned None
    if aggregation == "sum_then_normalize":
        equal = ~varied.repeat_interleave(G)
        assert (got[equal] == 0).all() and (want[equal] == 0).all()
    assert list(ours._logs["advantages"]) == got.tolist()  # the completions table logs what the loss used


def test_bf16_reward_matrix_float32_statistics(tmp_path):
    """Under a bf16 default dtype TRL's reward matrix is bf16, and ``"normalize_then_sum"`` takes its
    per-function statistics in bf16; rollbuf's trainer takes them in float32 from the same rewards."""
    kw = {"reward_weights": [1.0, 0.5], "multi_objective_aggregation": "normalize_then_sum"}
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        theirs = _train(TRLTrainer, tmp_path, (letters, cs), **kw)
        ours = _train(RollbufTrainer, tmp_path, (letters, cs), **kw)
    finally:
        torch.set_default_dtype(default)
    theirs_adv, got = _same_step(theirs, ours)
    rewards = ours.captured_rewards[0]
    assert rewards.dtype == torch.bfloat16 and got.dtype == torch.float32
    want = trl_formula(rewards.double(), G, kw["reward_weights"], "group", "normalize_then_sum")
    assert_rows_close(got, want, G, "normalize_then_sum")
    assert (theirs_adv.double() - want).abs().max() > 1e-3


def test_second_process_gets_its_slice(tmp_path, monkeypatch):
    """As process 1 of two: the rewards gathered are another process's then this one's, the advantages of
    both are computed, and this process keeps rows n to 2n (TRL's slice)."""
    import accelerate

    class _TwoProcesses(trl.GRPOTrainer):
        def _calculate_rewards(self, *args, **kwargs):
            rewards = super()._calculate_rewards(*args, **kwargs)
            return torch.cat([rewards.flip(0) * 3 - 1, rewards])

    class Theirs(_Capture, _TwoProcesses):
        pass

    class Ours(_Capture, rb_trl.GRPOTrainer, _TwoProcesses):
        pass

    monkeypatch.setattr(accelerate.Accelerator, "process_index", property(lambda self: 1))
    theirs, ours = _train(Theirs, tmp_path, scale_rewards="batch"), _train(Ours, tmp_path, scale_rewards="batch")
    want, got = _same_step(theirs, ours)
    assert got.shape == (len(PROMPTS) * G,) and ours.captured_rewards[0].shape[0] == 2 * len(PROMPTS) * G
    assert_rows_close(got, want, G)
    both = rb_trl.grpo_advantages(ours.captured_rewards[0], G, scale_rewards="batch")
    assert torch.equal(got, both[len(PROMPTS) * G:]) and not torch.equal(got, both[:len(PROMPTS) * G])


# -------------------------------------------------------------------------------------- multi-turn

def _rollout(longer_mask_row=None):
    """A ``rollout_func``: completions of model tokens, a tool reply (env_mask 0) and model tokens again,
    every third one truncated (no EOS); ``longer_mask_row``: that row's env_mask two entries too long."""
    def rollout_func(prompts, trainer):
        prompt_ids = [trainer.processing_class(p)["input_ids"] for p in prompts]
        completion_ids, env_mask = [], []
        for i in range(len(prompts)):
            body = [3 + i % 5, 4 + i % 3, 8, 9, 3 + i % 7][: 3 + i % 3]
            ids, mask = body + [10, 11] + body[:2], [1] * len(body) + [0, 0] + [1, 1]
            if i % 3:
                ids, mask = ids + [1], mask + [1]  # EOS; the others are truncated
            completion_ids.append(ids)
            env_mask.append(mask + [1, 1] if i == longer_mask_row else mask)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None, "env_mask": env_mask}
    return rollout_func


def _train_multi_turn(cls, tmp_path, rollout_func, mask_truncated=True):
    targs = trl.GRPOConfig(output_dir=str(tmp_path / cls.__name__), use_cpu=True, bf16=False, max_steps=1, seed=0,
                           report_to="none", save_strategy="no", disable_tqdm=True,
                           per_device_train_batch_size=len(PROMPTS) * G, num_generations=G, max_completion_length=12,
                           mask_truncated_completions=mask_truncated)
    trainer = cls(model=_model(), reward_funcs=[letters], args=targs, processing_class=_tokenizer(),
                  train_dataset=Dataset.from_dict({"prompt": PROMPTS}), rollout_func=rollout_func)
    trainer.captured, trainer.captured_rewards = [], []
    trainer.train()
    return trainer


@pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")
def test_multi_turn_same_advantages_and_masks(tmp_path):
    theirs = _train_multi_turn(TRLTrainer, tmp_path, _rollout())
    ours = _train_multi_turn(RollbufTrainer, tmp_path, _rollout())
    want, got = _same_step(theirs, ours)
    assert_rows_close(got, want, G)
    a, b = theirs.captured[0], ours.captured[0]
    assert torch.equal(a["tool_mask"], b["tool_mask"]) and torch.equal(a["completion_mask"], b["completion_mask"])
    truncated = b["completion_mask"].sum(1) == 0
    assert truncated.any() and not truncated.all()
    assert (b["tool_mask"][truncated] == 0).all() and (b["tool_mask"][~truncated] == 0).any()


@pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")
def test_tool_mask_longer_than_its_completion_is_named(tmp_path):
    """A row's env_mask two entries longer than its completion. Row 0 (7 tokens, the longest 10): the
    padded widths agree and TRL trains on the misaligned mask without a word; row 2 (the longest): TRL
    fails on a shape. rollbuf's trainer names the argument and the row in both."""
    _train_multi_turn(TRLTrainer, tmp_path, _rollout(longer_mask_row=0))
    with pytest.raises(ValueError, match="tool_mask row 0 has 9 entries for a completion of 7 tokens"):
        _train_multi_turn(RollbufTrainer, tmp_path, _rollout(longer_mask_row=0))
    with pytest.raises(RuntimeError, match="size of tensor"):
        _train_multi_turn(TRLTrainer, tmp_path, _rollout(longer_mask_row=2))
    with pytest.raises(ValueError, match="tool_mask row 2 has 12 entries for a completion of 10 tokens"):
        _train_multi_turn(RollbufTrainer, tmp_path, _rollout(longer_mask_row=2))


@pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")
def test_truncated_completions_leave_the_tool_mask(tmp_path):
    """A TRL that leaves ``tool_mask`` set on truncated completions (before 1.16): rollbuf's trainer zeroes it
    there (TRL 1.16 does it itself: the multi-turn test above)."""
    class Unmasked(trl.GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            out["tool_mask"] = torch.ones_like(out["tool_mask"])
            return out

    class OldTRL(_Capture, Unmasked):
        pass

    class Ours(_Capture, rb_trl.GRPOTrainer, Unmasked):
        pass

    old, ours = _train_multi_turn(OldTRL, tmp_path, _rollout()), _train_multi_turn(Ours, tmp_path, _rollout())
    truncated = ours.captured[0]["completion_mask"].sum(1) == 0
    assert truncated.any() and (old.captured[0]["tool_mask"][truncated] == 1).all()
    assert (ours.captured[0]["tool_mask"][truncated] == 0).all()
    assert (ours.captured[0]["tool_mask"][~truncated] == 1).all()
    plain = _train_multi_turn(Ours, tmp_path, _rollout(), mask_truncated=False)  # the option off: left as it is
    assert (plain.captured[0]["tool_mask"] == 1).all()


def test_a_trl_that_does_not_score_through_calculate_rewards_is_refused(tmp_path, monkeypatch):
    trainer = _train(RollbufTrainer, tmp_path)
    monkeypatch.setattr(trl.GRPOTrainer, "_generate_and_score_completions",
                        lambda self, inputs: {"advantages": torch.zeros(len(inputs))})
    with pytest.raises(RuntimeError, match="_calculate_rewards"):
        rb_trl.GRPOTrainer._generate_and_score_completions(trainer, [{}] * 4)
