"""The architecture holds (docs/architecture.md).

* the layer contract of pyproject.toml (import-linter): no import circle, no import from a lower
  layer back up;
* no module reaches for another module's private names (``from rollbuf.x import _y``, ``x._y``);
* imports inside functions are the few that keep optional or heavy dependencies (Triton, hypothesis,
  the kernels) off the import of ``rollbuf``, each listed here with its reason;
* the estimator list exists once: nothing in the package spells the list of estimator names but
  the registry;
* the float64 oracles of the benchmark gate (``benchmarks/oracles.py``) import nothing but the
  standard library's few modules and torch: rollbuf cannot reach its own reference;
* habits: ``ruff check`` and ``mypy`` are clean with the configuration of pyproject.toml; no function
  of the package outside the Triton kernels and their launch (in ``rollbuf/kernels/``) is longer than
  60 lines, and no private one there takes more than 8 parameters; no function of ``rollbuf/kernels/``
  takes more than 12; the tests use rollbuf's public names only.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
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
                    aliases[a.asname or a.name.split(".")[0]] = (a.asname and a.name) or a.name.split(".")[0]
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
    ("rollbuf.groups", "rollbuf.kernels"): "the group-statistics kernel needs Triton: imported when asked for",
    ("rollbuf.testing", "hypothesis"): "hypothesis is a test dependency, needed by the strategies only",
    ("rollbuf.testing", "rollbuf.functional"): "the testing kit calls the public API (a layer above it)",
    ("rollbuf.distributed", "torch.distributed"): "imported by a sharded call only",
    ("rollbuf.context_parallel", "torch.distributed"): "imported by a sharded call only",
    ("rollbuf.integrations.torchrl", "tensordict"): "TorchRL's tensordict utilities, with TorchRL (optional)",
    ("rollbuf.integrations.torchrl", "torchrl.objectives.utils"): "TorchRL is an optional dependency",
    ("rollbuf.integrations.torchrl", "torchrl.objectives.value.advantages"): "TorchRL is an optional dependency",
    ("rollbuf.integrations.verl", "verl.trainer.ppo"): "verl is optional: imported by register() only",
    ("rollbuf.integrations.openrlhf", "openrlhf.trainer.ppo_utils"):
        "OpenRLHF is optional (its module imports Ray, DeepSpeed, vLLM): by patch() and the patched method only",
    ("rollbuf.integrations.areal", "areal.trainer.ppo.actor"): "AReaL is optional: imported by patch() only",
    ("rollbuf.integrations.areal", "areal.utils.functional"):
        "AReaL is optional: its overlong penalty, imported by the patched method where the config asks for it",
    ("rollbuf.integrations.skyrl", "skyrl.backends.skyrl_train.utils.ppo_utils"):
        "SkyRL is optional: imported by register() only",
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


# Modules that may spell estimator names out: the registry and the reference loops (their
# per-estimator functions are the point: they share nothing with the registry's path).
_OWN_LISTS = ("estimators.py", "reference.py")


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


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports (``import a.b``, ``from a.b import c``; ``.x`` for a relative
    import), at any depth of the file, and the literal names given to ``import_module``/``__import__``."""
    tree = ast.parse(path.read_text(), str(path))
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mods.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            mods.add(str(node.args[0].value))
    return mods


# what the float64 oracles may import (top-level packages): the standard library's few and torch,
# nothing that could reach rollbuf (a relative import's top level is "", never allowed)
ORACLE_IMPORTS = {"__future__", "math", "collections", "typing", "torch"}


def _not_allowed(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if m.split(".")[0] not in ORACLE_IMPORTS)


