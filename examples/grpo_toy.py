"""GRPO on a toy token task with rollbuf: a tiny causal language model learns to reverse a short
string of digits, on a CPU, in seconds (well under a minute), with no downloaded weights.

    pip install -e ".[examples]" && python examples/grpo_toy.py

Each row is one sequence the way an LLM trainer holds it: ``[prompt | SEP | response | padding]``.
The prompt is 1 to ``--max-len`` random digits (left-padded); the policy samples the response token
by token and should write the prompt's digits reversed, then EOS; after EOS (or at the length cap)
the row is padded. ``response_mask`` is 1 on the sampled response tokens (EOS included) and 0 on
the prompt, the separator and the padding: the policy scores every position of the row in one
forward pass, as a language model does, and only the masked-in log-probabilities enter the loss.

GRPO (group-relative advantages, no critic): every prompt is sampled ``--group`` times; a response
scores the fraction of the target's positions (digits and EOS) it got right. As in verl, the score
goes on the response's last token (``token_level_rewards``) and the group is the prompt
(``index``); ``rollbuf.integrations.verl.compute_grpo_outcome_advantage`` standardises each score
within its group, ``(score − group mean) / (group std + 1e-6)``, and puts it on every response
token (0 on the masked ones), with no loop over groups or rows. The loss is the token-mean policy
gradient over the masked-in tokens, one on-policy step per batch (so PPO's ratio is 1 and its clip
inactive).

Training stops as soon as the greedy policy reverses ``--target`` of 512 fresh prompts exactly
(exit code 0), or fails after ``--iterations`` updates (exit code 1). A tqdm bar shows the
progress, the mean score of the sampled responses and the last greedy accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn
from tqdm import tqdm

from rollbuf.integrations.verl import compute_grpo_outcome_advantage

DIGITS = 4                      # tokens 0 .. DIGITS-1 are digits
SEP, EOS, PAD = DIGITS, DIGITS + 1, DIGITS + 2
VOCAB = DIGITS + 3


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="torch seed")
    p.add_argument("--max-len", type=int, default=5, help="longest prompt (digits)")
    p.add_argument("--prompts", type=int, default=32, help="prompts per batch")
    p.add_argument("--group", type=int, default=8, help="responses sampled per prompt (the GRPO group)")
    p.add_argument("--iterations", type=int, default=1000, help="the budget: updates before giving up")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--target", type=float, default=0.95, help="greedy exact-match accuracy that counts as learned")
    p.add_argument("--eval-every", type=int, default=10, help="updates between greedy evaluations")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (the tensors are tiny: one thread is fastest, and steady on a busy machine)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide the tqdm bar")
    return p.parse_args(argv)


class TinyLM(nn.Module):
    """A causal language model small enough to train in seconds: an MLP that predicts token
    ``i + 1`` from the one-hot tokens ``0 .. i`` of the row (the later ones zeroed) and the position
    ``i``. One forward pass scores every position of the row, as a transformer does."""

    def __init__(self, length: int, width: int = 128):
        super().__init__()
        self.length = length
        self.net = nn.Sequential(nn.Linear(length * (VOCAB + 1), width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, VOCAB))

    def forward(self, x):
        """Logits ``[B, L, VOCAB]``: position ``i`` predicts token ``i + 1``."""
        B, L = x.shape
        seen = torch.tril(torch.ones(L, L))                                        # [i, j] = j <= i
        ctx = seen[None, :, :, None] * nn.functional.one_hot(x, VOCAB)[:, None]  # [B, i, j, VOCAB]
        ctx = nn.functional.pad(ctx, (0, 0, 0, self.length - L)).reshape(B, L, -1)
        pos = torch.eye(self.length)[:L].expand(B, L, self.length)
        return self.net(torch.cat([ctx, pos], -1))


def prompts(n, max_len, g):
    """``n`` prompts, left-padded to ``max_len`` and followed by SEP; and their targets (the digits
    reversed, then EOS, then PAD), ``[n, max_len + 1]``."""
    lengths = torch.randint(1, max_len + 1, (n,), generator=g)
    digits = torch.randint(0, DIGITS, (n, max_len), generator=g)
    pos = torch.arange(max_len)
    prompt = torch.where(pos >= max_len - lengths[:, None], digits, PAD)  # the last `length` slots hold the digits
    # target j: prompt digit max_len-1-j (reversed) for j < length, then EOS
    target = torch.full((n, max_len + 1), PAD)
    target[:, :max_len] = torch.where(pos < lengths[:, None], digits.flip(1), PAD)
    target.scatter_(1, lengths[:, None], EOS)
    return torch.cat([prompt, torch.full((n, 1), SEP)], 1), target


@torch.no_grad()
def generate(model, prompt, steps, g=None):
    """Sample (``g`` given) or decode greedily ``steps`` response tokens after each prompt; after EOS
    the row is PAD. Returns the rows ``[B, P + steps]`` and ``response_mask`` over them."""
    rows = prompt
    done = torch.zeros(prompt.shape[0], dtype=torch.bool)
    masks = [torch.zeros_like(prompt, dtype=torch.bool)]
    for _ in range(steps):
        logits = model(rows)[:, -1].log_softmax(-1)
        tok = logits.argmax(-1) if g is None else torch.multinomial(logits.exp(), 1, generator=g)[:, 0]
        tok = torch.where(done, PAD, tok)
        masks.append(~done[:, None])          # a generated token (EOS included); padding after it is not
        done = done | (tok == EOS)
        rows = torch.cat([rows, tok[:, None]], 1)
    return rows, torch.cat(masks, 1)


def scores(response, target):
    """Fraction of the target's positions (digits and EOS) the response got right."""
    care = target != PAD
    return ((response == target) & care).sum(1) / care.sum(1)


