"""PPO on CartPole-v1 with rollbuf: a single file in the spirit of CleanRL's ppo.py.

    pip install -e ".[examples]" && python examples/ppo_cartpole.py

Outputs go to ``runs/ppo_cartpole/`` (git-ignored) unless ``--out`` says otherwise. The learning
curve committed in ``docs/img/`` is regenerated, from the repository root, by

    python examples/ppo_cartpole.py --out docs/img

The rollout is a ``rollbuf.Rollout`` filled step by step with ``record`` while collecting from a
Gymnasium vector env; ``rollbuf.integrations.gym.StepConverter`` turns each ``envs.step`` result into the
``record`` arguments: terminated and truncated apart, and ``bootstrap_values = V(final observation)``
where CartPole's 500-step time limit truncates an episode, for both autoreset modes
(``--autoreset-mode next-step``, Gymnasium 1.x's default, where the step after an episode end is the
env's reset and is masked out; ``--autoreset-mode same-step``, where the final observation comes in
``info["final_obs"]``). The window is closed with ``rollout.bootstrap(V(next obs))`` and the
advantages are ``rollout.gae(gamma, lam)``.

Training stops as soon as the mean episodic return of the last ``--window`` finished episodes
reaches ``--target`` (exit code 0), or fails after ``--total-timesteps`` env steps (exit code 1).
A learning-curve plot (``ppo_cartpole.png``) and a CSV of every finished episode (global step,
episodic return, running mean; ``ppo_cartpole_log.csv``) go to ``--out``; ``--plot`` / ``--log``
name either file elsewhere ('' = do not write it).
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import sys
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical
from tqdm import tqdm

from rollbuf import Rollout
from rollbuf.integrations.gym import StepConverter


class _Help(argparse.HelpFormatter):
    """Every option that takes a value shows its default; a flag's help says what it does."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or "default:" in text:
            return text
        return f"{text} (default: %(default)s)".strip()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=_Help)
    p.add_argument("--env-id", default="CartPole-v1", help="Gymnasium env id")
    p.add_argument("--seed", type=int, default=1, help="seed of torch, numpy and the envs")
    p.add_argument("--num-envs", type=int, default=8, help="envs of the synchronous vector env")
    p.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout window")
    p.add_argument("--total-timesteps", type=int, default=500_000, help="env-step budget")
    p.add_argument("--lr", type=float, default=2.5e-3, help="Adam learning rate")
    p.add_argument("--no-anneal-lr", dest="anneal_lr", action="store_false",
                   help="keep the learning rate constant (without this flag it is annealed linearly to 0 "
                        "over the budget)")
    p.add_argument("--gamma", type=float, default=0.99, help="discount γ")
    p.add_argument("--gae-lambda", type=float, default=0.95, help="GAE λ")
    p.add_argument("--update-epochs", type=int, default=4, help="PPO epochs per window")
    p.add_argument("--num-minibatches", type=int, default=4, help="minibatches per epoch")
    p.add_argument("--clip-coef", type=float, default=0.2, help="PPO ratio and value clipping")
    p.add_argument("--ent-coef", type=float, default=0.01, help="entropy bonus weight")
    p.add_argument("--vf-coef", type=float, default=0.5, help="value loss weight")
    p.add_argument("--max-grad-norm", type=float, default=0.5, help="gradient clipping norm")
    p.add_argument("--hidden", type=int, default=64, help="hidden units of the actor and the critic")
    p.add_argument("--autoreset-mode", choices=["next-step", "same-step"], default="next-step",
                   help="Gymnasium vector-env autoreset mode")
    p.add_argument("--target", type=float, default=475.0, help="mean episodic return to reach")
    p.add_argument("--window", type=int, default=20, help="finished episodes averaged for --target")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--out", default=os.path.join("runs", "ppo_cartpole"),
                   help="folder for ppo_cartpole.png and ppo_cartpole_log.csv (created if missing)")
    p.add_argument("--plot", default=None, help="learning-curve PNG ('' = none; default: OUT/ppo_cartpole.png)")
    p.add_argument("--log", default=None,
                   help="CSV of finished episodes ('' = none; default: OUT/ppo_cartpole_log.csv)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="hide the tqdm progress bar (shown without this flag)")
    args = p.parse_args(argv)
    if args.plot is None:
        args.plot = os.path.join(args.out, "ppo_cartpole.png")
    if args.log is None:
        args.log = os.path.join(args.out, "ppo_cartpole_log.csv")
    return args


def layer(i, o, std=2 ** 0.5, bias=0.0):
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, bias)
    return lin


