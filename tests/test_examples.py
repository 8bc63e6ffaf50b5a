"""The examples run and reach what they claim (they exit non-zero otherwise)."""

from __future__ import annotations

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


def test_ppo_cartpole_reaches_475(tmp_path):
    pytest.importorskip("gymnasium")  # in the test extra; this guards a bare install only
    res = _run("ppo_cartpole.py", "--plot", str(tmp_path / "c.png"), "--log", str(tmp_path / "c.csv"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "reached mean return 475" in res.stdout
    assert (tmp_path / "c.png").exists() and (tmp_path / "c.csv").exists()
