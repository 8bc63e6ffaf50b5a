"""A linear-recurrence layer on rollbuf's differentiable scan, trained by gradient descent.

    python examples/linear_recurrence.py

The layer is ``h_t = g·x_t + β·h_{t−1}`` per channel, with a learned decay ``β = sigmoid(w)`` and
gain ``g``, computed by ``rollbuf.functional.affine_scan`` (the fused kernel on CUDA, the vectorised
scan on the CPU). It is fitted to a hidden exponential filter (decays 0.5, 0.9, 0.99) of a noisy
signal; gradients flow through the scan into ``β`` and ``g``. The script prints the loss and the
recovered decays, and exits non-zero if they are not within 1e-2 of the true ones.
"""

from __future__ import annotations

import sys

import torch

from rollbuf import functional as F

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
true_decay = torch.tensor([0.5, 0.9, 0.99], device=device)
true_gain = torch.tensor([1.0, 0.5, 0.1], device=device)
C, N, T = 3, 16, 512


def layer(x, decay, gain):
    """x: [N, C, T] -> h: [N, C, T], h_t = gain·x_t + decay·h_{t−1}, h_{−1} = 0."""
    alpha = gain[:, None] * x
    beta = decay[:, None].expand_as(x)
    return F.affine_scan(alpha, beta, reverse=False)


w = torch.zeros(C, device=device, requires_grad=True)  # decay = sigmoid(w) starts at 0.5
g = torch.ones(C, device=device, requires_grad=True)
opt = torch.optim.Adam([w, g], lr=0.05)
for step in range(400):
    x = torch.randn(N, C, T, device=device)
    with torch.no_grad():
        target = layer(x, true_decay, true_gain)
    pred = layer(x, torch.sigmoid(w), g)
    loss = (pred - target).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 50 == 0 or step == 399:
        print(f"step {step:3d}  loss {loss.item():.2e}  decay {torch.sigmoid(w).tolist()}")

err = (torch.sigmoid(w) - true_decay).abs().max().item()
print(f"recovered decays {[round(d, 4) for d in torch.sigmoid(w).tolist()]} (true {true_decay.tolist()}), "
      f"max error {err:.1e}")
sys.exit(0 if err < 1e-2 else 1)
