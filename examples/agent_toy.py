"""A multi-turn agent with a tool call, trained with turn-level returns: a tiny causal language model
learns, on a CPU in seconds, to call a tool and then answer with what the tool returned.

    pip install -e ".[examples]" && python examples/agent_toy.py

Each row is one trajectory the way an LLM-agent trainer holds it, ``[prompt | turn 1 | tool reply |
turn 2 | padding]``. The prompt is ``--digits`` random digits and SEP. In turn 1 the policy writes one
token: CALL asks the tool (a well-formed call earns ``--call-reward``, the format reward agent
trainers give); anything else ends the episode with nothing. After a CALL the environment appends
the tool's reply, ``[TOOL, k]``, where ``k`` is a secret digit drawn for the episode (the prompt does
not hold it); in turn 2 the policy writes its answer, which scores 1 if it is ``k``.
Only the policy's own tokens are trained on: ``response_mask`` is 1 on turn 1 and turn 2 and 0 on the
prompt, the tool's reply and the padding, which the model still reads as context, as an LLM reads a
tool's output.

Credit assignment is turn-level (``rollbuf.integrations.llm.turn_returns``, ROLL's agentic
REINFORCE): each turn's return is its reward plus ``γ`` times the next turn's return, so the CALL in
turn 1 is credited its format reward plus ``γ·1`` when the answer after it is right. The baseline is
the mean return of the group's rows at the same token position (``rollbuf.groups.token_baseline`` with weights 1 on the
model's tokens: the optimal token baseline without its variance weights), the group being the rows
sampled for one prompt. No loop over tokens, turns or rows.

Training stops as soon as the greedy policy answers ``--target`` of 512 fresh episodes right (exit
code 0), or fails after ``--iterations`` updates (exit code 1).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn
from tqdm import tqdm

from rollbuf.groups import token_baseline
from rollbuf.integrations.llm import turn_returns

DIGITS = 4                      # tokens 0 .. DIGITS-1 are digits
SEP, CALL, TOOL, PAD = DIGITS, DIGITS + 1, DIGITS + 2, DIGITS + 3
VOCAB = DIGITS + 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="torch seed")
    p.add_argument("--digits", type=int, default=3, help="prompt digits (context the answer does not depend on)")
    p.add_argument("--prompts", type=int, default=32, help="prompts per batch")
    p.add_argument("--group", type=int, default=8, help="episodes sampled per prompt (the baseline's group)")
    p.add_argument("--gamma", type=float, default=0.9, help="the discount between turns")
    p.add_argument("--call-reward", type=float, default=0.1, help="turn 1's reward for a well-formed tool call")
    p.add_argument("--iterations", type=int, default=600, help="the budget: updates before giving up")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--target", type=float, default=0.95, help="greedy success rate that counts as learned")
    p.add_argument("--eval-every", type=int, default=10, help="updates between greedy evaluations")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the tqdm bar")
    return p.parse_args(argv)


class TinyLM(nn.Module):
    """A causal language model small enough to train in seconds: an MLP that predicts token ``i + 1``
    from the one-hot tokens ``0 .. i`` of the row (the later ones zeroed) and the position ``i``."""

    def __init__(self, length: int, width: int = 128):
        super().__init__()
        self.length = length
        self.net = nn.Sequential(nn.Linear(length * (VOCAB + 1), width), nn.ReLU(), nn.Linear(width, VOCAB))

    def forward(self, x):
        """Logits ``[B, L, VOCAB]``: position ``i`` predicts token ``i + 1``."""
        B, L = x.shape
        seen = torch.tril(torch.ones(L, L))
        ctx = seen[None, :, :, None] * nn.functional.one_hot(x, VOCAB)[:, None]
        ctx = nn.functional.pad(ctx, (0, 0, 0, self.length - L)).reshape(B, L, -1)
        pos = torch.eye(self.length)[:L].expand(B, L, self.length)
        return self.net(torch.cat([ctx, pos], -1))


def _next(model, rows, g):
    logits = model(rows)[:, -1].log_softmax(-1)
    return logits.argmax(-1) if g is None else torch.multinomial(logits.exp(), 1, generator=g)[:, 0]


@torch.no_grad()
def episodes(model, prompt, secret, g=None, call_reward=0.1):
    """Play one episode per prompt row (sampled with ``g``, greedy without): ``(rows, response_mask,
    rewards)``, ``[B, P + 4]`` each; each turn's reward on its token (``call_reward`` for a CALL, 1 for
    the right answer)."""
    B, P = prompt.shape
    a1 = _next(model, prompt, g)
    called = a1 == CALL
    reply = torch.stack([torch.full((B,), TOOL), secret], 1)
    a2 = _next(model, torch.cat([prompt, a1[:, None], reply], 1), g)
    # a CALL is followed by the tool's reply and turn 2; any other first token ends the episode
    rows = torch.cat([prompt, a1[:, None], torch.where(called[:, None], reply, PAD),
                      torch.where(called, a2, PAD)[:, None]], 1)
    mask = torch.zeros(rows.shape, dtype=torch.bool)
    mask[:, P] = True
    mask[:, P + 3] = called
    rewards = torch.zeros(rows.shape)
    rewards[:, P] = call_reward * called
    rewards[:, P + 3] = (called & (a2 == secret)).float()
    return rows, mask, rewards


def advantages(rewards, mask, group, gamma):
    """Turn-level returns minus the group's mean return at the same token position."""
    ret = turn_returns(rewards, mask, gamma)
    index = torch.arange(rewards.shape[0]) // group
    base = token_baseline(ret, mask.float(), index, mask.sum(-1), epsilon=1e-8, zero_tail=False)
    return (ret - base) * mask


