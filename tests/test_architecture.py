"""The architecture holds (docs/architecture.md).

* the layer contract of pyproject.toml (import-linter): no import circle, no import from a lower
  layer back up;
* no module reaches for another module's private names (``from rollbuf.x import _y``, ``x._y``);
* imports inside functions are the few that keep optional or heavy dependencies (Triton, hypothesis,
  the kernels) off the import of ``rollbuf``, each listed here with its reason;
* the estimator list exists once: nothing in the package spells the list of estimator names but
  the registry.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rollbuf"
FILES = sorted(p for p in PKG.rglob("*.py"))


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def test_layer_contract_is_kept():
    pytest.importorskip("importlinter", reason="import-linter is in the test extra")
    from importlinter import cli

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        code = cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"))
    finally:
        os.chdir(cwd)
    assert code == cli.EXIT_STATUS_SUCCESS, "lint-imports: a layer contract of pyproject.toml is broken"


def _private_uses(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    me = _module(path)
    aliases: dict[str, str] = {}  # local name -> rollbuf module it refers to
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rollbuf"):
            for a in node.names:
                target = f"{node.module}.{a.name}"
                if a.name.startswith("_") and not a.name.startswith("__") and node.module != me:
                    bad.append(f"{me}: from {node.module} import {a.name}")
                aliases[a.asname or a.name] = target
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("rollbuf"):
                    aliases[a.asname or a.name.split(".")[0]] = a.asname and a.name or a.name.split(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = aliases.get(node.value.id)
            name = node.attr
            if target and target != me and name.startswith("_") and not name.startswith("__") \
                    and name not in _NAMEDTUPLE_API:
                bad.append(f"{me}: {node.value.id}.{name} ({target})")
    return bad


_NAMEDTUPLE_API = {"_fields", "_replace", "_asdict", "_make", "_field_defaults"}  # public, despite the "_"


def test_no_private_names_across_modules():
    bad = [b for f in FILES for b in _private_uses(f)]
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


# Imports inside functions, each with its reason. Anything else belongs at the top of its module.
LAZY = {
    ("rollbuf.backends", "rollbuf.backends.triton_backend"): "Triton is optional: imported when asked for",
    ("rollbuf.backends", "rollbuf.backends.compiled_cpu"): "numba's import costs ~0.5 s: on the first CPU call",
    ("rollbuf.backends.scan", "rollbuf.kernels"): "the fused scan needs Triton: imported when asked for",
    ("rollbuf.backends.autograd", "rollbuf.kernels"): "the fused adjoint needs Triton",
    ("rollbuf.testing", "hypothesis"): "hypothesis is a test dependency, needed by the strategies only",
    ("rollbuf.testing", "rollbuf.functional"): "the testing kit calls the public API (a layer above it)",
    ("rollbuf.distributed", "torch.distributed"): "imported by a sharded call only",
    ("rollbuf.integrations.torchrl", "tensordict"): "TorchRL's tensordict utilities, with TorchRL (optional)",
    ("rollbuf.integrations.torchrl", "torchrl.objectives.utils"): "TorchRL is an optional dependency",
    ("rollbuf.integrations.torchrl", "torchrl.objectives.value.advantages"): "TorchRL is an optional dependency",
}


def _lazy_imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    me = _module(path)
    found = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module:
                    mod = node.module
                    full = [f"{mod}.{a.name}" for a in node.names]
                    found.add((me, mod if not any(f in _PACKAGES for f in full) else full[0]))
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        found.add((me, a.name))
    return found


_PACKAGES = {"rollbuf.kernels", "rollbuf.functional", "rollbuf.estimators", "rollbuf.backends.triton_backend",
             "rollbuf.backends.compiled_cpu"}


@pytest.mark.parametrize("path", [f for f in FILES if not f.is_relative_to(PKG / "kernels")
                                  and f.name not in ("gym.py", "llm.py")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_inside_functions_have_a_reason(path):
    extra = {pair for pair in _lazy_imports(path) if pair not in LAZY}
    assert not extra, f"imports inside functions without a listed reason: {sorted(extra)}"


# Modules that may spell estimator names out: the two independent oracles (their per-estimator
# functions are the point: they share nothing with the registry's path).
_OWN_LISTS = ("estimators.py", "reference.py", "oracles.py")


def test_the_estimator_list_exists_once():
    """No module but the registry spells out the built-in estimator names as a list or a dict."""
    names = ("gae", "lambda_returns", "discounted_returns", "vtrace", "retrace", "eligibility_traces",
             "episodic_sums")
    offenders = []
    for f in FILES:
        if f.name in _OWN_LISTS:
            continue
        tree = ast.parse(f.read_text(), str(f))
        skip = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
                elts = node.keys if isinstance(node, ast.Dict) else node.elts
                consts = {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if len(consts & set(names)) >= 4:
                    offenders.append(f"{_module(f)}:{node.lineno}")
    assert not offenders, "estimator lists outside rollbuf/estimators.py: " + ", ".join(offenders)


def test_architecture_doc_names_every_layer():
    text = (ROOT / "docs" / "architecture.md").read_text()
    layers = re.findall(r'^\s*"([^"]+)",?$', _layers_block(), re.M)
    for layer in layers:
        for mod in re.split(r"\s*[|:]\s*", layer):
            assert f"rollbuf.{mod}" in text or f"rollbuf/{mod}" in text, f"docs/architecture.md: layer {mod}"


def _layers_block() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return text[text.index("layers = ["):text.index("]", text.index("layers = ["))]


# Attributes with a leading underscore that the package reads on objects other than its own
# ``self``/``cls``, each with its reason: nothing private of Triton or tensordict (the kernels are
# launched through Triton's public JIT call, a Rollout's fields read through tensorclass's public API).
PRIVATE_ATTRIBUTES = {
    "_version": "torch.Tensor's version counter: the host-side bookkeeping of written Rollout fields and of "
                "TorchRL's scalar buffers (no device sync)",
    "_fields": "the NamedTuple API of Problem",
    "_backward": "rollbuf's own autograd Function (rollbuf.backends.autograd)",
}


def test_no_private_attributes_of_other_libraries():
    """No ``x._name`` outside an object's own methods but the listed ones (the benchmark CLI aside)."""
    bad = []
    for f in FILES:
        if f.is_relative_to(PKG / "bench"):
            continue
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and node.attr not in PRIVATE_ATTRIBUTES):
                bad.append(f"{_module(f)}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "private attributes read across libraries:\n" + "\n".join(bad)
