"""A PPO-style update with no per-call host cost (docs/howto/performance.md runs this).

At small shapes a Python call costs more than the kernel: every eager estimator call is validated
and launched from Python. Two ways to pay only the device time, both between the markers:

* ``torch.compile(fullgraph=True)`` of the step (each estimator is one opaque custom op, no graph
  break; a ``Rollout``'s methods compile too: the whole update below, on a GPU);
* on a GPU, capturing the whole update once in a CUDA graph — here nine estimator calls on one
  ``Rollout`` and the advantage normalisation — and replaying it every update. No rollbuf call
  synchronises the host with the device or allocates outside PyTorch's caching allocator, so the
  calls capture as they are. The collector writes each new window into the *same* rollout in place
  (``record``, ``bootstrap``), and the other inputs are copied into the captured buffers; the replay
  then reads the new data.

``python docs/examples/graphed_advantages.py`` checks both against the eager calls (the CUDA graph on
a GPU only) and prints the largest difference.
"""

from __future__ import annotations

import torch

# --8<-- [start:graphed]
import rollbuf.functional as F  # noqa: E402
from rollbuf import Rollout  # noqa: E402


def advantages_step(rewards, values, terminated, truncated, bootstrap_values):
    adv, ret = F.gae(0.99, 0.95, rewards=rewards, values=values, terminated=terminated,
                     truncated=truncated, bootstrap_values=bootstrap_values)
    return (adv - adv.mean()) / (adv.std() + 1e-8), ret  # normalised advantages, returns


compiled_step = torch.compile(advantages_step, fullgraph=True)


def update_targets(ro: Rollout, target_log_probs, q_values, features):
    """The targets of one update: nine estimator calls on one rollout (``[N, T]``), all captured."""
    adv, ret = ro.gae(0.99, 0.95)
    vs, pg = ro.vtrace(target_log_probs, 0.99, rho_bar=1.0, c_bar=1.0)
    return ((adv - adv.mean()) / (adv.std() + 1e-8), ret,
            ro.lambda_returns(0.99, 0.8), ro.discounted_returns(0.99), ro.discounted_returns(0.99, bootstrap=False),
            vs, pg, ro.retrace(q_values, target_log_probs, 0.99, lam=0.9),
            ro.eligibility_traces(features, 0.99, 0.9).traces, ro.episodic_sums().sums)


def graphed(step, *static_inputs):
    """Capture ``step(*static_inputs)`` in a CUDA graph; returns ``replay()``, which replays it on
    what ``static_inputs`` hold now (write new data into them in place first) and returns the
    graph's outputs (the same tensors every time: clone them to keep a result past the next replay)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture: compiles the kernels
        step(*static_inputs)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outputs = step(*static_inputs)

    def replay():
        g.replay()
        return outputs

    return replay
# --8<-- [end:graphed]


def make_inputs(N=64, T=128, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    r = torch.randn(N, T, device=device, generator=g)
    v = torch.randn(N, T, device=device, generator=g)
    k = torch.rand(N, T, device=device, generator=g) < 0.02
    tr = torch.rand(N, T, device=device, generator=g) < 0.01
    bv = torch.randn(N, T, device=device, generator=g)
    return r, v, k, tr, bv


def collect(ro: Rollout, seed: int):
    """What a collector does each update: write every step of the window into ``ro`` in place, then
    close it; returns the update's other inputs (target log-probabilities, Q-values, features)."""
    N, T = ro.batch_size
    g = torch.Generator(device=ro.device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=ro.device, generator=g)

    for t in range(T):
        ro.record(t, rewards=randn(N), values=randn(N), log_probs=0.3 * randn(N),
                  terminated=randn(N) > 2.0, truncated=randn(N) > 2.3, bootstrap_values=randn(N))
    ro.bootstrap(randn(N))
    return 0.3 * randn(N, T), randn(N, T), randn(N, T, 3)


def largest(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = make_inputs(device=device)
    diffs = {"compiled": largest(compiled_step(*x), advantages_step(*x))}
    ro = Rollout.empty(64, 128, device=device)
    extra = collect(ro, seed=0)
    if device == "cuda":  # (on the CPU, compiling the torch backend's nine scans takes minutes)
        diffs["compiled update"] = largest(torch.compile(update_targets, fullgraph=True)(ro, *extra),
                                           update_targets(ro, *extra))
        static = [t.clone() for t in extra]  # the captured buffers of the inputs outside the rollout
        replay = graphed(update_targets, ro, *static)
        for seed in (1, 2):  # new data each update, the same graph
            new = collect(ro, seed)  # in place: the rollout the graph reads
            for buf, t in zip(static, new):
                buf.copy_(t)
            got = replay()
            diffs[f"graph, update {seed}"] = largest(got, update_targets(ro, *new))
    for name, d in diffs.items():
        print(f"{name}: max |difference| to eager = {d:.2e}")
    return diffs


if __name__ == "__main__":
    main()
