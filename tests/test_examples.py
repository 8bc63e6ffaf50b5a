"""The examples run and reach what they claim (they exit non-zero otherwise)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script, *args, timeout=600):
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_linear_recurrence_layer_recovers_the_decays():
    res = _run("linear_recurrence.py")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "recovered decays" in res.stdout


def test_demo_shows_the_auto_backend():
    """The demo runs what a call without ``backend=`` runs (``auto``: numba on a CPU, Triton on a GPU),
    says which backend that is, and compares it with the reference loop."""
    import torch

    from rollbuf import backends

    res = _run("demo.py")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    picked = backends.resolve("auto", torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    assert f"backend='auto' (auto picked {picked!r})" in res.stdout, res.stdout[:500]
    assert f": auto ({picked}) " in res.stdout and "reference loop" in res.stdout, res.stdout[-500:]
    assert "GAE vs the float64 reference loop: max |error|" in res.stdout


def test_ppo_cartpole_reaches_475(tmp_path):
    pytest.importorskip("gymnasium")  # in the test extra; this guards a bare install only
    res = _run("ppo_cartpole.py", "--plot", str(tmp_path / "c.png"), "--log", str(tmp_path / "c.csv"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "reached mean return 475" in res.stdout
    assert (tmp_path / "c.png").exists() and (tmp_path / "c.csv").exists()


def test_ppo_cartpole_writes_to_runs_by_default(tmp_path):
    """Started from any directory, the example writes under ./runs/ppo_cartpole (git-ignored), never
    a docs/img/ of the current directory; --out moves both files."""
    pytest.importorskip("gymnasium")
    script = ROOT / "examples" / "ppo_cartpole.py"
    args = [sys.executable, str(script), "--total-timesteps", "1024", "--no-progress"]
    res = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]  # 1024 steps: target not reached
    assert "did NOT reach" in res.stdout
    out = tmp_path / "runs" / "ppo_cartpole"
    assert (out / "ppo_cartpole.png").is_file() and (out / "ppo_cartpole_log.csv").is_file()
    assert not (tmp_path / "docs").exists()
    res = subprocess.run([*args, "--out", "elsewhere", "--plot", ""], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert (tmp_path / "elsewhere" / "ppo_cartpole_log.csv").is_file()
    assert not (tmp_path / "elsewhere" / "ppo_cartpole.png").exists()
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/ppo_cartpole/x.csv"], cwd=ROOT)
    assert ignored.returncode == 0, "runs/ is not git-ignored"


def test_ppo_cartpole_help_shows_defaults_plainly():
    res = _run("ppo_cartpole.py", "--help")
    assert res.returncode == 0
    assert "(default: True)" not in res.stdout and "(default: False)" not in res.stdout
    assert "(default: None)" not in res.stdout
    for shown in ("(default: 128)", "(default: 0.99)", "(default: runs/ppo_cartpole)", "(default: CartPole-v1)"):
        assert shown in res.stdout, shown


def test_sb3_ppo_cartpole_runs_and_matches_sb3():
    """The SB3 example on a small budget, comparing every rollout with SB3's own method."""
    pytest.importorskip("stable_baselines3")
    res = _run("sb3_ppo_cartpole.py", "--timesteps", "1024", "--target", "0", "--check", "--eval-episodes", "2")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "checked 4 rollouts against SB3's compute_returns_and_advantage" in res.stdout


def test_sb3_ppo_cartpole_shows_progress():
    """The SB3 example shows a progress bar over the env steps SB3 runs (whole rollouts of 8 × 32),
    unless --no-progress; its summary counts those steps."""
    pytest.importorskip("stable_baselines3")
    res = _run("sb3_ppo_cartpole.py", "--timesteps", "300", "--target", "0", "--eval-episodes", "1")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "SB3 PPO + rollbuf: 100%" in res.stderr and "512/512" in res.stderr, res.stderr[-2000:]
    assert "on CartPole-v1: 512 steps in" in res.stdout
    res = _run("sb3_ppo_cartpole.py", "--timesteps", "256", "--target", "0", "--eval-episodes", "1", "--no-progress")
    assert res.returncode == 0 and "SB3 PPO + rollbuf:" not in res.stderr, res.stderr[-2000:]


def test_benchmark_scripts_run():
    """The TorchRL and SB3 benchmark scripts print their tables (tiny shapes here)."""
    pytest.importorskip("torchrl")
    pytest.importorskip("stable_baselines3")
    res = _run("bench_torchrl_gae.py", "--device", "cpu", "--shapes", "3x17", "--warmup", "0", "--repeats", "1")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [line for line in res.stdout.splitlines() if line.startswith("| GAE") or line.startswith("| TDLambda")]
    assert len(rows) == 2 and all(float(r.split("|")[-2]) < 1e-4 for r in rows), res.stdout
    res = _run("bench_sb3_gae.py", "--shapes", "17x3", "--warmup", "0", "--repeats", "1")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [line for line in res.stdout.splitlines() if line.startswith("| 17 × 3")]
    assert len(rows) == 1 and float(rows[0].split("|")[-2]) < 1e-4, res.stdout


