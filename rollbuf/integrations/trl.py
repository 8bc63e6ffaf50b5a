"""TRL's ``GRPOTrainer`` with its advantages from :mod:`rollbuf.groups` (tested with TRL 1.16.0).

:class:`GRPOTrainer` is TRL's trainer, constructed and configured as TRL's (every ``GRPOConfig``
field means what it means there), whose per-completion advantages are :func:`grpo_advantages` of
the rewards TRL scored: one :func:`rollbuf.groups.group_stats` call (two for
``multi_objective_aggregation="normalize_then_sum"``), statistics accumulated in float64 and
returned in float32 whatever the rewards' dtype (float64 rewards stay float64)::

    from rollbuf.integrations.trl import GRPOTrainer   # in place of: from trl import GRPOTrainer

The numbers are TRL's formula (docs/howto/trl.md): per group of ``num_generations`` consecutive
completions, ``A = (r − mean) / (std + 1e-4)`` with ``scale_rewards="group"`` (``True``), the
batch's std with ``"batch"``, ``A = r − mean`` with ``"none"`` (``False``); ``r`` the
``reward_weights``-weighted sum of the reward functions' outputs, a ``None`` output (NaN) left out
of the sum, a completion that every function left unscored out of its group's statistics and given
advantage 0. Where TRL's statistics round (float32 sums; bf16 ones where the rewards reach them in
bf16), rollbuf's do not: a group of equal rewards gets advantages of exactly 0 (seven rewards of 0.3
get 3e-4 from TRL's), and bf16 rewards [256, 256, 256, 258] (``scale_rewards="none"``) get
[−0.5, −0.5, −0.5, 1.5], where statistics in bf16 give [0, 0, 0, 2].

Design. TRL has no advantage hook: the advantages are computed inline, in the middle of the long
``_generate_and_score_completions`` (generation, scoring, reference log-probabilities, logging), and
that method's output carries the advantages but not the rewards. Copying the method would pin this
module to one TRL release line by line. Instead :class:`GRPOTrainer` overrides three methods and
calls TRL's own in each:

* ``_calculate_rewards`` (TRL's scoring helper, which returns the rewards of every process,
  ``[N, num_reward_funcs]``): kept as TRL computes them, for the step below;
* ``_generate_and_score_completions``: TRL's method runs whole; then the advantages of all ``N``
  completions are recomputed from the kept rewards (:meth:`GRPOTrainer.compute_advantages`, a hook
  a subclass may override), this process's slice replaces ``output["advantages"]`` (TRL's slice:
  rows ``process_index · n`` to ``(process_index + 1) · n``), and the advantages TRL logged for the
  completions table are replaced by these. TRL's own advantage formula still runs (a few ``[N]``
  operations) and is discarded; its logged reward metrics (``frac_reward_zero_std``, ...) are TRL's.
  With ``mask_truncated_completions``, a multi-turn ``tool_mask`` is zeroed on every completion
  whose ``completion_mask`` is (TRL 1.16 does this itself; earlier releases left ``tool_mask`` set
  on truncated completions);
* ``_generate``: TRL's, then :func:`check_tool_mask`: a multi-turn ``tool_mask`` row (from the
  tool-call loop, or a ``rollout_func``'s ``env_mask``) of another length than its completion (a
  tool round whose retokenisation shortens the completion) is a ``ValueError`` naming ``tool_mask``
  and the row, where TRL fails later with a shape error, or misaligns the mask silently when the
  padded widths happen to agree.

If a later TRL no longer scores through ``_calculate_rewards``, the trainer raises a
``RuntimeError`` on the first step instead of training on TRL's advantages unnoticed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

try:
    import trl
except ImportError as exc:  # pragma: no cover - exercised only without TRL
    raise ImportError('rollbuf.integrations.trl needs TRL: pip install -e ".[trl]" (TRL 1.16.0)') from exc

from rollbuf import groups

__all__ = ["GRPOTrainer", "grpo_advantages", "check_tool_mask", "SCALE_REWARDS", "AGGREGATIONS"]

#: The ``scale_rewards`` modes (``True`` is ``"group"`` and ``False`` ``"none"``, as ``GRPOConfig`` maps them).
SCALE_REWARDS = ("group", "batch", "none")
#: The ``multi_objective_aggregation`` modes.
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def _scale_mode(scale_rewards) -> str:
    if isinstance(scale_rewards, bool):  # the booleans of older configs, as GRPOConfig maps them
        return "group" if scale_rewards else "none"
    if not isinstance(scale_rewards, str) or scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS} or a bool, got {scale_rewards!r}")
    return scale_rewards


def _rewards(rewards_per_func) -> torch.Tensor:
    """``[N, F]`` float32 (float64 stays) rewards, checked: NaN allowed (an unscored reward), ±inf not."""
    if not isinstance(rewards_per_func, torch.Tensor) or not rewards_per_func.is_floating_point():
        raise TypeError(f"rewards_per_func must be a floating-point torch.Tensor, got "
                        f"{getattr(rewards_per_func, 'dtype', type(rewards_per_func).__name__)}")
    x = rewards_per_func
    if x.dim() == 1:
        x = x.unsqueeze(1)
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"rewards_per_func must be [N] or [N, num_reward_funcs], got shape {tuple(x.shape)}")
    x = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    if bool(x.isinf().any()):
        row, col = (int(i) for i in x.isinf().nonzero()[0])
        raise ValueError(f"rewards_per_func must be finite or NaN (NaN: a reward function returned None); "
                         f"row {row}, reward function {col} is {float(x[row, col])}")
    return x


def _weights(reward_weights, x) -> torch.Tensor:
    f = x.shape[1]
    if reward_weights is None:
        return x.new_ones(f)
    w = torch.as_tensor(reward_weights)
    if w.dim() != 1 or w.numel() != f or w.is_complex() or w.dtype == torch.bool:
        raise ValueError(f"reward_weights must hold one real weight per reward function ({f}), "
                         f"got {w.dtype} shape {tuple(w.shape)}")
    return w.to(device=x.device, dtype=x.dtype)


def _generations(num_generations, n: int) -> int:
    if isinstance(num_generations, bool) or not isinstance(num_generations, numbers.Integral) or num_generations < 1:
        raise ValueError(f"num_generations must be an int >= 1, got {num_generations!r}")
    num_generations = int(num_generations)
    if n % num_generations:
        raise ValueError(f"num_generations ({num_generations}) must divide the number of completions ({n}): "
                         "a group is num_generations consecutive rows of rewards_per_func")
    return num_generations


def _sum_then_normalize(x, w, g: int, mode: str, eps: float, backend: str) -> torch.Tensor:
    """TRL's default: the weighted sum of the rewards, its group mean, the group's or the batch's std;
    one group call (the batch's statistics are a group of their own, over a second copy of the scores)."""
    n, dev = x.shape[0], x.device
    r = (x * w).nansum(1)
    scored = ~x.isnan().all(1)
    row = torch.arange(n, device=dev)
    ids = torch.where(scored, row // g, n // g + row)  # an unscored completion: a group of its own, left out
    scores, num = torch.where(scored, r, 0), n // g + n
    if mode == "batch":
        scores, ids = torch.cat([scores, scores]), torch.cat([ids, torch.where(scored, num, num + 1 + row)])
        num = num + 1 + n
    s = groups.group_stats(scores, ids, num, backend=backend)
    adv = torch.where(scored, r, math.nan) - s.mean[:n]
    return adv if mode == "none" else adv / (s.std[-n:] + eps)  # "batch": the second copy's std


def _normalize_then_sum(x, w, g: int, eps: float, backend: str) -> torch.Tensor:
    """TRL's ``"normalize_then_sum"``: each reward function standardised within its group (one group call
    over ``[N·F]`` cells), the weighted sum, then standardised over the batch (a second call)."""
    n, f = x.shape
    dev = x.device
    unscored = x.isnan()
    cell = torch.arange(n * f, device=dev).view(n, f)
    ids = torch.where(unscored, n // g * f + cell, (cell // f) // g * f + cell % f)
    s = groups.group_stats(torch.where(unscored, 0, x).reshape(-1), ids.reshape(-1), n // g * f + n * f,
                           backend=backend)
    z = (x - s.mean.view(n, f)) / (s.std.view(n, f) + eps)
    r = (z * w).nansum(1)
    scored = ~unscored.all(1)
    row = torch.arange(n, device=dev)
    b = groups.group_stats(torch.where(scored, r, 0), torch.where(scored, 0, 1 + row), 1 + n, backend=backend)
    return (torch.where(scored, r, math.nan) - b.mean) / (b.std + eps)


def grpo_advantages(rewards_per_func, num_generations: int, reward_weights=None, *, scale_rewards="group",
                    multi_objective_aggregation: str = "sum_then_normalize", epsilon: float = 1e-4,
                    backend: str = "auto") -> torch.Tensor:
    """TRL 1.16's GRPO advantages ``[N]`` from ``rewards_per_func`` ``[N, num_reward_funcs]`` (or ``[N]``: one
    function), NaN where a reward function returned None; a group is ``num_generations`` consecutive rows.
    ``reward_weights`` ``[num_reward_funcs]`` (None: ones); ``scale_rewards``: :data:`SCALE_REWARDS` or a
    bool; ``multi_objective_aggregation``: :data:`AGGREGATIONS` (``"normalize_then_sum"`` ignores
    ``scale_rewards``, as TRL does); ``epsilon``: the std's offset, TRL's 1e-4. Statistics by
    :func:`rollbuf.groups.group_stats` (float64 sums, float32 results; float64 rewards stay float64):
    equal rewards give exactly 0; a completion no function scored gets 0 and is left out of its group's
    statistics, as is a NaN reward out of its function's (TRL's nanmean and nanstd). ``backend``:
    :func:`rollbuf.groups.group_stats`'s (``"auto"``: its Triton kernel for CUDA tensors). Bad arguments are
    a ``ValueError`` (``TypeError`` for ``rewards_per_func`` not a float tensor) naming the argument."""
    x = _rewards(rewards_per_func)
    g = _generations(num_generations, x.shape[0])
    w = _weights(reward_weights, x)
    mode = _scale_mode(scale_rewards)
    if multi_objective_aggregation not in AGGREGATIONS:
        raise ValueError(f"multi_objective_aggregation must be one of {AGGREGATIONS}, "
                         f"got {multi_objective_aggregation!r}")
    eps = groups.outcome_epsilon(epsilon)
    if backend not in groups.BACKENDS:
        raise ValueError(f"backend must be one of {groups.BACKENDS}, got {backend!r}")
    if x.shape[0] == 0:
        return x.new_zeros(0)
    adv = _sum_then_normalize(x, w, g, mode, eps, backend) if multi_objective_aggregation == AGGREGATIONS[0] \
        else _normalize_then_sum(x, w, g, eps, backend)
    return torch.nan_to_num(adv, nan=0.0)


def check_tool_mask(tool_mask: Sequence[Any] | None, completion_ids: Sequence[Any]) -> None:
    """A ``ValueError`` naming ``tool_mask`` unless each of its rows (1 = a model token, 0 = a tool's or the
    environment's) is as long as its row of ``completion_ids`` (token lists, or 1-d tensors); None passes."""
    if tool_mask is None:
        return
    if len(tool_mask) != len(completion_ids):
        raise ValueError(f"tool_mask must hold one row per completion ({len(completion_ids)}), got {len(tool_mask)}")
    bad = next((i for i, (m, c) in enumerate(zip(tool_mask, completion_ids, strict=True)) if len(m) != len(c)), None)
    if bad is not None:
        raise ValueError(
            f"tool_mask row {bad} has {len(tool_mask[bad])} entries for a completion of {len(completion_ids[bad])} "
            "tokens: each row must be as long as its completion_ids row (tool_mask comes from the tool-call loop, "
            "or from a rollout_func's env_mask; a tool round whose retokenisation shortens the completion "
            "leaves it longer)")


class GRPOTrainer(trl.GRPOTrainer):
    """``trl.GRPOTrainer`` whose advantages are :meth:`compute_advantages` (:func:`grpo_advantages` of the
    rewards TRL scored, with the trainer's ``reward_weights``, ``scale_rewards`` and
    ``multi_objective_aggregation``); the constructor and everything else are TRL's. The module's
    docstring says which methods it overrides and why."""

    def compute_advantages(self, rewards_per_func: torch.Tensor, num_generations: int) -> torch.Tensor:
        """The advantages ``[N]`` of every process's completions from their rewards ``[N, num_reward_funcs]``
        (NaN: unscored); a subclass may return others (``[N]``, or ``[N, completion length]``: TRL's loss
        takes both; the completions table then keeps the ``[N]`` advantages TRL logged)."""
        return grpo_advantages(rewards_per_func, num_generations, self.reward_weights,
                               scale_rewards=self.scale_rewards,
                               multi_objective_aggregation=self.multi_objective_aggregation)

    def _calculate_rewards(self, *args, **kwargs):
        rewards = super()._calculate_rewards(*args, **kwargs)
        self._rollbuf_rewards = rewards
        return rewards

    def _generate(self, *args, **kwargs):
        out = super()._generate(*args, **kwargs)
        check_tool_mask(out[2], out[1])  # TRL 1.16's order: prompt_ids, completion_ids, tool_mask, ...
        return out

    def _generate_and_score_completions(self, inputs):
        self._rollbuf_rewards = None
        output = super()._generate_and_score_completions(inputs)
        rewards, self._rollbuf_rewards = self._rollbuf_rewards, None
        if rewards is None:
            raise RuntimeError(f"rollbuf.integrations.trl: TRL {trl.__version__} did not score the completions "
                               "through GRPOTrainer._calculate_rewards (the module follows TRL 1.16.0)")
        num_generations = self.num_generations if self.model.training else self.num_generations_eval
        advantages = self.compute_advantages(rewards, num_generations)
        n = output["completion_ids"].shape[0]  # this process's completions
        start = self.accelerator.process_index * n
        if advantages.shape[0] < start + n:
            raise RuntimeError(f"compute_advantages returned {advantages.shape[0]} rows; process "
                               f"{self.accelerator.process_index} needs rows {start} to {start + n}")
        output["advantages"] = advantages[start:start + n]
        self._relog_advantages(advantages)
        if self.mask_truncated_completions and "tool_mask" in output:
            output["tool_mask"] = output["tool_mask"] * output["completion_mask"].any(1, keepdim=True)
        return output

    def _relog_advantages(self, advantages: torch.Tensor) -> None:
        """The per-completion advantages TRL logged for this batch (the completions table), replaced by these."""
        logged = getattr(self, "_logs", {}).get("advantages")
        if logged is None or advantages.dim() != 1:
            return
        for _ in range(min(advantages.shape[0], len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())
