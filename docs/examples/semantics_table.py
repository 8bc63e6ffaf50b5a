"""Print the boundary-model table of docs/semantics.md from the code's registry.

The table is generated from the estimator registry (:data:`rollbuf.estimators.REGISTRY`, each
entry's ``docs`` row, written beside its coefficient functions' formulas), so that the
documented α/β/carry match the code one to one. Paste the output between the markers
``<!-- BEGIN GENERATED TABLE -->`` and ``<!-- END GENERATED TABLE -->`` of docs/semantics.md;
tests/test_docs.py fails when the two drift apart.

    python docs/examples/semantics_table.py
"""

from __future__ import annotations

from rollbuf.estimators import LOCAL_TERM, docs_rows

COLUMNS = (
    ("estimator", "name"),
    ("dir.", "direction"),
    ("state (scanned)", "state"),
    ("α_t", "alpha"),
    ("β_t", "beta"),
    ("output at t (epilogue)", "output"),
    ("window-end policy", "window_end"),
    ("chaining carry", "carry"),
    ("returns", "outputs"),
)
_PLAIN = {"name", "direction"}  # every other cell is a formula: code-formatted


def _cell(key: str, value) -> str:
    if key == "outputs":
        return ", ".join(f"`{v}`" for v in value)
    text = str(value).replace("|", "\\|")
    return text if key in _PLAIN else f"`{text}`"


def render() -> str:
    """The markdown table, one row per registry entry with a docs row, in registry order."""
    lines = [
        "| " + " | ".join(title for title, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for spec in docs_rows():
        lines.append("| " + " | ".join(_cell(key, getattr(spec, key)) for _, key in COLUMNS) + " |")
    lines.append("")
    lines.append(
        f"with `{LOCAL_TERM}` (`B_t` = `bootstrap_values[t]`, read only at truncated, "
        "non-terminated, unmasked steps), "
        "`nd_t = (1−k_t)(1−tr_t)`, `k_t` = terminated, `tr_t` = truncated; "
        "masked steps are the identity `α_t = 0, β_t = 1`."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