def train(args) -> bool:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    P = args.digits + 1
    model = TinyLM(P + 4)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    eg = torch.Generator().manual_seed(args.seed + 1)
    eval_prompt = torch.cat([torch.randint(0, DIGITS, (512, args.digits), generator=eg), torch.full((512, 1), SEP)], 1)
    eval_secret = torch.randint(0, DIGITS, (512,), generator=eg)
    bar = tqdm(total=args.iterations, unit="update", disable=not args.progress, dynamic_ncols=True)
    success, start = 0.0, time.perf_counter()
    for it in range(1, args.iterations + 1):
        n = args.prompts
        prompt = torch.cat([torch.randint(0, DIGITS, (n, args.digits), generator=g), torch.full((n, 1), SEP)], 1)
        secret = torch.randint(0, DIGITS, (n,), generator=g)
        prompt, secret = prompt.repeat_interleave(args.group, 0), secret.repeat_interleave(args.group, 0)
        model.eval()
        rows, mask, rewards = episodes(model, prompt, secret, g, args.call_reward)
        adv = advantages(rewards, mask, args.group, args.gamma)
        model.train()
        logp = model(rows[:, :-1]).log_softmax(-1).gather(-1, rows[:, 1:, None])[..., 0]
        m = mask[:, 1:]
        loss = -(adv[:, 1:] * logp * m).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % args.eval_every == 0 or it == args.iterations:
            model.eval()
            _, _, r = episodes(model, eval_prompt, eval_secret, None, args.call_reward)
            success = (r[:, -1] == 1).float().mean().item()  # the right answer after a call
        bar.set_postfix(answered=f"{rewards[:, -1].mean().item():.3f}", greedy=f"{success:.3f}")
        bar.update(1)
        if success >= args.target:
            break
    bar.close()
    took = time.perf_counter() - start
    if success >= args.target:
        print(f"learned: greedy success {success:.3f} >= {args.target} after {it} updates "
              f"({it * args.prompts * args.group} episodes, {took:.1f} s)")
        return True
    print(f"did NOT learn within {args.iterations} updates: greedy success {success:.3f} < {args.target} "
          f"({took:.1f} s)")
    return False


if __name__ == "__main__":
    sys.exit(0 if train(parse_args()) else 1)
