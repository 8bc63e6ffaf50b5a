"""The rollbuf.integrations package: the old module paths, and the optional dependencies in CI.

``rollbuf.gym`` and ``rollbuf.llm`` moved to ``rollbuf.integrations.gym`` / ``.llm``; the old paths
still import (the same objects, private helpers included) and warn with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings

import pytest


def _fresh_import(name, monkeypatch):
    """Import ``name`` anew (its warning fires at import); sys.modules is restored afterwards."""
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


@pytest.mark.parametrize("old,new", [("rollbuf.gym", "rollbuf.integrations.gym"),
                                     ("rollbuf.llm", "rollbuf.integrations.llm")])
def test_old_path_warns_and_aliases(old, new, monkeypatch):
    module = importlib.import_module(new)
    with pytest.warns(DeprecationWarning, match=f"{old} has moved to {new}"):
        alias = _fresh_import(old, monkeypatch)
    assert alias.__all__ == module.__all__
    for name in module.__all__:
        assert getattr(alias, name) is getattr(module, name)
    private = [n for n in vars(module) if n.startswith("_") and not n.startswith("__")]
    assert private and all(getattr(alias, n) is getattr(module, n) for n in private)
    with pytest.raises(AttributeError):
        alias.no_such_name  # noqa: B018
    # `from old import name` works too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ns = {}
        exec(f"from {old} import {module.__all__[0]}", ns)
    assert ns[module.__all__[0]] is getattr(module, module.__all__[0])


def test_new_paths_do_not_warn():
    """In a fresh interpreter, with DeprecationWarning an error."""
    code = "import rollbuf.integrations, rollbuf.integrations.gym, rollbuf.integrations.llm"
    res = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only: a developer may run without them")
def test_ci_has_the_third_party_oracles():
    """CI installs TorchRL and Stable-Baselines3 (the test extra), so the comparisons with them run:
    none of their tests may be skipped there."""
    import stable_baselines3  # noqa: F401
    import torchrl  # noqa: F401

    import rollbuf.integrations.sb3  # noqa: F401
    import rollbuf.integrations.torchrl  # noqa: F401


def _tensordict_before_0_15():
    import tensordict

    major, minor = (int(x) for x in tensordict.__version__.split(".")[:2])
    return (major, minor) < (0, 15)


def test_rollout_keeps_its_docstring():
    from rollbuf import Rollout

    assert Rollout.__doc__ and Rollout.__doc__.startswith("A window of"), Rollout.__doc__[:120]
