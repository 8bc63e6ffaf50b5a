"""Named experiments of ``python -m rollbuf.bench --experiment NAME [its arguments]``.

Each is a module of this package with ``main(argv) -> int``; ``--experiment NAME --help`` prints
its own options. The kernel decisions they measured, with their numbers, commits and CSVs, are in
docs/benchmarks.md; CSVs are committed under ``benchmarks/results/``.
"""

from __future__ import annotations

import importlib

#: name -> (module, what it measures)
EXPERIMENTS = {
    "why": ("why", "per-shape % of copy and why it is below 85%, from scoreboard CSVs (docs table)"),
    "ab": ("ab", "kernel variants (environment settings) side by side on chosen cases, each in its own process"),
    "memory": ("memory", "peak extra device memory of a first and a second call, every strategy (P4)"),
    "backward": ("backward", "gradient (fwd+bwd) time next to the forward, gated against float64 gradients"),
    "profile-backward": ("profile_backward", "host vs device time and launches of one fwd+bwd call"),
    "launch-overhead": ("launch_overhead", "the small-shape full call split into Python, Triton launch, kernel"),
    "call-overhead": ("call_overhead", "our Python per call with the kernel launch stubbed (any machine)"),
    "llm-gpu": ("llm_gpu", "LLM-RL GAE on the GPU against verl's multi-turn token loop"),
    "llm-cpu": ("llm_cpu", "LLM-RL GAE on the CPU (torch backend) against verl's token loop"),
    "e2e-ppo": ("e2e_ppo", "one PPO update with the eager-loop GAE and with rollbuf's, and GAE's share"),
    "cpu-torch": ("cpu_torch", "the CPU torch backend against the sequential reference loop"),
    "distributed": ("distributed", "rollbuf.distributed: the exchange against the local work, per rank"),
}


def run(name: str, argv: list[str]) -> int:
    if name not in EXPERIMENTS:
        raise SystemExit(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    mod = importlib.import_module(f"rollbuf.bench.experiments.{EXPERIMENTS[name][0]}")
    rc = mod.main(argv)
    return 0 if rc is None else int(rc)