def test_the_oracles_do_not_import_rollbuf(tmp_path):
    """The float64 oracles the benchmark gate and the tests check rollbuf against
    (``benchmarks/oracles.py``) restate each recursion on their own: they import only the standard
    library's few modules and torch (:data:`ORACLE_IMPORTS`), so no fault of rollbuf, direct or
    through another benchmark module, can reach its own reference. The check refuses each form."""
    oracles = ROOT / "benchmarks" / "oracles.py"
    assert oracles.exists()
    bad = _not_allowed(_imported_modules(oracles))
    assert not bad, f"benchmarks/oracles.py imports {bad}"
    probe = tmp_path / "probe.py"
    for line in ("import rollbuf", "from rollbuf.boundary import x", "def f():\n    import rollbuf.kernels",
                 "importlib.import_module('rollbuf.functional')", "from .suite import gate",
                 "from benchmarks.cases import X"):
        probe.write_text(line + "\n")
        assert _not_allowed(_imported_modules(probe)), line


def test_the_family_folders_import_without_triton_or_numba():
    """A family's package (its row, its analytic adjoint) imports, and the torch backend runs with
    gradients, where neither Triton nor numba can be imported: the row reaches its kernel and its CPU
    step through functions that import them when asked for."""
    code = "\n".join([
        "import sys",
        "sys.modules['triton'] = sys.modules['numba'] = None  # neither importable",
        "import torch",
        "from rollbuf import functional as F",
        "from rollbuf.kernels import affine, retrace, td_lambda, traces, vtrace",
        "from rollbuf.kernels.families import FAMILIES",
        "r = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)",
        "adv, _ = F.gae(0.9, 0.8, rewards=r, values=r.detach(), bootstrap_values=r.detach())",
        "adv.sum().backward()",
        "try:",
        "    FAMILIES[vtrace.ROW.family].kernel()",
        "except ImportError:",
        "    print('kernel needs triton')",
    ])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "kernel needs triton", res.stdout + res.stderr


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
    **dict.fromkeys(("_calculate_rewards", "_generate", "_generate_and_score_completions"),
                    "TRL's GRPOTrainer methods that rollbuf.integrations.trl overrides, each calling TRL's own through "
                    "super() (TRL has no advantage hook: the module's docstring)"),
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


# ------------------------------------------------------------------------ habits: lint and types


def _needs(module: str) -> None:
    """``module`` is in the test extra: CI has it; a developer without it skips the check."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is in the test extra; CI must have it")
        pytest.skip(f"{module} is in the test extra (pip install -e '.[test]')")


def _run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean():
    """``ruff check`` with pyproject.toml's [tool.ruff] (its per-file exceptions are listed there)."""
    _needs("ruff")
    res = _run_tool("ruff", "check", "rollbuf", "tests", "benchmarks", "examples", "tools")
    assert res.returncode == 0, f"ruff check:\n{res.stdout}{res.stderr}"


def test_mypy_is_clean():
    """``mypy rollbuf tools`` with pyproject.toml's [tool.mypy] (cached in .mypy_cache: ~10 s cold, <1 s warm)."""
    _needs("mypy")
    res = _run_tool("mypy", "rollbuf", "tools")
    assert res.returncode == 0, f"mypy rollbuf tools:\n{res.stdout}{res.stderr}"


# ------------------------------------------------------------------ habits: function size and arity

MAX_LINES = 60  # a function, from its `def` line to its last line, its docstring not counted
MAX_PRIVATE_PARAMS = 8  # a private function's parameters (self/cls not counted; *args, **kwargs: one each)

# Still to be split (issue 32, item 8) ("path::function": what it has today).
# An entry that no longer exceeds the limit fails the test: take it off the list.
LONG_ALLOWED = {
}
PARAMS_ALLOWED: dict[str, int] = {}


def _functions(tree: ast.AST, prefix: str = ""):
    """``(qualified name, node)`` of every function and method, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def function_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the ``def`` line (decorators not counted) to the last line of the body, less the
    docstring's lines; comments and blank lines inside count."""
    n = fn.end_lineno - fn.lineno + 1
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        n -= first.end_lineno - first.lineno + 1
    return n


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Positional-only, positional, keyword-only, ``*args`` and ``**kwargs`` (one each); a leading
    ``self`` or ``cls`` is not counted."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    if names and names[0] in ("self", "cls") and (a.posonlyargs or a.args):
        names = names[1:]
    return len(names)


