"""Gymnasium vector environments → :meth:`rollbuf.Rollout.record` arguments.

A vector env's ``step`` returns ``obs, reward, terminated, truncated, info``. To fill a
:class:`~rollbuf.Rollout` correctly at episode boundaries, rollbuf needs, per step:

* ``rewards``, ``terminated``, ``truncated`` — as returned;
* ``bootstrap_values`` — ``V(s'_t)`` of the *true* final observation where a step is truncated (a
  time limit cut the episode; its tail is estimated by the critic); never read where terminated;
* ``mask`` — in ``NEXT_STEP`` autoreset mode only (below): ``False`` on the steps that are not
  agent steps.

Where the final observation is depends on the vector env's autoreset mode (Gymnasium ≥ 1.0,
``envs.metadata["autoreset_mode"]``):

``NEXT_STEP`` (``"NextStep"``, Gymnasium 1.x's default)
    The step that ends an episode returns the **final observation** in ``obs`` (so
    ``V(final obs)`` is the value of the returned ``obs`` of that env). The env is reset on the
    *following* ``step`` call: that call ignores the action and returns the reset observation
    with ``reward = 0``, ``terminated = truncated = False``. That step is not an agent step and
    must not be trained on: :class:`StepConverter` returns ``mask=False`` for it (it remembers
    which envs ended an episode on the previous call, also across windows). rollbuf treats a
    masked step as if it were deleted, so the estimators see the episode end followed directly by
    the next episode's first step; build the rollout with ``Rollout.empty(..., with_mask=True)``
    and weight the losses with ``rollout.mask`` (advantages and returns are 0 there). Skipping the
    step instead (not recording it) would misalign a ``[num_envs, T]`` buffer, because the envs
    end their episodes at different times; the mask keeps the layout rectangular.

``SAME_STEP`` (``"SameStep"``)
    The step that ends an episode resets the env at once and returns the **reset observation** in
    ``obs``; the final observation is in ``info["final_obs"][i]`` (with ``info["_final_obs"][i]``
    set). Every step is an agent step: no mask.

``DISABLED`` is not supported (the user resets the envs by hand; pass the fields yourself).

Example (``NEXT_STEP``; ``agent`` is the user's policy/value network)::

    conv = StepConverter.from_env(envs, value_fn=lambda o: agent.value(torch.as_tensor(o)))
    ro = Rollout.empty(num_envs, T, with_mask=conv.needs_mask)
    obs, _ = envs.reset(seed=0)
    for t in range(T):
        with torch.no_grad():
            action, logp, value = agent.act(torch.as_tensor(obs))
        obs, reward, terminated, truncated, info = envs.step(action.numpy())
        ro.record(t, values=value, log_probs=logp,
                  **conv(obs, reward, terminated, truncated, info))
    ro.bootstrap(agent.value(torch.as_tensor(obs)))
    adv, ret = ro.gae(0.99, 0.95)

Gymnasium itself is not imported here: the autoreset mode may be given as the enum or its value
string, and observations are handled as NumPy arrays, torch tensors, or dicts/tuples of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["NEXT_STEP", "SAME_STEP", "StepConverter", "autoreset_mode"]

NEXT_STEP = "NextStep"
SAME_STEP = "SameStep"
_DISABLED = "Disabled"


def _mode_str(mode) -> str:
    """``gymnasium.vector.AutoresetMode`` member, its value or its name → ``"NextStep"``/``"SameStep"``."""
    value = getattr(mode, "value", mode)
    if isinstance(value, str):
        key = value.replace("_", "").lower()
        for name in (NEXT_STEP, SAME_STEP, _DISABLED):
            if key == name.lower():
                value = name
                break
    if value == _DISABLED:
        raise ValueError(
            "autoreset mode DISABLED is not supported: the envs are reset by hand there, so pass "
            "rewards/terminated/truncated/bootstrap_values to Rollout.record yourself"
        )
    if value not in (NEXT_STEP, SAME_STEP):
        raise ValueError(f"autoreset_mode must be NEXT_STEP or SAME_STEP (Gymnasium's AutoresetMode), got {mode!r}")
    return value


def autoreset_mode(envs) -> str:
    """The autoreset mode of a Gymnasium vector env, ``"NextStep"`` or ``"SameStep"``.

    Read from ``envs.metadata["autoreset_mode"]``; absent means ``"NextStep"`` (Gymnasium 1.x's
    default). Raises ``ValueError`` for ``DISABLED``.
    """
    metadata = getattr(envs, "metadata", None) or {}
    return _mode_str(metadata.get("autoreset_mode", NEXT_STEP))


def _take(obs, idx: np.ndarray):
    """The rows ``idx`` of a batched observation (array, tensor, or dict/tuple of them)."""
    if isinstance(obs, dict):
        return {k: _take(v, idx) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_take(v, idx) for v in obs)
    if isinstance(obs, torch.Tensor):
        return obs[torch.as_tensor(idx, device=obs.device)]
    return np.asarray(obs)[idx]


def _stack(items: list):
    """Single observations → one batch (arrays, tensors, or dicts/tuples of them)."""
    first = items[0]
    if isinstance(first, dict):
        return {k: _stack([it[k] for it in items]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([it[j] for it in items]) for j in range(len(first)))
    if isinstance(first, torch.Tensor):
        return torch.stack(items)
    return np.stack([np.asarray(it) for it in items])


def _flags(x, name: str, n: int) -> np.ndarray:
    x = np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x)
    if x.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) (one flag per env), got {x.shape}")
    return x.astype(bool, copy=False)


class StepConverter:
    """Turns a vector env's step outputs into :meth:`Rollout.record` keyword arguments.

    ``conv(obs, reward, terminated, truncated, info)`` returns a dict with ``rewards`` (``[N]``
    float), ``terminated``, ``truncated`` (``[N]`` bool), ``bootstrap_values`` (``[N]`` float:
    ``V(final observation)`` where truncated and not terminated, NaN elsewhere) and, in
    ``NEXT_STEP`` mode, ``mask`` (``[N]`` bool, ``False`` on the autoreset step that follows an
    episode end). Pass it on with the step's ``values`` and ``log_probs``::

        ro.record(t, values=v, log_probs=lp, **conv(obs, reward, terminated, truncated, info))

    ``value_fn`` is called (under ``torch.no_grad()``) only when some env was truncated, on a batch
    of the ``k`` truncated envs' final observations, in the vector env's observation format (a
    NumPy array for a ``Box`` space; dicts/tuples of arrays for ``Dict``/``Tuple`` spaces); it
    returns ``k`` values (any shape with ``k`` elements, e.g. ``[k]`` or ``[k, 1]``).

    The converter is stateful in ``NEXT_STEP`` mode (which envs reset on the next call): use one
    converter per vector env, keep it across windows, and call :meth:`reset` after
    ``envs.reset()``.

    Args:
        value_fn: ``obs batch -> values``, the critic ``V``.
        num_envs: number of envs ``N``.
        autoreset_mode: ``"NextStep"`` / ``"SameStep"`` or ``gymnasium.vector.AutoresetMode``.
        device: device of the returned tensors.
        dtype: float dtype of ``rewards`` and ``bootstrap_values``.
    """

    def __init__(
        self,
        value_fn: Callable[[Any], Any],
        num_envs: int,
        autoreset_mode=NEXT_STEP,
        *,
        device=None,
        dtype: torch.dtype = torch.float32,
    ):
        if not callable(value_fn):
            raise TypeError(f"value_fn must be callable, got {type(value_fn).__name__}")
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        self.value_fn = value_fn
        self.num_envs = num_envs
        self.mode = _mode_str(autoreset_mode)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dtype = dtype
        self._resetting = np.zeros(num_envs, dtype=bool)  # NEXT_STEP: envs that reset on the next step

    @classmethod
    def from_env(cls, envs, value_fn: Callable[[Any], Any], **kw) -> StepConverter:
        """A converter for ``envs`` (a Gymnasium ``VectorEnv``): ``num_envs`` and the autoreset
        mode are read from it (:func:`autoreset_mode`)."""
        return cls(value_fn, envs.num_envs, autoreset_mode(envs), **kw)

    @property
    def needs_mask(self) -> bool:
        """``True`` in ``NEXT_STEP`` mode: build the rollout with ``with_mask=True``."""
        return self.mode == NEXT_STEP

    def reset(self) -> None:
        """Forget pending autoresets; call after ``envs.reset()`` (which resets every env)."""
        self._resetting[:] = False

    def final_observations(self, obs, terminated, truncated, info, which=None):
        """``(idx, batch)``: the envs ``idx`` (default: truncated and not terminated) and a batch of
        their true final observations (``obs[idx]`` in ``NEXT_STEP`` mode, the stacked
        ``info["final_obs"][idx]`` in ``SAME_STEP`` mode); ``batch`` is ``None`` when ``idx`` is
        empty."""
        n = self.num_envs
        te = _flags(terminated, "terminated", n)
        tr = _flags(truncated, "truncated", n)
        if which is None:
            which = tr & ~te
        idx = np.flatnonzero(which)
        info = info or {}
        has_final = "final_obs" in info
        if self.mode == NEXT_STEP:
            if has_final:
                raise ValueError(
                    "info has 'final_obs', so the env autoresets in SAME_STEP mode, but this "
                    "converter was built for NEXT_STEP; pass autoreset_mode='SameStep' (or use "
                    "StepConverter.from_env)"
                )
            return idx, (_take(obs, idx) if idx.size else None)
        if not idx.size:
            return idx, None
        if not has_final:
            raise ValueError(
                "an episode ended but info has no 'final_obs': the env does not autoreset in "
                "SAME_STEP mode; pass autoreset_mode='NextStep' (or use StepConverter.from_env)"
            )
        final = info["final_obs"]
        present = info.get("_final_obs")
        if present is not None and not np.asarray(present)[idx].all():
            raise ValueError(f"info['_final_obs'] is not set for every ended env {idx.tolist()}")
        return idx, _stack([final[i] for i in idx])

    def __call__(self, obs, reward, terminated, truncated, info) -> dict:
        n = self.num_envs
        te = _flags(terminated, "terminated", n)
        tr = _flags(truncated, "truncated", n)
        rewards = torch.as_tensor(np.asarray(reward.cpu() if isinstance(reward, torch.Tensor) else reward),
                                  dtype=self.dtype).to(self.device)
        if tuple(rewards.shape) != (n,):
            raise ValueError(f"reward must have shape ({n},) (one reward per env), got {tuple(rewards.shape)}")

        boot = torch.full((n,), float("nan"), dtype=self.dtype, device=self.device)
        idx, batch = self.final_observations(obs, te, tr, info)
        if idx.size:
            with torch.no_grad():
                v = self.value_fn(batch)
            v = torch.as_tensor(v).detach().reshape(-1)
            if v.numel() != idx.size:
                raise ValueError(
                    f"value_fn returned {v.numel()} values for a batch of {idx.size} final observations"
                )
            boot[torch.as_tensor(idx, device=self.device)] = v.to(device=self.device, dtype=self.dtype)

        out = {
            "rewards": rewards,
            "terminated": torch.tensor(te, device=self.device),
            "truncated": torch.tensor(tr, device=self.device),
            "bootstrap_values": boot,
        }
        if self.mode == NEXT_STEP:
            out["mask"] = torch.tensor(~self._resetting, device=self.device)
            self._resetting = te | tr
        return out
