"""The documentation stays in sync with the code.

* the boundary-model table in docs/semantics.md is what docs/examples/semantics_table.py prints from
  the estimator registry (``rollbuf.estimators.REGISTRY``) now;
* the worked-example numbers in docs/semantics.md are what docs/examples/worked_example.py prints now
  (reference backend);
* every name of ``rollbuf.functional.__all__``, every public ``Rollout`` method and every converter
  of ``rollbuf.boundary.conventions`` appears in docs/api.md, with the signature of the code.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path

import pytest

import rollbuf
import rollbuf.functional as F
from rollbuf import Rollout
from rollbuf.boundary import conventions

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"


def _load(name: str):
    """Import docs/examples/<name>.py (not a package) as a module."""
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _between(text: str, begin: str, end: str) -> str:
    assert text.count(begin) == 1, f"marker {begin!r} must occur exactly once"
    assert text.count(end) == 1, f"marker {end!r} must occur exactly once"
    start = text.index(begin) + len(begin)
    stop = text.index(end)
    assert start < stop, f"{begin!r} must come before {end!r}"
    return text[start:stop].strip()


@pytest.fixture(scope="module")
def semantics() -> str:
    return (DOCS / "semantics.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def api() -> str:
    return (DOCS / "api.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------ semantics.md


def test_generated_table_matches_registry(semantics):
    pasted = _between(semantics, "<!-- BEGIN GENERATED TABLE -->", "<!-- END GENERATED TABLE -->")
    printed = _load("semantics_table").render().strip()
    assert pasted == printed, (
        "docs/semantics.md's boundary table is out of date with the registry "
        "(rollbuf.estimators.REGISTRY): paste the output of `python docs/examples/semantics_table.py` "
        "between the markers"
    )


def test_generated_table_has_one_row_per_estimator():
    from rollbuf.estimators import REGISTRY

    rows = [line for line in _load("semantics_table").render().splitlines() if line.startswith("| ")]
    names = [row.split("|")[1].strip() for row in rows[1:]]  # rows[0] is the header
    assert names == [name for name, e in REGISTRY.items() if e.docs is not None]
    assert set(REGISTRY) - set(names) == {"advantages"}  # GAE's first output: no row of its own


def test_worked_example_matches_script(semantics):
    pasted = _between(semantics, "<!-- BEGIN WORKED EXAMPLE -->", "<!-- END WORKED EXAMPLE -->")
    printed = _load("worked_example").render().strip()
    assert pasted == printed, (
        "docs/semantics.md's worked example is out of date: paste the output of "
        "`python docs/examples/worked_example.py` between the markers"
    )


def test_worked_example_backends_agree():
    """The documented numbers are not an artefact of the oracle: the torch backend gives them too."""
    import torch

    ex = _load("worked_example")
    f = ex.fields()
    ref = F.gae(ex.GAMMA, ex.LAM, **f, backend="reference")
    vec = F.gae(ex.GAMMA, ex.LAM, **f, backend="torch")
    torch.testing.assert_close(vec.advantages, ref.advantages)
    torch.testing.assert_close(vec.returns, ref.returns)
    assert not torch.isnan(vec.advantages).any()  # the NaN bootstrap slots never leak


def test_semantics_picture_exists(semantics):
    assert "img/boundaries.png" in semantics
    assert (DOCS / "img" / "boundaries.png").is_file()
    assert (EXAMPLES / "draw_boundaries.py").is_file()


def test_semantics_relative_links_resolve(semantics, api):
    for text in (semantics, api):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (DOCS / target).exists(), f"broken link to {target}"


# ------------------------------------------------------------------------------------ api.md


def _norm(text: str) -> str:
    """Compare signatures ignoring whitespace and the quote style."""
    return re.sub(r"\s+", "", text).replace('"', "").replace("'", "")


def _signature(obj, *, drop_self=False, annotations=True) -> str:
    sig = inspect.signature(obj)
    params = list(sig.parameters.values())
    if drop_self and params and params[0].name == "self":
        params = params[1:]
    if not annotations:
        params = [p.replace(annotation=inspect.Parameter.empty) for p in params]
        sig = sig.replace(parameters=params, return_annotation=inspect.Signature.empty)
    else:
        sig = sig.replace(parameters=params)
    return str(sig)


def _public_rollout_methods() -> list[str]:
    """Methods defined in rollbuf/rollout.py itself (not the tensorclass machinery)."""
    names = []
    for name, attr in vars(Rollout).items():
        if name.startswith("_"):
            continue
        fn = attr.__func__ if isinstance(attr, (classmethod, staticmethod)) else attr
        if inspect.isfunction(fn) and fn.__module__ == "rollbuf.rollout":
            names.append(name)
    return names


def test_rollout_methods_found():
    # guard against the introspection silently finding nothing
    assert {"empty", "record", "bootstrap", "gae", "advantages", "vtrace"} <= set(_public_rollout_methods())


@pytest.mark.parametrize("name", F.__all__)
def test_functional_name_documented(api, name):
    assert re.search(rf"\b{re.escape(name)}\b", api), f"rollbuf.functional.{name} is not in docs/api.md"


@pytest.mark.parametrize("name", [n for n in F.__all__ if inspect.isfunction(getattr(F, n))])
def test_functional_signature_documented(api, name):
    sig = name + _signature(getattr(F, name))
    assert _norm(sig) in _norm(api), f"docs/api.md must show the signature {sig}"


@pytest.mark.parametrize("name", [n for n in F.__all__ if not inspect.isfunction(getattr(F, n))])
def test_result_fields_documented(api, name):
    cls = getattr(F, name)
    for field in cls._fields:
        assert re.search(rf"\b{field}\b", api), f"{name}.{field} is not in docs/api.md"


@pytest.mark.parametrize("name", _public_rollout_methods())
def test_rollout_method_documented(api, name):
    assert re.search(rf"\b{re.escape(name)}\(", api), f"Rollout.{name} is not in docs/api.md"
    sig = name + _signature(getattr(Rollout, name), drop_self=True)
    assert _norm(sig) in _norm(api), f"docs/api.md must show the signature {sig}"


def test_rollout_constructor_and_fields_documented(api):
    sig = "Rollout" + _signature(Rollout, annotations=False).removesuffix(" -> None")
    assert _norm(sig) in _norm(api), f"docs/api.md must show the constructor {sig}"
    for field in ("rewards", "values", "terminated", "truncated", "log_probs", "bootstrap_values", "mask"):
        assert f"`{field}`" in api


@pytest.mark.parametrize("name", conventions.__all__)
def test_conventions_documented(api, name):
    obj = getattr(conventions, name)
    assert re.search(rf"\b{re.escape(name)}\b", api), f"conventions.{name} is not in docs/api.md"
    if inspect.isfunction(obj):
        sig = name + _signature(obj)
        assert _norm(sig) in _norm(api), f"docs/api.md must show the signature {sig}"


@pytest.mark.parametrize("name", rollbuf.__all__)
def test_top_level_names_documented(api, name):
    assert re.search(rf"\b{re.escape(name)}\b", api)


def test_testing_helpers_named(api):
    assert "rollbuf.testing" in api
    assert "rollouts(" in api and "assert_matches_reference(" in api


def test_generated_reference_is_up_to_date():
    """docs/reference.md is generated from the docstrings; regenerate it when they change:
    python docs/examples/gen_reference.py > docs/reference.md"""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "examples" / "gen_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "docs" / "reference.md").read_text() == mod.render()


# ------------------------------------------------------------------------------ howto/cleanrl.md


def test_cleanrl_snippet_is_the_tested_example():
    text = (DOCS / "howto" / "cleanrl.md").read_text(encoding="utf-8")
    snippet = _between(text, "<!-- cleanrl-snippet -->", "<!-- /cleanrl-snippet -->")
    snippet = snippet.removeprefix("```python").removesuffix("```").strip()
    source = (EXAMPLES / "cleanrl_gae.py").read_text(encoding="utf-8")
    assert snippet == _between(source, "# --8<-- [start:rollbuf]", "# --8<-- [end:rollbuf]")


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_cleanrl_replacement_equals_cleanrl_loop(backend, monkeypatch):
    """CleanRL's loop as written and the how-to's replacement give the same advantages and returns
    on [T, N] buffers with episode starts inside the window, at its first step and after it; the
    triton backend's [T, N] results are contiguous (no copy for CleanRL's reshape(-1))."""
    import torch

    ex = _load("cleanrl_gae")
    if backend == "triton":
        real = F.gae
        monkeypatch.setattr(F, "gae", lambda *a, **k: real(*a, **k, backend="triton"))
    g = torch.Generator().manual_seed(4)
    T, N = 37, 6
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    dones = (torch.rand(T, N, generator=g) < 0.1).float()
    dones[0] = 1.0  # CleanRL's first observation after a reset
    next_value = torch.randn(1, N, generator=g)
    next_done = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    want = ex.cleanrl_loop(rewards, values, dones, next_value, next_done, 0.99, 0.95)
    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"  # else the interpreter
    inputs = [x.to(dev) for x in (rewards, values, dones, next_value, next_done)]
    got = [x.cpu() if x.is_contiguous() else x.cpu().mT.contiguous().mT
           for x in ex.rollbuf_gae(*inputs, 0.99, 0.95)]  # (the layout kept on the way back)
    for a, b in zip(got, want):
        assert a.shape == (T, N)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if backend == "triton":
        assert all(a.is_contiguous() for a in got)


def test_cleanrl_layout_is_as_documented(monkeypatch):
    """howto/cleanrl.md, Layout: the triton and torch backends write time-major outputs (``adv.mT`` of
    the replacement is contiguous); numba (``auto`` on a CPU) and reference write ``[N, T]``, whose
    ``.mT`` is a transposed view that ``reshape(-1)`` copies into the loop's order."""
    import torch

    from rollbuf import backends

    ex = _load("cleanrl_gae")
    g = torch.Generator().manual_seed(5)
    T, N = 23, 5
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    dones = (torch.rand(T, N, generator=g) < 0.1).float()
    next_value, next_done = torch.randn(1, N, generator=g), torch.zeros(N)
    want = ex.cleanrl_loop(rewards, values, dones, next_value, next_done, 0.99, 0.95)
    time_major = {"triton": True, "torch": True, "numba": False, "reference": False}
    assert backends.resolve("auto", torch.device("cpu")) == "numba"  # the text's "auto on a CPU"
    real = F.gae
    for backend, contiguous in time_major.items():
        monkeypatch.setattr(F, "gae", lambda *a, b=backend, **k: real(*a, **k, backend=b))
        dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"  # else the interpreter
        inputs = [x.to(dev) for x in (rewards, values, dones, next_value, next_done)]
        got = ex.rollbuf_gae(*inputs, 0.99, 0.95)
        for a, b in zip(got, want):
            assert a.is_contiguous() == contiguous, backend
            torch.testing.assert_close(a.reshape(-1).cpu(), b.reshape(-1), rtol=1e-5, atol=1e-5)