def _is_private(qualname: str) -> bool:
    name = qualname.rsplit(".", 1)[-1]
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# The Triton kernels and their launch, out of the size rules (a kernel's driver specialises every pass
# in one body): in rollbuf/kernels/, these modules and each family's Triton kernels (*triton.py).
TRITON_MODULES = ("core.py", "resolve.py", "host.py", "op.py", "group_stats.py")


def _triton_side(f: Path) -> bool:
    return f.is_relative_to(PKG / "kernels") and (f.name in TRITON_MODULES or f.name.endswith("triton.py"))


def _sizes():
    """``{"path::function": (lines, parameters, private)}`` over the package less the Triton kernels and
    their launch (:func:`_triton_side`)."""
    out = {}
    for f in FILES:
        if _triton_side(f):
            continue
        rel = f.relative_to(ROOT).as_posix()
        for qual, fn in _functions(ast.parse(f.read_text(), str(f))):
            out[f"{rel}::{qual}"] = (function_lines(fn), parameter_count(fn), _is_private(qual))
    return out


def test_no_function_is_longer_than_60_lines():
    sizes = _sizes()
    long = {k: lines for k, (lines, _, _) in sizes.items() if lines > MAX_LINES}
    new = {k: v for k, v in long.items() if k not in LONG_ALLOWED}
    assert not new, f"functions longer than {MAX_LINES} lines (split them): {new}"
    stale = sorted(set(LONG_ALLOWED) - set(long))
    assert not stale, f"LONG_ALLOWED: no longer over {MAX_LINES} lines, take them off the list: {stale}"


def test_no_private_function_takes_more_than_8_parameters():
    sizes = _sizes()
    many = {k: n for k, (_, n, private) in sizes.items() if private and n > MAX_PRIVATE_PARAMS}
    new = {k: v for k, v in many.items() if k not in PARAMS_ALLOWED}
    assert not new, f"private functions with more than {MAX_PRIVATE_PARAMS} parameters (group them): {new}"
    stale = sorted(set(PARAMS_ALLOWED) - set(many))
    assert not stale, f"PARAMS_ALLOWED: no longer over {MAX_PRIVATE_PARAMS} parameters, take them off: {stale}"


MAX_KERNEL_PARAMS = 12


def test_no_function_of_the_kernels_takes_more_than_12_parameters():
    """Under ``rollbuf/kernels/`` (the Triton kernels and their launch included) a kernel takes its
    pointers, sizes and carries as named tuples and its constexprs as one ``Config``: no function
    there takes more than 12 parameters. A scan's combine function (``combine_*``) takes the
    components of two scan elements, as ``tl.associative_scan`` passes them: at most 2 x 10 (the
    quads' scan of V-trace's pair maps carries two maps of five components)."""
    many = {}
    for f in FILES:
        if f.is_relative_to(PKG / "kernels"):
            for qual, fn in _functions(ast.parse(f.read_text(), str(f))):
                if parameter_count(fn) > (20 if qual.startswith("combine_") else MAX_KERNEL_PARAMS):
                    many[f"{f.relative_to(ROOT).as_posix()}::{qual}"] = parameter_count(fn)
    assert not many, f"functions of rollbuf/kernels/ with more than {MAX_KERNEL_PARAMS} parameters: {many}"


def test_the_size_rules_count_as_documented():
    fn = ast.parse('''
@decorator
def _f(self, a, /, b, *args, c, **kwargs):
    """A docstring
    of two lines."""
    x = 1

    return x
''').body[0]
    assert function_lines(fn) == 4 and parameter_count(fn) == 5 and _is_private("C._f")
    assert not _is_private("C.__init__") and _is_private("__f")


# -------------------------------------------------------------------- habits: tests use public names

TESTS = ROOT / "tests"

