"""Stable-Baselines3 PPO on CartPole-v1 with rollbuf's advantage computation.

    pip install -e ".[examples,sb3]" && python examples/sb3_ppo_cartpole.py

The only change to a plain SB3 script is ``rollout_buffer_class=RolloutBuffer`` from
``rollbuf.integrations.sb3``: SB3's buffer whose ``compute_returns_and_advantage`` (a NumPy loop over
the rollout's steps in SB3) is one call of ``rollbuf.functional.gae``, with SB3's numbers. The
hyper-parameters are RL Baselines3 Zoo's for CartPole-v1 (8 envs × 32 steps, γ = 0.98, λ = 0.8,
20 epochs, linearly decayed learning rate and clip range).

A tqdm bar shows the env steps done and the mean return of the last finished episodes
(``--no-progress`` hides it). After ``--timesteps`` env steps the policy is evaluated
deterministically on ``--eval-episodes`` episodes; the exit code is 0 when the mean return
reaches ``--target``, 1 otherwise. ``--check`` also runs SB3's own method on a copy of every
rollout and stops with an error if the advantages or returns differ beyond float32 rounding.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from tqdm import tqdm

from rollbuf.integrations.sb3 import RolloutBuffer


class CheckedRolloutBuffer(RolloutBuffer):
    """rollbuf's buffer, compared with SB3's own method on every rollout (``--check``)."""

    checked = 0
    max_diff = 0.0

    def compute_returns_and_advantage(self, last_values, dones):
        theirs = copy.deepcopy(self)
        SB3RolloutBuffer.compute_returns_and_advantage(theirs, last_values.clone(), dones.copy())
        super().compute_returns_and_advantage(last_values, dones)
        for name in ("advantages", "returns"):
            np.testing.assert_allclose(getattr(self, name), getattr(theirs, name), rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} differ from SB3's")
            diff = float(np.abs(getattr(self, name) - getattr(theirs, name)).max())
            CheckedRolloutBuffer.max_diff = max(CheckedRolloutBuffer.max_diff, diff)
        CheckedRolloutBuffer.checked += 1


class ProgressBar(BaseCallback):
    """A tqdm bar over the training's env steps, with the mean return of SB3's recent episodes (SB3's
    own ``progress_bar=True`` needs rich as well, which the examples extra does not install)."""

    def __init__(self, total: int):
        super().__init__()
        self.total, self.bar = total, None

    def _on_training_start(self):
        per_rollout = self.model.n_steps * self.model.n_envs  # SB3 runs whole rollouts
        total = -(-self.total // per_rollout) * per_rollout
        self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, desc="SB3 PPO + rollbuf")

    def _on_rollout_end(self):
        episodes = self.model.ep_info_buffer
        if episodes:
            self.bar.set_postfix(mean_return=f"{np.mean([e['r'] for e in episodes]):.1f}", refresh=False)

    def _on_step(self) -> bool:
        self.bar.update(self.num_timesteps - self.bar.n)
        return True

    def _on_training_end(self):
        self.bar.close()


def linear(start):
    return lambda progress_remaining: progress_remaining * start


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option that takes a value shows its default; a flag's help says what it does."""

    def _get_help_string(self, action):
        return action.help if action.nargs == 0 else super()._get_help_string(action)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=_Help)
    p.add_argument("--timesteps", type=int, default=100_000, help="env steps of training")
    p.add_argument("--seed", type=int, default=0, help="seed of SB3, the envs and torch")
    p.add_argument("--eval-episodes", type=int, default=20, help="deterministic evaluation episodes")
    p.add_argument("--target", type=float, default=475.0, help="mean evaluation return to reach (exit code 0)")
    p.add_argument("--check", action="store_true", help="compare every rollout with SB3's own method")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="hide the tqdm progress bar (shown without this flag)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed)
    model = PPO(
        "MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
        learning_rate=linear(1e-3), clip_range=linear(0.2), seed=args.seed, device="cpu", verbose=0,
        rollout_buffer_class=CheckedRolloutBuffer if args.check else RolloutBuffer,
    )
    start = time.perf_counter()
    model.learn(args.timesteps, callback=ProgressBar(args.timesteps) if args.progress else None)
    wall = time.perf_counter() - start
    mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=args.eval_episodes, deterministic=True)
    ok = mean >= args.target
    print(f"SB3 PPO + rollbuf advantages on CartPole-v1: {model.num_timesteps:,} steps in {wall:.1f} s; "
          f"mean evaluation return {mean:.1f} ± {std:.1f} over {args.eval_episodes} episodes "
          f"({'reached' if ok else 'did NOT reach'} {args.target:g})")
    if args.check:
        print(f"checked {CheckedRolloutBuffer.checked} rollouts against SB3's compute_returns_and_advantage: "
              f"max |difference| {CheckedRolloutBuffer.max_diff:.2e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