def test_torchrl_benchmark_defaults_are_the_documented_tables():
    """examples/bench_torchrl_gae.py run with no arguments produces the tables of
    docs/howto/torchrl.md: on a CPU the CPU table's shapes, one thread, the median of 15 calls; on
    CUDA the GPU table's shapes, torch's threads, the median of 20."""
    pytest.importorskip("torchrl")
    spec = importlib.util.spec_from_file_location("bench_torchrl_gae", ROOT / "examples" / "bench_torchrl_gae.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    doc = (ROOT / "docs" / "howto" / "torchrl.md").read_text(encoding="utf-8")
    cpu = doc[doc.index("<!-- BEGIN TORCHRL CPU TABLE -->"):doc.index("<!-- END TORCHRL CPU TABLE -->")]
    gpu = doc[doc.index("**GPU** (`python examples/bench_torchrl_gae.py --device cuda`)"):]
    gpu = gpu[:gpu.index("\n\n", gpu.index("| estimator |"))]

    def shapes(table):
        rows = re.findall(r"^\| GAE \| (\d+) × (\d+) \|", table, re.M)
        return ",".join(f"{n}x{t}" for n, t in rows)

    for device, table, threads, repeats in [("cpu", cpu, 1, 15), ("cuda", gpu, 0, 20)]:
        args = bench.parse_args(["--device", device])
        assert args.shapes == shapes(table), device
        assert (args.threads, args.repeats, args.warmup) == (threads, repeats, 3), device
        assert f"median of {repeats}" in table and "after 3 warm-up calls" in table.replace("\n", " "), device
        assert ("torch threads 1" in table) == (device == "cpu"), device


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_agent_toy_learns():
    """The multi-turn tool-call example learns to call the tool and answer with its reply on the CPU
    (it exits 1 otherwise)."""
    res = _run("agent_toy.py", "--no-progress")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "learned: greedy success" in res.stdout


def test_agent_toy_credits_turns_and_masks_the_tool_reply():
    """The example's episodes and advantages: the tool's reply and the prompt are masked out, a call's
    turn gets its format reward plus γ times the answer's, an episode without a call has one turn,
    and each advantage is the return less its group's mean return at that token position."""
    import torch

    toy = _load_example("agent_toy")
    P = 4

    def policy(first):  # greedy: `first` in turn 1, then the digit 3
        def logits(x):
            out = torch.zeros(*x.shape, toy.VOCAB)
            out[:, -1, first if x.shape[1] == P else 3] = 1.0
            return out
        return logits

    prompt = torch.tensor([[0, 1, 2, toy.SEP]] * 2)
    rows, m, r = toy.episodes(policy(toy.CALL), prompt, torch.tensor([3, 1]))
    assert rows.tolist() == [[0, 1, 2, toy.SEP, toy.CALL, toy.TOOL, 3, 3], [0, 1, 2, toy.SEP, toy.CALL, toy.TOOL, 1, 3]]
    assert m[:, [P, P + 3]].all() and not m[:, P + 1:P + 3].any() and r[:, -1].tolist() == [1.0, 0.0]
    rows, m, r = toy.episodes(policy(2), prompt, torch.tensor([2, 2]))  # no call: no reward, one turn
    assert rows[0, P:].tolist() == [2, toy.PAD, toy.PAD, toy.PAD] and m.sum().item() == 2 and r.sum().item() == 0
    mask = torch.zeros(4, 8, dtype=torch.bool)
    mask[:, P] = True
    mask[[0, 1, 3], P + 3] = True
    rewards = torch.zeros(4, 8)
    rewards[[0, 1, 3], P] = 0.1
    rewards[[0, 3], P + 3] = 1.0
    adv = toy.advantages(rewards, mask, 2, 0.9)
    ret = torch.tensor([[1.0, 1.0], [0.1, 0.0], [0.0, 0.0], [1.0, 1.0]])  # turn 1, turn 2
    base = torch.tensor([[0.55, 0.5], [0.55, 0.5], [0.5, 1.0], [0.5, 1.0]])  # per group (rows 0-1, 2-3)
    expect = torch.zeros(4, 8)
    expect[:, P], expect[:, P + 3] = ret[:, 0] - base[:, 0], (ret[:, 1] - base[:, 1]) * mask[:, P + 3]
    torch.testing.assert_close(adv, expect)
    assert (adv[:, :P] == 0).all() and (adv[:, P + 1:P + 3] == 0).all()


def test_grpo_toy_learns():
    """The toy GRPO example learns its task on the CPU (it exits 1 otherwise) in seconds."""
    res = _run("grpo_toy.py", "--no-progress")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "learned: greedy exact-match accuracy" in res.stdout


def test_grpo_toy_runs_short_with_a_progress_bar():
    res = _run("grpo_toy.py", "--iterations", "3", "--eval-every", "3")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]  # 3 updates: not learned
    assert "did NOT learn within 3 updates" in res.stdout
    assert "3/3" in res.stderr and "greedy_acc=" in res.stderr, res.stderr[-2000:]


def test_grpo_toy_advantages_follow_the_response_mask():
    """The example's token advantages: the group-standardised score on every response token, 0 on
    the prompt and the padding; the targets are the prompts reversed."""
    import torch

    toy = _load_example("grpo_toy")
    score = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.2, 0.2, 0.8])
    g = score.view(2, 4)
    adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).reshape(-1)
    mask = torch.zeros(8, 9, dtype=torch.bool)
    for row, (start, n) in enumerate([(3, 1), (3, 6), (3, 2), (3, 4), (3, 3), (3, 5), (3, 1), (3, 6)]):
        mask[row, start:start + n] = True
    torch.testing.assert_close(toy.grpo_advantages(score, mask, 4), adv[:, None] * mask)
    prompt, target = toy.prompts(64, 5, torch.Generator().manual_seed(0))
    for p, t in zip(prompt.tolist(), target.tolist()):
        digits = [x for x in p[:-1] if x != toy.PAD]
        assert p[-1] == toy.SEP and t[:len(digits) + 1] == digits[::-1] + [toy.EOS]
        assert all(x == toy.PAD for x in t[len(digits) + 1:])
