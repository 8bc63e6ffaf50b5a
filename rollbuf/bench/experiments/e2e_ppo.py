"""End to end: one PPO update on a synthetic actor-critic, with the advantage step done the way
CleanRL/SB3 do it (an eager loop over time) or by rollbuf, and the share of the update it takes.

    python -m rollbuf.bench --experiment e2e-ppo [--envs 4096 --steps 128 --hidden 64,1024] [--device cuda]

An update = values of the whole buffer (no grad), the advantage step, then ``epochs`` passes of
minibatch forward/backward/step of a two-headed MLP. Amdahl: the end-to-end speedup is bounded by
1 / (1 − share of the advantage step). Prints a markdown table; ``--out`` writes CSV.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import time

import torch
from torch import nn

from rollbuf import functional as F
from rollbuf.oracles import gae_loop


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def make_model(obs_dim, hidden, actions, device):
    body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
    return nn.ModuleDict(dict(body=body, pi=nn.Linear(hidden, actions), v=nn.Linear(hidden, 1))).to(device)


def update(model, opt, batch, advantage_fn, epochs=4, minibatches=4, device="cpu"):
    """One PPO update; returns (total seconds, advantage-step seconds)."""
    obs, actions, logp_old, rewards, terminated, truncated, boot = batch
    N, T = rewards.shape
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        values = model["v"](model["body"](obs)).squeeze(-1)  # [N, T]
    _sync(device)
    t1 = time.perf_counter()
    adv, ret = advantage_fn(rewards, values, terminated, truncated, boot)
    _sync(device)
    t2 = time.perf_counter()
    flat = lambda x: x.reshape(N * T, *x.shape[2:])  # noqa: E731
    o, a, lp, A, R = flat(obs), flat(actions), flat(logp_old), flat(adv), flat(ret)
    for _ in range(epochs):
        perm = torch.randperm(N * T, device=device)
        for idx in perm.chunk(minibatches):
            h = model["body"](o[idx])
            dist = torch.distributions.Categorical(logits=model["pi"](h))
            ratio = (dist.log_prob(a[idx]) - lp[idx]).exp()
            adv_mb = (A[idx] - A[idx].mean()) / (A[idx].std() + 1e-8)
            pg = -torch.min(ratio * adv_mb, ratio.clamp(0.8, 1.2) * adv_mb).mean()
            vloss = (model["v"](h).squeeze(-1) - R[idx]).pow(2).mean()
            loss = pg + 0.5 * vloss - 0.01 * dist.entropy().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    _sync(device)
    t3 = time.perf_counter()
    return t3 - t0, t2 - t1


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rollbuf.bench --experiment e2e-ppo")
    ap.add_argument("--envs", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--hidden", default="64,1024")
    ap.add_argument("--obs-dim", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev, N, T = args.device, args.envs, args.steps
    g = torch.Generator(device="cpu").manual_seed(0)
    obs = torch.randn(N, T, args.obs_dim, generator=g).to(dev)
    actions = torch.randint(0, 4, (N, T), generator=g).to(dev)
    logp_old = torch.full((N, T), -1.386, device=dev)
    rewards = torch.randn(N, T, generator=g).to(dev)
    terminated = (torch.rand(N, T, generator=g) < 0.01).to(dev)
    truncated = (torch.rand(N, T, generator=g) < 0.005).to(dev) & ~terminated
    boot = torch.randn(N, T, generator=g).to(dev)
    batch = (obs, actions, logp_old, rewards, terminated, truncated, boot)

    def loop(r, v, k, tr, bv):  # CleanRL/SB3: bootstrap at truncations and the window end
        nxt = torch.cat([v[:, 1:], bv[:, -1:]], -1)
        nxt = torch.where(tr, bv, nxt)
        return gae_loop(r, v, nxt, k, tr, 0.99, 0.95)

    def rollbuf_gae(r, v, k, tr, bv):
        return F.gae(0.99, 0.95, rewards=r, values=v, terminated=k, truncated=tr, bootstrap_values=bv)

    impls = {"eager loop": loop, "rollbuf": rollbuf_gae}
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                         cwd=os.path.dirname(os.path.abspath(__file__))).strip()
    except Exception:  # pragma: no cover
        commit = "unknown"
    device_name = torch.cuda.get_device_name() if dev == "cuda" else (platform.processor() or platform.machine())
    rows = []
    for hidden in [int(h) for h in args.hidden.split(",")]:
        res = {}
        for name, fn in impls.items():
            torch.manual_seed(0)
            model = make_model(args.obs_dim, hidden, 4, dev)
            opt = torch.optim.Adam(model.parameters(), lr=3e-4)
            update(model, opt, batch, fn, device=dev)  # warm-up
            times = [update(model, opt, batch, fn, device=dev) for _ in range(args.reps)]
            total = statistics.median(t for t, _ in times)
            adv = statistics.median(a for _, a in times)
            res[name] = (total, adv)
        (t_loop, a_loop), (t_rb, a_rb) = res["eager loop"], res["rollbuf"]
        rows.append(dict(device=device_name, torch=torch.__version__, commit=commit, envs=N, steps=T, hidden=hidden,
                         loop_update_s=t_loop, loop_adv_s=a_loop, loop_adv_share=a_loop / t_loop,
                         rollbuf_update_s=t_rb, rollbuf_adv_s=a_rb, rollbuf_adv_share=a_rb / t_rb,
                         e2e_speedup=t_loop / t_rb, amdahl_bound=1 / (1 - a_loop / t_loop)))
    if args.out:
        with open(args.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print(f"PPO update, {N} envs × {T} steps, {device_name}, torch {torch.__version__}, commit {commit}\n")
    print("| hidden | update, eager-loop GAE | its GAE share | update, rollbuf GAE | its GAE share | "
          "end-to-end speedup | Amdahl bound |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['hidden']} | {r['loop_update_s'] * 1e3:.0f} ms | {r['loop_adv_share']:.1%} | "
              f"{r['rollbuf_update_s'] * 1e3:.0f} ms | {r['rollbuf_adv_share']:.1%} | {r['e2e_speedup']:.2f}× | "
              f"{r['amdahl_bound']:.2f}× |")

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
