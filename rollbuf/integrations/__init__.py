"""Drop-ins and adapters for the libraries rollbuf is used with.

Each submodule is imported on its own (``from rollbuf.integrations import sb3``), so a missing
optional dependency only matters to the module that needs it:

* :mod:`rollbuf.integrations.gym` — Gymnasium vector-env ``step`` results → ``Rollout.record``
  arguments (both autoreset modes); needs nothing beyond numpy.
* :mod:`rollbuf.integrations.llm` — token-level GAE and returns for LLM agents (verl's
  ``compute_gae_advantage_return``, packed sequences); plain torch.
* :mod:`rollbuf.integrations.verl` — verl's advantage estimators under verl's names (GRPO, RLOO,
  pass@k, OTB, ...) and ``register()``; plain torch (``register`` imports verl).
* :mod:`rollbuf.integrations.verl_agent` — verl-agent's GiGPO (episode and step groups) and its
  step returns; plain torch.
* :mod:`rollbuf.integrations.openrlhf` — OpenRLHF's experience maker (GAE, REINFORCE returns, group
  baselines, whitening) under its names and ``patch()``; plain torch (``patch`` imports OpenRLHF).
* :mod:`rollbuf.integrations.areal` — AReaL's ``PPOActor._compute_advantages`` with its GAE as one scan,
  and ``patch()``; plain torch (``patch`` imports AReaL).
* :mod:`rollbuf.integrations.slime` — slime's custom advantage functions (``(args, rollout_data)``); plain torch.
* :mod:`rollbuf.integrations.skyrl` — SkyRL's advantage estimators and ``register()``; plain torch
  (``register`` imports SkyRL).
* :mod:`rollbuf.integrations.torchrl` — ``GAE``, ``TDLambdaEstimator`` and ``VTrace`` with
  TorchRL's constructor and call, usable by TorchRL's losses; needs ``torchrl``.
* :mod:`rollbuf.integrations.sb3` — Stable-Baselines3's ``RolloutBuffer.compute_returns_and_advantage``
  and a ``RolloutBuffer`` that uses it; needs ``stable-baselines3``.
* :mod:`rollbuf.integrations.trl` — TRL's ``GRPOTrainer`` with its advantages from
  :mod:`rollbuf.groups` (every ``scale_rewards`` mode, float32 statistics, ``tool_mask`` checked) and
  the advantage function alone; needs ``trl`` (1.16).
"""

