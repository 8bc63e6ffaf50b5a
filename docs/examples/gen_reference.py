"""Generate docs/reference.md from the docstrings of every public name.

    python docs/examples/gen_reference.py > docs/reference.md

tests/test_docs.py checks that the committed page equals what this prints, so the reference
cannot drift from the code.
"""

from __future__ import annotations

import inspect

import rollbuf
import rollbuf.boundary.conventions
import rollbuf.distributed
import rollbuf.functional
import rollbuf.groups
import rollbuf.integrations.areal
import rollbuf.integrations.gym
import rollbuf.integrations.llm
import rollbuf.integrations.openrlhf
import rollbuf.integrations.sb3
import rollbuf.integrations.skyrl
import rollbuf.integrations.slime
import rollbuf.integrations.torchrl
import rollbuf.integrations.trl
import rollbuf.integrations.verl
import rollbuf.testing

MODULES = [rollbuf.functional, rollbuf.groups, rollbuf.integrations.llm, rollbuf.integrations.verl, rollbuf.distributed,
           rollbuf.boundary.conventions, rollbuf.integrations.gym, rollbuf.integrations.torchrl,
           rollbuf.integrations.sb3, rollbuf.integrations.trl, rollbuf.testing, rollbuf.integrations.openrlhf,
           rollbuf.integrations.areal, rollbuf.integrations.slime, rollbuf.integrations.skyrl]
ROLLOUT_METHODS = ["empty", "record", "bootstrap", "gae", "advantages", "lambda_returns", "discounted_returns",
                   "vtrace", "retrace", "eligibility_traces", "episodic_sums", "from_torchrl", "to_torchrl"]


def _public(mod):
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n, v in vars(mod).items() if not n.startswith("_") and getattr(v, "__module__", None)
                 == mod.__name__ and (inspect.isfunction(v) or inspect.isclass(v))]
    return sorted(names)


def _sig(obj):
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _doc(obj):
    return inspect.cleandoc(inspect.getdoc(obj) or "(no docstring)")


def render() -> str:
    out = ["# API reference (generated)", "",
           "Generated from the docstrings by `docs/examples/gen_reference.py`; the hand-written guide",
           "with examples is [api.md](api.md). Do not edit by hand.", ""]
    out += ["## `rollbuf.Rollout`", "", "```text", _doc(rollbuf.Rollout), "```", ""]
    for m in ROLLOUT_METHODS:
        fn = getattr(rollbuf.Rollout, m)
        out += [f"### `Rollout.{m}{_sig(fn)}`", "", "```text", _doc(fn), "```", ""]
    for mod in MODULES:
        out += [f"## `{mod.__name__}`", "", "```text", _doc(mod), "```", ""]
        for name in _public(mod):
            obj = getattr(mod, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            out += [f"### `{name}{_sig(obj) if inspect.isfunction(obj) else ''}`", "", "```text", _doc(obj), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
