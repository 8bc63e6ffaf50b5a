"""The rollbuf.integrations package: its modules import without warnings, the old module paths
(``rollbuf.gym``, ``rollbuf.llm``, removed) are gone, and the optional dependencies are there in CI."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest


def test_new_paths_do_not_warn():
    """In a fresh interpreter, with DeprecationWarning an error; the framework modules import without
    their framework (OpenRLHF, AReaL, slime, SkyRL are imported by the functions that patch or register)."""
    code = ("import rollbuf.integrations, rollbuf.integrations.gym, rollbuf.integrations.llm, "
            "rollbuf.integrations.openrlhf, rollbuf.integrations.areal, rollbuf.integrations.slime, "
            "rollbuf.integrations.skyrl")
    res = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only: a developer may run without them")
def test_ci_has_the_third_party_oracles():
    """CI installs TorchRL and Stable-Baselines3 (the test extra), so the comparisons with them run:
    none of their tests may be skipped there."""
    import stable_baselines3  # noqa: F401
    import torchrl  # noqa: F401

    import rollbuf.integrations.sb3
    import rollbuf.integrations.torchrl  # noqa: F401


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only: a developer may run without it")
@pytest.mark.skipif(sys.version_info < (3, 11), reason="TRL 1.16 needs Python >= 3.11")
def test_ci_has_trl():
    """CI installs TRL 1.16.0 (tests/requirements-verl.txt), so tests/test_trl.py runs whole there."""
    import trl

    import rollbuf.integrations.trl  # noqa: F401

    assert trl.__version__ == "1.16.0"


def _tensordict_before_0_15():
    import tensordict

    major, minor = (int(x) for x in tensordict.__version__.split(".")[:2])
    return (major, minor) < (0, 15)


def test_rollout_keeps_its_docstring():
    from rollbuf import Rollout

    assert Rollout.__doc__ and Rollout.__doc__.startswith("A window of"), Rollout.__doc__[:120]


@pytest.mark.parametrize("old", ["rollbuf.gym", "rollbuf.llm"])
def test_the_removed_module_paths_do_not_import(old):
    """``rollbuf.gym`` and ``rollbuf.llm`` were aliases of ``rollbuf.integrations.gym`` / ``.llm``;
    they are removed, and so is ``rollbuf.boundary.ESTIMATORS`` (use ``rollbuf.estimators.REGISTRY``)."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    import rollbuf.boundary

    assert not hasattr(rollbuf.boundary, "ESTIMATORS")