def grpo_advantages(score, response_mask, group):
    """verl's GRPO by rollbuf: each score on its response's last token, the rows of one prompt
    (``group`` contiguous rows) one group; the advantage on every response token, 0 elsewhere."""
    T = response_mask.shape[1]
    last = T - 1 - response_mask.flip(1).to(torch.int64).argmax(1)  # every row has a response token
    rewards = torch.zeros(response_mask.shape).scatter_(1, last[:, None], score[:, None])
    index = torch.arange(score.numel()) // group  # the prompt of each row
    return compute_grpo_outcome_advantage(rewards, response_mask, index)[0]


def train(args) -> bool:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    P, steps = args.max_len + 1, args.max_len + 1
    model = TinyLM(P + steps)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    eval_prompt, eval_target = prompts(512, args.max_len, torch.Generator().manual_seed(args.seed + 1))
    bar = tqdm(total=args.iterations, unit="update", disable=not args.progress, dynamic_ncols=True)
    accuracy, start = 0.0, time.perf_counter()
    for it in range(1, args.iterations + 1):
        prompt, target = prompts(args.prompts, args.max_len, g)
        prompt, target = prompt.repeat_interleave(args.group, 0), target.repeat_interleave(args.group, 0)
        model.eval()
        rows, response_mask = generate(model, prompt, steps, g)
        score = scores(rows[:, P:], target)
        adv = grpo_advantages(score, response_mask, args.group)
        model.train()
        logp = model(rows[:, :-1]).log_softmax(-1).gather(-1, rows[:, 1:, None])[..., 0]  # token i+1 given ..i
        m = response_mask[:, 1:]                       # only the response's log-probs count, not the prompt's
        loss = -(adv[:, 1:] * logp * m).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % args.eval_every == 0 or it == args.iterations:
            model.eval()
            greedy, _ = generate(model, eval_prompt, steps)
            accuracy = (greedy[:, P:] == eval_target).all(1).float().mean().item()
        bar.set_postfix(score=f"{score.mean().item():.3f}", greedy_acc=f"{accuracy:.3f}")
        bar.update(1)
        if accuracy >= args.target:
            break
    bar.close()
    took = time.perf_counter() - start
    if accuracy >= args.target:
        print(f"learned: greedy exact-match accuracy {accuracy:.3f} >= {args.target} after {it} updates "
              f"({it * args.prompts * args.group} sampled responses, {took:.1f} s)")
        return True
    print(f"did NOT learn within {args.iterations} updates: greedy exact-match accuracy {accuracy:.3f} "
          f"< {args.target} ({took:.1f} s)")
    return False


if __name__ == "__main__":
    sys.exit(0 if train(parse_args()) else 1)
