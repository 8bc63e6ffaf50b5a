"""Stable-Baselines3: ``RolloutBuffer.compute_returns_and_advantage`` without the loop over time.

SB3's on-policy algorithms (PPO, A2C) fill a ``RolloutBuffer`` — NumPy arrays laid out
**time-major** ``[buffer_size, n_envs]`` — and then call
``rollout_buffer.compute_returns_and_advantage(last_values, dones)``, a Python loop over the
``buffer_size`` steps. :func:`compute_returns_and_advantage` fills ``advantages`` and ``returns`` with
the same numbers in one call of :func:`rollbuf.functional.advantages` (GAE advantages only,
``backend="auto"``), reading the buffer's arrays in place (``[T, N]`` NumPy → transposed ``[N, T]``
torch views, no copy) and ``done`` from a ``[T, N]`` bool array built next to them.
:class:`RolloutBuffer` and :class:`DictRolloutBuffer` are SB3's buffers with that method, for
``PPO(..., rollout_buffer_class=RolloutBuffer)``::

    from stable_baselines3 import PPO
    from rollbuf.integrations.sb3 import RolloutBuffer

    model = PPO("MlpPolicy", "CartPole-v1", rollout_buffer_class=RolloutBuffer)
    model.learn(100_000)

SB3's conventions, kept as they are (tests/test_integrations_sb3.py compares with SB3's own method):

* ``episode_starts[t]`` is **observation-aligned**: it says that observation ``t`` starts a new
  episode, i.e. that transition ``t − 1`` ended one; ``dones`` says the same of the observation
  after the buffer. rollbuf's transition-aligned ``done`` is
  :func:`rollbuf.boundary.conventions.done_from_episode_starts` of the two.
* Every episode end is **terminal** in the buffer (no bootstrap): SB3 handles time-limit
  truncations earlier, in ``collect_rollouts``, by adding ``γ·V(terminal observation)`` to the
  reward of the truncated step. So ``terminated = done`` here.
* The window end bootstraps from ``last_values`` (``V(s_T)``) unless ``dones`` says the last
  observation started a new episode.
* ``returns = advantages + values`` (the TD(λ) return). SB3 rebinds ``rollout_buffer.returns`` to a
  new array; here both arrays are filled in place.
"""

from __future__ import annotations

import numpy as np
import torch

try:
    from stable_baselines3.common.buffers import DictRolloutBuffer as _SB3DictRolloutBuffer
    from stable_baselines3.common.buffers import RolloutBuffer as _SB3RolloutBuffer
except ImportError as exc:  # pragma: no cover - exercised only without stable-baselines3
    raise ImportError(
        "rollbuf.integrations.sb3 needs Stable-Baselines3: pip install stable-baselines3"
    ) from exc

from rollbuf import functional as F
from rollbuf.boundary.conventions import done_from_episode_starts

__all__ = ["compute_returns_and_advantage", "RolloutBuffer", "DictRolloutBuffer"]

_ARRAYS = ("rewards", "values", "episode_starts", "advantages", "returns")


def _buffer_arrays(rollout_buffer):
    missing = [n for n in (*_ARRAYS, "gamma", "gae_lambda") if not hasattr(rollout_buffer, n)]
    if missing:
        raise TypeError(
            f"rollout_buffer must be a Stable-Baselines3 RolloutBuffer (got {type(rollout_buffer).__name__} "
            f"without {', '.join(missing)})"
        )
    if getattr(rollout_buffer, "generator_ready", False):
        raise ValueError(
            "rollout_buffer was already flattened by get(): compute the advantages before sampling"
        )
    arrays = {n: getattr(rollout_buffer, n) for n in _ARRAYS}
    shape = None
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray) or a.ndim != 2 or a.dtype.kind != "f":
            raise TypeError(f"rollout_buffer.{name} must be a 2-d floating-point NumPy array [buffer_size, n_envs]")
        if shape is None:
            shape = a.shape
        elif a.shape != shape:
            raise ValueError(f"rollout_buffer.{name} has shape {a.shape}, rollout_buffer.rewards {shape}")
    return arrays, shape


def compute_returns_and_advantage(rollout_buffer, last_values, dones) -> None:
    """Fill ``rollout_buffer.advantages`` and ``rollout_buffer.returns`` in place: GAE(λ) and the
    TD(λ) return, exactly as SB3's ``RolloutBuffer.compute_returns_and_advantage`` computes them.

    ``last_values``: ``V(s_T)`` per env (a tensor or array of ``n_envs`` values, any device);
    ``dones``: per env, whether the observation after the buffer starts a new episode (SB3 passes
    the ``dones`` of the last ``env.step``). γ and λ are the buffer's ``gamma`` and ``gae_lambda``.
    """
    arrays, (T, N) = _buffer_arrays(rollout_buffer)
    if isinstance(last_values, torch.Tensor):
        lv = last_values.detach().to("cpu")
    elif isinstance(last_values, np.ndarray):
        lv = torch.from_numpy(last_values)
    else:
        raise TypeError(f"last_values must be a torch.Tensor or a NumPy array, got {type(last_values).__name__}")
    if lv.numel() != N:
        raise ValueError(f"last_values must hold one value per env ({N}), got shape {tuple(lv.shape)}")
    if not isinstance(dones, np.ndarray):
        raise TypeError(f"dones must be a NumPy array, got {type(dones).__name__}")
    if dones.size != N:
        raise ValueError(f"dones must hold one flag per env ({N}), got shape {dones.shape}")

    r = torch.from_numpy(arrays["rewards"]).mT  # [N, T] views of the [T, N] arrays
    v = torch.from_numpy(arrays["values"]).mT
    starts = arrays["episode_starts"]
    starts_t = torch.from_numpy(starts)  # (refuses a dtype torch has not, as rewards and values)
    nxt = np.asarray(dones).reshape(-1) != 0
    if T == 0:  # no step: the converter raises its error naming episode_starts
        done_from_episode_starts(starts_t.mT != 0, torch.from_numpy(nxt))
    # done_from_episode_starts(starts, nxt) built time-major, so that the loop reads it in place like
    # the other fields: done[t] = episode_starts[t + 1] != 0 for t < T - 1, done[T - 1] = dones != 0
    done = np.empty((T, N), dtype=bool)
    np.not_equal(starts[1:], 0, out=done[:-1])
    done[-1] = nxt
    adv = F.advantages(rollout_buffer.gamma, rollout_buffer.gae_lambda, rewards=r, values=v,
                       terminated=torch.from_numpy(done).mT, bootstrap_values=lv.reshape(-1).to(v.dtype),
                       backend="auto")
    np.copyto(arrays["advantages"], adv.mT.numpy(), casting="same_kind")
    # SB3: self.returns = self.advantages + self.values (same arithmetic, written in place)
    np.add(arrays["advantages"], arrays["values"], out=arrays["returns"])


class RolloutBuffer(_SB3RolloutBuffer):
    """SB3's ``RolloutBuffer`` whose ``compute_returns_and_advantage`` is rollbuf's
    (:func:`compute_returns_and_advantage`); everything else is SB3's."""

    def compute_returns_and_advantage(self, last_values, dones) -> None:
        compute_returns_and_advantage(self, last_values, dones)


class DictRolloutBuffer(_SB3DictRolloutBuffer):
    """SB3's ``DictRolloutBuffer`` (dict observations) with rollbuf's
    ``compute_returns_and_advantage``."""

    def compute_returns_and_advantage(self, last_values, dones) -> None:
        compute_returns_and_advantage(self, last_values, dones)
