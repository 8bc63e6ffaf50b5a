"""rollbuf in one screen: a rollout with a termination, a truncation and a window end, every
estimator on the ``auto`` backend (what a call without ``backend=`` gets: the fused Triton kernels on
a GPU, the compiled numba loops on a CPU), and its time against the sequential reference loop.

    python examples/demo.py
"""

from __future__ import annotations

import time

import torch

from rollbuf import Rollout, backends

torch.set_printoptions(precision=3, linewidth=140, sci_mode=False)
device = "cuda" if torch.cuda.is_available() else "cpu"
backend = "auto"  # the default of every estimator
picked = backends.resolve(backend, torch.device(device))  # what auto runs on this device

# ---- collect: 2 envs x 8 steps, filled step by step as a trainer would ------------------------
N, T = 2, 8
ro = Rollout.empty(N, T, device=device)
g = torch.Generator().manual_seed(0)
for t in range(T):
    ro.record(
        t,
        rewards=torch.ones(N),
        values=torch.rand(N, generator=g),
        terminated=torch.tensor([t == 2, False]),  # env 0: the episode ends for good after step 2
        truncated=torch.tensor([False, t == 4]),  # env 1: a time limit cuts its episode after step 4
        log_probs=torch.full((N,), -0.7),
        bootstrap_values=torch.tensor([float("nan"), 0.9 if t == 4 else float("nan")]),  # V(s'_4)
    )
ro.bootstrap(torch.tensor([0.5, 0.6]))  # V(s_T): the window ends mid-episode for both envs

print(f"rollout {N}x{T} on {device}, backend={backend!r} (auto picked {picked!r})")
print("terminated\n", ro.terminated.int(), "\ntruncated\n", ro.truncated.int())
target = ro.log_probs + 0.1 * torch.randn(N, T, generator=g).to(device)
q = ro.values + 0.05
results = {
    "gae advantages": ro.gae(0.99, 0.95, backend=backend).advantages,
    "lambda_returns": ro.lambda_returns(0.99, 0.95, backend=backend),
    "discounted_returns": ro.discounted_returns(0.99, backend=backend),
    "monte carlo returns": ro.discounted_returns(0.99, bootstrap=False, backend=backend),
    "vtrace vs": ro.vtrace(target, 0.99, backend=backend).vs,
    "retrace q_targets": ro.retrace(q, target, 0.99, lam=0.95, backend=backend),
    "eligibility_traces": ro.eligibility_traces(ro.rewards, 0.99, 0.95, backend=backend).traces,
    "episodic_sums": ro.episodic_sums(backend=backend).sums,
}
for name, out in results.items():
    print(f"\n{name}\n{out}")
check = ro.gae(0.99, 0.95, backend="reference").advantages
err = (results["gae advantages"].double().cpu() - check.cpu()).abs().max().item()
print(f"\nGAE vs the float64 reference loop: max |error| = {err:.2e}")

# ---- speed: the same GAE on a bigger rollout, against the sequential reference loop -------------
N, T = (4096, 128) if device == "cuda" else (8, 32768)
big = Rollout(
    rewards=torch.randn(N, T, device=device), values=torch.randn(N, T, device=device),
    terminated=torch.rand(N, T, device=device) < 0.01, truncated=torch.rand(N, T, device=device) < 0.01,
    bootstrap_values=torch.randn(N, T, device=device), batch_size=[N, T], device=device,
)
big.gae(0.99, 0.95, backend=backend)  # warm-up (compiles the kernel: Triton on a GPU, numba on a CPU)
reps = 20
if device == "cuda":
    torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(reps):
    fast = big.gae(0.99, 0.95, backend=backend)
if device == "cuda":
    torch.cuda.synchronize()
t_fast = (time.perf_counter() - t0) / reps
t0 = time.perf_counter()
slow = big.cpu().gae(0.99, 0.95, backend="reference")
t_ref = time.perf_counter() - t0
err = ((fast.advantages.double().cpu() - slow.advantages).norm() / slow.advantages.norm()).item()
print(f"\nGAE {N}x{T}: {backend} ({picked}) {t_fast * 1e3:.2f} ms, reference loop {t_ref * 1e3:.0f} ms "
      f"-> {t_ref / t_fast:.0f}x, relative L2 error {err:.1e}")
