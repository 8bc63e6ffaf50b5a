"""``python -m benchmarks COMMAND [options]`` (from the repository root): every measurement of
docs/benchmarks.md, and the tables of that page and of docs/llm.md from the committed results.

``python -m benchmarks COMMAND --help`` lists a command's options with their defaults.
"""

from __future__ import annotations

import importlib
import sys

#: command -> (module, what it does)
COMMANDS = {
    "scoreboard": ("benchmarks.scoreboard", "gate, time and score every competitor on a grid of cases "
                                            "(cpu-smoke, cpu, gpu-quick, gpu, llm, peers, naive)"),
    "cpu": ("benchmarks.cpu", "GAE on the CPU against SB3, CleanRL, TorchRL and a plain numba loop; first calls"),
    "host": ("benchmarks.host_time", "host time per call of a small GAE call on the GPU (4096 x 128)"),
    "host-path": ("benchmarks.host_path", "the eager calls' host time on rl-triton's grid, a CUDA graph of nine "
                                          "calls against their device time, graph replays (--dry-run: CPU)"),
    "backward": ("benchmarks.backward", "gradient (fwd+bwd) time next to the forward, gated against float64"),
    "memory": ("benchmarks.memory", "peak extra device memory of a first and a second call, every strategy"),
    "llm": ("benchmarks.llm", "LLM-RL GAE over multi-turn token rows against verl's token loop"),
    "llm-groups": ("benchmarks.llm_groups", "verl's vectorized GRPO and RLOO against rollbuf.integrations.verl (GPU)"),
    "llm-agents": ("benchmarks.llm_agents", "OTB, TIR-OTB, GiGPO and the turn-level estimators against the loops "
                                            "they replace (GPU; --dry-run: CPU)"),
    "turn-device": ("benchmarks.turn_device", "device time of turn_returns and turn_gae against the token-level "
                                              "masked GAE (GPU)"),
    "frameworks": ("benchmarks.frameworks", "OpenRLHF's, AReaL's, SkyRL's, slime's and TRL's advantage code against "
                                             "the rollbuf calls that replace it (GPU; --dry-run: CPU)"),
    "wall": ("benchmarks.wall", "every estimator at 2^24 elements in every aspect ratio against a device copy; "
                                "--sweep: GAE under forced strategies (GPU; --dry-run: CPU)"),
    "distributed": ("benchmarks.distributed", "rollbuf.distributed: the exchange against the local work, per rank"),
    "fetch-peers": ("benchmarks.competitors", "copy DIR/rl-triton-* and DIR/pufferlib-* into .peers/ (git-ignored)"),
    "tables": ("benchmarks.tables", "write docs/benchmarks.md's and docs/llm.md's tables from benchmarks/results/ "
                                   "(--check: compare)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    return "\n".join(["usage: python -m benchmarks COMMAND [options]   (from the repository root)", "",
                      "Every measurement of docs/benchmarks.md, and the tables of that page and of docs/llm.md "
                      "from the committed results.", "", "commands:"]
                     + [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
                     + ["", "python -m benchmarks COMMAND --help: the command's options and their defaults"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        raise SystemExit(f"unknown command {name!r}; known: {', '.join(COMMANDS)}")
    if name == "fetch-peers":
        from benchmarks.competitors import fetch_peers, peers_dir

        if len(rest) != 1 or rest[0].startswith("-"):
            print("usage: python -m benchmarks fetch-peers DIR\n\n" + COMMANDS[name][1])
            return 0 if rest and rest[0] in ("-h", "--help") else 2
        copied = fetch_peers(rest[0])
        print(f"copied {', '.join(copied)} into {peers_dir()}")
        return 0
    rc = importlib.import_module(COMMANDS[name][0]).main(rest)
    return 0 if rc is None else int(rc)


if __name__ == "__main__":
    raise SystemExit(main())