def test_graphed_snippet_is_the_tested_example():
    text = (DOCS / "howto" / "performance.md").read_text(encoding="utf-8")
    snippet = _between(text, "<!-- graphed-snippet -->", "<!-- /graphed-snippet -->")
    snippet = snippet.removeprefix("```python").removesuffix("```").strip()
    source = (DOCS / "examples" / "graphed_advantages.py").read_text(encoding="utf-8")
    assert snippet == _between(source, "# --8<-- [start:graphed]", "# --8<-- [end:graphed]")


def _graphed_example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("graphed_advantages", DOCS / "examples" / "graphed_advantages.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_graphed_example_compiled_step_equals_eager():
    diffs = _graphed_example().main()
    assert set(diffs) >= {"compiled"} and all(d < 1e-5 for d in diffs.values()), diffs


@pytest.mark.gpu
def test_graphed_example_cuda_graph_replays_new_data():
    """On a GPU: the whole update (nine estimator calls on a Rollout filled in place) compiled, and
    captured in a CUDA graph and replayed with new data each update, equals the eager calls."""
    diffs = _graphed_example().main()
    assert {"compiled update", "graph, update 1", "graph, update 2"} <= set(diffs), diffs
    assert all(d < 1e-5 for d in diffs.values()), diffs


def test_benchmark_tables_are_the_committed_results():
    """Every measured table of docs/benchmarks.md and docs/llm.md is what ``python -m benchmarks
    tables`` makes of the result files committed in benchmarks/results/, and each page holds every
    table that lives on it."""
    from benchmarks import tables

    assert len((DOCS / "benchmarks.md").read_text(encoding="utf-8").splitlines()) <= 400, (
        "docs/benchmarks.md is one table per question, at most 400 lines")
    pages = {name: tables.PAGE.get(name, DOCS / "benchmarks.md").name for name in tables.TABLES}
    assert set(pages.values()) == {"benchmarks.md", "llm.md"}
    for page in set(pages.values()):
        text = (DOCS / page).read_text(encoding="utf-8")
        assert all(f"<!-- table:{name} -->" in text for name in tables.TABLES if pages[name] == page), page
        assert tables.render(text) == text, (
            f"docs/{page} is out of date with benchmarks/results/: run python -m benchmarks tables")


# ------------------------------------------------------------- every Python block of the docs runs

# Every ```python block of README.md and docs/**/*.md is executed, in document order, one namespace
# per file (a block may use what an earlier block of the same page defined), in a temporary working
# directory. The conventions, on the line right before a block:
#
#   <!-- gpu-only -->        the block needs a CUDA device: it runs only where one is present.
#
# and anywhere in a page, an HTML comment that the rendered page does not show:
#
#   <!-- doc-setup
#   code
#   -->                      code run at that point of the page (stand-ins for the objects a
#                            fragment assumes, e.g. a trained `agent`), so that fragments are run too.
#
#   <!-- doc-requires: MODULE -->   the page's blocks need MODULE, which the README's test command
#                            installs only on some Pythons (TRL: Python >= 3.11): without it the page
#                            is skipped, except in CI on such a Python (a failure there).
#
# Signatures and other text that is not code are fenced as ```text, not ```python.

_PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```[ \t]*$|^<!-- doc-setup\n(.*?)^-->[ \t]*$", re.S | re.M)
def test_readme_install_commands_and_ci_agree():
    """The README's two install commands pin the same torch and Triton, the Triton that torch build
    requires on PyPI (README, "Which torch and Triton"), and `.ci/run` runs the test command as the
    README writes it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^pip install torch==\S+ triton==\S+ -e \"\.\[(\w+)\]\".*$", readme, re.M)
    assert sorted(commands) == ["examples", "test"], commands
    pins = set(re.findall(r"^pip install (torch==\S+ triton==\S+) -e ", readme, re.M))
    assert len(pins) == 1, f"the README's install commands pin different versions: {pins}"
    (pin,) = pins
    torch_pin, triton_pin = pin.split()
    assert f"`{torch_pin}` for x86-64 Linux is the CUDA build: it requires\n`{triton_pin}`" in readme
    test_line = next(line for line in readme.splitlines() if line.startswith("pip install") and '".[test]"' in line)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_line in ci, ".ci/run must run exactly the README's test command"


# ------------------------------------------------------------------------- README, the front door

_CPU_TORCH = re.compile(r"^command -v nvidia-smi >/dev/null \|\| pip install (torch==\S+) "
                        r"--index-url https://download\.pytorch\.org/whl/cpu$", re.M)


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)


def test_readme_is_a_front_door():
    """At most 150 lines; the two fresh-machine commands (the main job, the tests) on its first
    screen, each in a block that installs PyTorch's CPU build first where there is no NVIDIA GPU
    (the same torch as the install after it), so that copying a block never pulls the CUDA build
    onto a CPU-only machine."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines (at most 150)"
    first_screen = "\n".join(lines[:40])
    assert re.search(r'^pip install torch==\S+ triton==\S+ -e "\.\[examples\]" && python examples/ppo_cartpole\.py$',
                     first_screen, re.M), "the main job's command must be within the README's first 40 lines"
    assert re.search(r'^pip install torch==\S+ triton==\S+ -e "\.\[test\]" .*python -m pytest tests -q$',
                     first_screen, re.M), "the test command must be within the README's first 40 lines"
    installs = [b for b in _bash_blocks(readme) if re.search(r"^pip install torch==\S+ triton==", b, re.M)]
    assert len(installs) == 2, installs
    for block in installs:
        cpu = _CPU_TORCH.search(block)
        assert cpu, f"this block does not install the CPU build of torch first:\n{block}"
        install = re.search(r"^pip install (torch==\S+) triton==", block, re.M)
        assert cpu.start() < install.start() and cpu.group(1) == install.group(1), block


def test_readme_lists_every_doc_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {(ROOT / t).resolve() for t in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", readme)}
    missing = [_page_id(p) for p in sorted(DOCS.rglob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md's Docs list does not link {missing}"


def test_semantics_contents_lists_every_section(semantics):
    """The contents list at the top of docs/semantics.md links every ``## `` section, in order."""
    body = re.sub(r"^```.*?^```", "", semantics, flags=re.S | re.M)
    sections = re.findall(r"^## (.+)$", body, re.M)
    listed = re.findall(r"^(\d+)\. \[([^\]]+)\]\(#([^)]+)\)$", semantics, re.M)
    assert [f"{n}. {title}" for n, title, _ in listed] == sections
    assert [anchor for _, _, anchor in listed] == [_slug(title) for title in sections]


_RESULTS = ROOT / "benchmarks" / "results"


def _test_log(name: str) -> dict:
    """The ``key: value`` lines of a committed test-run log (``cpu_tests_<commit>.log``)."""
    text = (_RESULTS / name).read_text(encoding="utf-8")
    return dict(re.findall(r"^([a-z][\w ./-]*?): (.+)$", text, re.M))


def test_test_run_figures_are_the_committed_logs():
    """Every figure the README or docs/benchmarks.md states about a run of the test suite is read
    from a committed log of benchmarks/results/ that the page names: each "N passed" is in the
    pytest summary of such a log, and a CPU run's log (``cpu_tests_<commit>.log``) is quoted as it
    is written (its commit, pytest's summary line, the wall time of the whole command)."""
    for page in (ROOT / "README.md", DOCS / "benchmarks.md"):
        text = page.read_text(encoding="utf-8")
        named = sorted(set(re.findall(r"\b((?:cpu|gpu)_tests_\w+\.log)\b", text)))
        summaries = []
        for name in named:
            assert (_RESULTS / name).is_file(), f"{_page_id(page)} names {name}, which is not committed"
            log = (_RESULTS / name).read_text(encoding="utf-8")
            summaries += re.findall(r"^(?:pytest: )?=* ?(\d+ passed.*?) ?=*$", log, re.M)
        for quoted in re.findall(r"\b(\d+) passed\b", text):
            assert any(re.match(rf"{quoted} passed\b", s) for s in summaries), (
                f"{_page_id(page)} states {quoted} passed, which no log it names holds")
        for name in (n for n in named if n.startswith("cpu_tests_")):
            fields = _test_log(name)
            for key in ("commit", "pytest", "wall"):
                assert f"`{fields[key]}`" in text, f"{_page_id(page)} must quote {name}'s {key}: `{fields[key]}`"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"\b\d+ (?:minutes?|seconds?)\b|\b\d+:\d\d\b", readme), (
        "the README states a test run's duration: quote it from its log in docs/benchmarks.md")
    cpu_logs = sorted(_RESULTS.glob("cpu_tests_*.log"))
    assert cpu_logs and any(p.name in (DOCS / "benchmarks.md").read_text(encoding="utf-8") for p in cpu_logs)


def test_performance_cpu_figures_are_the_cpu_table():
    """docs/howto/performance.md's CPU section restates figures of docs/benchmarks.md's CPU table
    (generated from the result file both pages name) and no others."""
    perf = (DOCS / "howto" / "performance.md").read_text(encoding="utf-8")
    section = perf[perf.index("## The CPU"):].split("\n## ")[0]
    bench = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    table = _between(bench, "<!-- table:cpu -->", "<!-- /table:cpu -->")
    (csv,) = re.findall(r"`(cpu_\w+\.csv)`", table.splitlines()[0])
    assert f"benchmarks/results/{csv}" in section, f"performance.md's CPU section must name {csv}"
    cells = {c.strip() for row in table.splitlines() if row.startswith("| ") for c in row.split("|")}
    figures = re.findall(r"(\d+(?:\.\d+)?) ms\b", section)
    assert figures, "performance.md's CPU section states no figure: the test would check nothing"
    for figure in figures:
        assert figure in cells, f"performance.md's CPU figure {figure} ms is not in docs/benchmarks.md's CPU table"
    shapes = re.findall(r"at (\d+) of the grid's (\d+) shapes", section)
    for got, of in shapes:
        assert f"at {got} of {of}" in table, f"the CPU table does not say {got} of {of}"


def test_benchmark_cpu_help_shows_no_empty_default(capsys):
    """``python -m benchmarks cpu --help``: a required option and one without a default show none."""
    from benchmarks import cpu

    with pytest.raises(SystemExit):
        cpu.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "--out OUT directory" in text


# Pages whose Python blocks are still fragments that do not run on their own; each entry is an
# expected failure (strict: it fails once the page runs, so that the entry gets removed).
_NOT_YET_RUNNABLE: dict = {}  # page -> why its blocks cannot run yet (strict xfail); none today


def _blocks(text: str):
    """(line, code, gpu_only) for each ```python block and doc-setup comment, in order."""
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group(1) is not None:
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            yield line, m.group(1), before == "<!-- gpu-only -->"
        else:
            yield line, m.group(2), False


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, id=_page_id(p), marks=[pytest.mark.xfail(strict=True, reason=_NOT_YET_RUNNABLE[_page_id(p)])]
                  if _page_id(p) in _NOT_YET_RUNNABLE else []) for p in _PAGES],
)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    import torch

    text = page.read_text(encoding="utf-8")
    _skip_without_required_modules(page, text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    namespace = {"__name__": f"docs_{page.stem}"}
    ran = 0
    for line, code, gpu_only in _blocks(text):
        if gpu_only and not torch.cuda.is_available():
            continue
        try:
            exec(compile(code, f"{_page_id(page)}:{line}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(
                f"the Python block at {_page_id(page)}:{line} fails: {type(exc).__name__}: {exc}") from exc
        ran += 1
    assert ran or "```python" not in text


# the modules a page may require (<!-- doc-requires: MODULE -->) and the Python from which the README's
# test command installs each (tests/requirements-verl.txt)
_OPTIONAL_MODULES = {"trl": (3, 11)}


def _skip_without_required_modules(page: Path, text: str) -> None:
    for module in re.findall(r"^<!-- doc-requires: (\S+) -->$", text, re.M):
        assert module in _OPTIONAL_MODULES, f"{_page_id(page)} requires {module}, which is not in _OPTIONAL_MODULES"
        if importlib.util.find_spec(module) is not None:
            continue
        if os.environ.get("CI") == "true" and sys.version_info >= _OPTIONAL_MODULES[module]:
            pytest.fail(f"{_page_id(page)} needs {module}, which the README's test command installs here")
        pytest.skip(f"{_page_id(page)} needs {module} (tests/requirements-verl.txt)")


def test_doc_requires_skips_or_fails_without_the_module(monkeypatch):
    """A page that requires a module is skipped without it, and fails without it in CI on a Python that
    the README's test command installs it on."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    page, text = DOCS / "howto" / "trl.md", "x\n<!-- doc-requires: trl -->\n"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        _skip_without_required_modules(page, text)
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(sys, "version_info", (3, 11, 0))
    with pytest.raises(pytest.fail.Exception, match="needs trl"):
        _skip_without_required_modules(page, text)
    monkeypatch.setattr(sys, "version_info", (3, 10, 0))
    with pytest.raises(pytest.skip.Exception):
        _skip_without_required_modules(page, text)
    monkeypatch.setattr(importlib.util, "find_spec", real)
    _skip_without_required_modules(page, text)  # present: runs
    with pytest.raises(AssertionError, match="_OPTIONAL_MODULES"):
        _skip_without_required_modules(page, "<!-- doc-requires: numpy -->\n")


def test_block_conventions_are_seen():
    """The parser finds blocks, the gpu-only marker and doc-setup comments."""
    text = "a\n\n```python\nx = 1\n```\n<!-- gpu-only -->\n```python\ny = 2\n```\n<!-- doc-setup\nz = 3\n-->\n"
    assert [(c, g) for _, c, g in _blocks(text)] == [("x = 1\n", False), ("y = 2\n", True), ("z = 3\n", False)]


# ----------------------------------------------------------------------------- links and anchors


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out.update(re.findall(r'<a id="([^"]+)"></a>', text))  # explicit anchors kept for old links
    return out


@pytest.mark.parametrize("page", _PAGES, ids=_page_id)
def test_links_and_anchors_resolve(page):
    """Every relative link of README.md and docs/ points at a file of the repository, and every
    #anchor at a heading of that page."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        dest = (page.parent / target).resolve() if target else page
        assert dest.exists(), f"{_page_id(page)}: broken link to {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{_page_id(page)}: no heading #{anchor} in {_page_id(dest)}"


_CITES_OUTSIDE: dict = {}  # pages that still name a file that is not in the repository (strict xfail)


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, id=_page_id(p), marks=[pytest.mark.xfail(strict=True, reason=_CITES_OUTSIDE[_page_id(p)])]
                  if _page_id(p) in _CITES_OUTSIDE else []) for p in _PAGES if p.name != "reference.md"],
)
def test_docs_cite_nothing_outside_the_repository(page):
    """The docs stand alone: no page cites the project's private notes (SPEC.md and the like).
    (reference.md is generated from the docstrings.)"""
    text = page.read_text(encoding="utf-8")
    for name in ("SPEC", "PERF.md", "STYLE.md"):
        assert name not in text, f"{_page_id(page)} cites {name}, which is not in the repository"


@pytest.mark.parametrize("module", ["gym", "llm", "torchrl", "sb3", "trl"])
def test_integrations_documented(api, module):
    """Every public name of rollbuf.integrations.* is in docs/api.md, functions with their signature."""
    if module in ("torchrl", "sb3", "trl"):
        pytest.importorskip({"torchrl": "torchrl", "sb3": "stable_baselines3", "trl": "trl"}[module])
    mod = importlib.import_module(f"rollbuf.integrations.{module}")
    assert f"rollbuf.integrations.{module}" in api
    for name in mod.__all__:
        assert re.search(rf"\b{re.escape(name)}\b", api), f"rollbuf.integrations.{module}.{name} is not in docs/api.md"
        obj = getattr(mod, name)
        if inspect.isfunction(obj):
            sig = name + _signature(obj, annotations=False)
            assert _norm(sig) in _norm(api), f"docs/api.md must show the signature {sig}"


# ------------------------------------------------------- torch.compile, as performance.md recommends

def _compile_params():
    return [
        pytest.param("auto"),
        pytest.param("triton"),
    ]


@pytest.mark.parametrize("backend", _compile_params())
def test_no_warning_from_rollbuf_under_torch_compile(backend):
    """A training step that calls ``rollout.gae`` compiles with ``fullgraph=True`` and rollbuf's own
    code raises no warning (torch's and Triton's own warnings are not rollbuf's to fix).
    ``backend="triton"`` runs the kernels under Triton's interpreter on a CPU."""
    import warnings

    import torch
    import torch._dynamo.utils

    torch._dynamo.reset()
    torch._dynamo.utils.warn_once_cache.clear()  # Dynamo warns once per process per message
    g = torch.Generator().manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    r, v, b = (torch.randn(3, 7, generator=g).to(device) for _ in range(3))

    def step(rewards, values, bootstrap_values):
        ro = Rollout(rewards=rewards, values=values, terminated=torch.zeros_like(rewards, dtype=torch.bool),
                     bootstrap_values=bootstrap_values, batch_size=list(rewards.shape))
        adv, ret = ro.gae(0.99, 0.95, backend=backend)
        return (adv - adv.mean()) / (adv.std() + 1e-8), ret

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, ret = torch.compile(step, fullgraph=True)(r, v, b)
    want = F.gae(0.99, 0.95, rewards=r, values=v, bootstrap_values=b, backend="torch")
    torch.testing.assert_close(ret, want.returns)
    here = str(ROOT / "rollbuf")
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if here in w.filename or here in str(w.message)]
    assert not ours, "rollbuf's own code warns under torch.compile:\n" + "\n".join(ours)
