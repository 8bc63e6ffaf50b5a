"""The covering slices the default test run takes of the large matrices (tests/covering.py,
tests/conftest.py): what a slice covers, that it is deterministic, and that the default run and
``-m exhaustive`` split a covering test's cases between them with nothing lost."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys

import pytest

from covering import covering

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _matrix():
    axes = {"a": range(8), "b": range(5), "c": range(4), "d": range(6)}
    return {"-".join(map(str, v)): list(zip(axes, v)) for v in itertools.product(*axes.values())}


@pytest.mark.parametrize("strength", [1, 2])
def test_every_value_or_pair_is_covered(strength):
    cases = _matrix()
    chosen = covering(cases, strength)
    assert len(set(chosen)) == len(chosen) and set(chosen) <= set(cases)
    k = strength
    want = {c for v in cases.values() for c in itertools.combinations(sorted(v), k)}
    got = {c for name in chosen for c in itertools.combinations(sorted(cases[name]), k)}
    assert got == want
    assert len(chosen) < (len(cases) // 10 if strength == 2 else 9)  # 960 cases: 8 for k=1, about 50 for k=2


def test_a_slice_depends_on_the_cases_alone():
    cases = _matrix()
    shuffled = list(cases.items())
    random.Random(3).shuffle(shuffled)
    assert covering(cases) == covering(dict(shuffled))
    assert covering({"x": [("p", 1)]}) == ["x"]
    assert covering({"x": [("p", 1)], "y": [("p", 1)]}, 1) in (["x"], ["y"])
    with pytest.raises(ValueError, match="strength"):
        covering(cases, 3)


def _collect(*args, env=None):
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                          "tests/test_kernels.py", "-k", "test_matches_reference", *args],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return {line.strip() for line in res.stdout.splitlines() if "::" in line}


def test_default_and_exhaustive_runs_split_the_matrix():
    """test_kernels.py's reference matrix: the default run takes a slice holding every pair of
    parameter values (every strategy for every estimator among them), ``-m exhaustive`` the rest."""
    import test_kernels as TK

    env = {"RB_EXHAUSTIVE": ""}
    default, rest = _collect(env=env), _collect("-m", "exhaustive", env=env)
    n_strategies = 8  # the split fixture: walk, look-back, three passes, two passes x gather, reload
    assert not default & rest and 0 < len(default) < len(rest) // 4, (len(default), len(rest))
    assert len(default) + len(rest) == len(TK.ESTIMATORS) * len(TK.MIXES) * len(TK.SHAPES) * n_strategies

    def strategy_and_name(nodeid):  # "...[walk-gather-gae-term-N2-T13]" -> ("walk-gather", "gae")
        split, kind, name = nodeid.split("[", 1)[1].split("-")[:3]
        return f"{split}-{kind}", name

    full = {strategy_and_name(n) for n in default | rest}
    assert len(full) == n_strategies * len(TK.ESTIMATORS)
    assert {strategy_and_name(n) for n in default} == full