# The private uses allowed, by test file, each as its source text (every occurrence of it): an entry
# no longer in its file fails the test (take it off).
PRIVATE_ALLOWED: dict[str, set[str]] = {
    # TRL's own GRPOTrainer methods, which rollbuf.integrations.trl overrides (TRL has no public hook): the
    # test wraps TRL's to capture the rewards and the batch TRL made, and stands in a TRL whose batch
    # method no longer scores through _calculate_rewards
    "test_trl.py": {"super()._calculate_rewards", "super()._generate_and_score_completions",
                    "rb_trl.GRPOTrainer._generate_and_score_completions",
                    'setattr(trl.GRPOTrainer, "_generate_and_score_completions")'},
}


def _rollbuf_private_attributes() -> set[str]:
    """The private attribute names that the package's classes define (``self._x = ...`` and the
    names in a class body): an object of the package read as ``obj._x`` in a test."""
    names = set()
    for f in FILES:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    targets = item.targets if isinstance(item, ast.Assign) else \
                        [item.target] if isinstance(item, ast.AnnAssign) else []
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self" and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_uses_in_test(source: str, attributes: set[str]) -> set[str]:
    """The private names of rollbuf a test module uses: ``from rollbuf... import _x``, ``m._x`` on a
    name imported from rollbuf (``m.sub._x`` too), ``setattr``/``getattr``/``monkeypatch.setattr``
    of ``"_x"`` on one, and ``obj._x`` where ``_x`` is an attribute of a rollbuf class."""
    tree = ast.parse(source)
    ours, others = set(), set()  # names bound by imports from rollbuf / from anything else
    uses = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            from_rollbuf = node.module.split(".")[0] == "rollbuf"
            for a in node.names:
                (ours if from_rollbuf else others).add(a.asname or a.name)
                if from_rollbuf and _private(a.name):
                    uses.add(f"from {node.module} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                (ours if a.name.split(".")[0] == "rollbuf" else others).add(bound)

    def rollbufs(obj: ast.expr, attr: str) -> bool:  # obj.attr is a private name of rollbuf
        root = _root(obj)
        return _private(attr) and (root in ours or (attr in attributes and root not in others and root != "self"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and rollbufs(node.value, node.attr):
            uses.add(ast.unparse(node))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
            target, attr = node.args[0], node.args[1]
            if name in ("setattr", "getattr", "delattr", "hasattr") and isinstance(attr, ast.Constant) \
                    and isinstance(attr.value, str) and rollbufs(target, attr.value):
                uses.add(f'{name}({ast.unparse(target)}, "{attr.value}")')
    return uses


def test_tests_use_public_names_only():
    """A test goes through rollbuf's public API; the exceptions are listed in PRIVATE_ALLOWED."""
    attributes = _rollbuf_private_attributes()
    found = {f.name: private_uses_in_test(f.read_text(), attributes) for f in sorted(TESTS.glob("*.py"))}
    new = {name: sorted(uses - PRIVATE_ALLOWED.get(name, set())) for name, uses in found.items()}
    new = {k: v for k, v in new.items() if v}
    assert not new, f"tests using private names of rollbuf (use the public API): {new}"
    stale = {name: sorted(allowed - found.get(name, set())) for name, allowed in PRIVATE_ALLOWED.items()}
    stale = {k: v for k, v in stale.items() if v}
    assert not stale, f"PRIVATE_ALLOWED: no longer used, take them off the list: {stale}"


def test_the_private_name_check_finds_each_form():
    src = """
import rollbuf.kernels.host as H
from rollbuf import functional as F
from rollbuf.kernels.host import _MODES, strategy
import torch
def t(monkeypatch, ro):
    F._CALLS.clear(); H.sub._x; monkeypatch.setattr(F, "_CALLS", {}); ro._fields; torch._dynamo; self._y
"""
    assert private_uses_in_test(src, {"_fields"}) == {
        "from rollbuf.kernels.host import _MODES", "F._CALLS", "H.sub._x", 'setattr(F, "_CALLS")', "ro._fields"}