class Agent(nn.Module):
    def __init__(self, obs_dim, n_actions, hidden):
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(),
                                    layer(hidden, 1, std=1.0))
        self.actor = nn.Sequential(layer(obs_dim, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(),
                                   layer(hidden, n_actions, std=0.01))

    def value(self, obs):
        return self.critic(obs).squeeze(-1)

    def act(self, obs, action=None):
        dist = Categorical(logits=self.actor(obs))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.value(obs)


def save_outputs(args, episodes, reached_at):
    """The CSV log and the learning-curve plot."""
    if args.log:
        os.makedirs(os.path.dirname(args.log) or ".", exist_ok=True)
        with open(args.log, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["global_step", "episodic_return", f"mean_return_last_{args.window}"])
            w.writerows(episodes)
    if args.plot and episodes:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps, rets, means = (np.array(c) for c in zip(*episodes))
        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        ax.scatter(steps, rets, s=4, alpha=0.3, color="tab:blue", label="episodic return")
        ax.plot(steps, means, color="tab:blue", lw=2, label=f"mean of the last {args.window} episodes")
        ax.axhline(args.target, color="tab:red", ls="--", lw=1, label=f"target {args.target:g}")
        if reached_at is not None:
            ax.axvline(reached_at, color="tab:green", ls=":", lw=1, label=f"reached at step {reached_at:,}")
        ax.set_xlabel("global step (env steps)")
        ax.set_ylabel("episodic return")
        ax.set_title(f"PPO + rollbuf GAE on {args.env_id} ({args.num_envs} envs, {args.autoreset_mode} autoreset)")
        ax.set_ylim(0, 520)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
        fig.savefig(args.plot)
        plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    mode = {"next-step": gym.vector.AutoresetMode.NEXT_STEP, "same-step": gym.vector.AutoresetMode.SAME_STEP}
    envs = gym.make_vec(args.env_id, num_envs=args.num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": mode[args.autoreset_mode]})
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = Agent(obs_dim, int(envs.single_action_space.n), args.hidden)
    opt = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)

    def as_obs(o):
        return torch.as_tensor(o, dtype=torch.float32).reshape(-1, obs_dim)

    # V(final observation) of the envs a time limit truncated, for the truncation bootstrap
    conv = StepConverter.from_env(envs, value_fn=lambda final_obs: agent.value(as_obs(final_obs)))

    N, T = args.num_envs, args.num_steps
    iterations = args.total_timesteps // (N * T)
    obs_buf = torch.zeros(N, T, obs_dim)
    act_buf = torch.zeros(N, T, dtype=torch.long)
    next_obs, _ = envs.reset(seed=args.seed)
    conv.reset()

    ep_return = np.zeros(N)
    recent = deque(maxlen=args.window)
    episodes = []  # (global_step, episodic_return, mean of the last `window`)
    global_step, reached_at = 0, None
    start = time.perf_counter()
    bar = tqdm(total=iterations * N * T, unit="step", disable=not args.progress, dynamic_ncols=True)

    for it in range(iterations):
        if args.anneal_lr:
            opt.param_groups[0]["lr"] = args.lr * (1.0 - it / iterations)

        # ---- collect one window into a Rollout -------------------------------------------------
        ro = Rollout.empty(N, T, with_mask=conv.needs_mask)
        for t in range(T):
            obs = as_obs(next_obs)
            with torch.no_grad():
                action, logp, _, value = agent.act(obs)
            obs_buf[:, t], act_buf[:, t] = obs, action
            next_obs, reward, terminated, truncated, info = envs.step(action.numpy())
            step = conv(next_obs, reward, terminated, truncated, info)
            ro.record(t, values=value, log_probs=logp, **step)

            global_step += N
            ep_return += reward  # 0 on NEXT_STEP's reset steps
            for i in np.flatnonzero(np.logical_or(terminated, truncated)):
                recent.append(ep_return[i])
                episodes.append((global_step, float(ep_return[i]), float(np.mean(recent))))
                ep_return[i] = 0.0
                if reached_at is None and len(recent) == args.window and np.mean(recent) >= args.target:
                    reached_at = global_step
        with torch.no_grad():
            ro.bootstrap(agent.value(as_obs(next_obs)))  # V(s_T): the window ends mid-episode

        bar.update(N * T)
        if recent:
            bar.set_postfix(ret=f"{np.mean(recent):.1f}", eps=len(episodes), refresh=False)
        if reached_at is not None:
            break

        # ---- rollbuf GAE, then the PPO update on the agent steps --------------------------------
        adv, ret = ro.gae(args.gamma, args.gae_lambda)
        valid = ro.mask.reshape(-1) if ro.mask is not None else slice(None)
        b_obs = obs_buf.reshape(-1, obs_dim)[valid]
        b_act = act_buf.reshape(-1)[valid]
        b_logp = ro.log_probs.reshape(-1)[valid]
        b_adv = adv.reshape(-1)[valid]
        b_ret = ret.reshape(-1)[valid]
        b_val = ro.values.reshape(-1)[valid]
        n = b_obs.shape[0]  # agent steps (NEXT_STEP's reset steps are not)
        for _ in range(args.update_epochs):
            for idx in torch.randperm(n).tensor_split(args.num_minibatches):
                _, new_logp, entropy, new_v = agent.act(b_obs[idx], b_act[idx])
                ratio = (new_logp - b_logp[idx]).exp()
                a = b_adv[idx]
                a = (a - a.mean()) / (a.std() + 1e-8)
                pg_loss = torch.max(-a * ratio, -a * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
                v_clipped = b_val[idx] + (new_v - b_val[idx]).clamp(-args.clip_coef, args.clip_coef)
                v_loss = 0.5 * torch.max((new_v - b_ret[idx]) ** 2, (v_clipped - b_ret[idx]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                opt.step()
    bar.close()
    envs.close()

    wall = time.perf_counter() - start
    mean_ret = float(np.mean(recent)) if recent else float("nan")
    save_outputs(args, episodes, reached_at)
    ok = reached_at is not None
    print(f"{'reached' if ok else 'did NOT reach'} mean return {args.target:g} over the last {args.window} "
          f"episodes: {mean_ret:.1f} at global step {reached_at or global_step:,} ({len(episodes)} episodes, "
          f"{wall:.1f} s wall, {args.autoreset_mode} autoreset)")
    if args.log:
        print(f"log: {args.log}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
