"""Draw docs/img/boundaries.png: the worked example's row, its episode boundaries, and where the
backward scan is cut (β_t = 0) or fed a bootstrap value.

    python docs/examples/draw_boundaries.py            # writes docs/img/boundaries.png

Needs matplotlib (``pip install matplotlib`` or the ``docs`` extra).
"""

from __future__ import annotations

import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worked_example import ROW, T  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "img", "boundaries.png")
EPISODE_COLOURS = ["#cfe2f3", "#fce5cd", "#d9ead3"]


def episodes() -> list[list[int]]:
    eps, cur = [], []
    for t in range(T):
        cur.append(t)
        if ROW["terminated"][t] or ROW["truncated"][t] or t == T - 1:
            eps.append(cur)
            cur = []
    return eps


def main(path: str = OUT) -> str:
    fig, ax = plt.subplots(figsize=(11, 4.2), dpi=150)
    ax.set_xlim(-0.8, T + 1.4)
    ax.set_ylim(-2.1, 2.5)
    ax.axis("off")

    # the steps, coloured by episode
    for e, steps in enumerate(episodes()):
        for t in steps:
            ax.add_patch(FancyBboxPatch((t + 0.08, -0.45), 0.84, 0.9, boxstyle="round,pad=0.02",
                                        fc=EPISODE_COLOURS[e], ec="#444444", lw=1))
            ax.text(t + 0.5, 0.18, f"t={t}", ha="center", va="center", fontsize=10, weight="bold")
            ax.text(t + 0.5, -0.18, f"r={ROW['rewards'][t]:g}  V={ROW['values'][t]:g}", ha="center",
                    va="center", fontsize=7.5)
        mid = (steps[0] + steps[-1] + 1) / 2
        ax.text(mid, -0.75, f"episode {e + 1}", ha="center", va="center", fontsize=9, color="#333333")
        # the backward scan inside the episode: Z_{t+1} flows into step t
        if len(steps) > 1:
            ax.add_patch(FancyArrowPatch((steps[-1] + 0.5, 0.75), (steps[0] + 0.5, 0.75),
                                         arrowstyle="-|>", mutation_scale=12, color="#555555",
                                         connectionstyle="arc3,rad=0.25"))
        ax.text(mid, 1.12, "backward scan", ha="center", fontsize=7.5, color="#555555")

    # boundaries
    for t in range(T):
        x = t + 1.0
        if ROW["terminated"][t]:
            ax.plot([x, x], [-1.05, 0.6], color="black", lw=2.5)
            ax.text(x, -1.3, f"terminated after t={t}\nV'={0} : no bootstrap\nscan cut: β={0}",
                    ha="center", va="top", fontsize=8)
        elif ROW["truncated"][t]:
            ax.plot([x, x], [-1.05, 0.6], color="#cc0000", lw=2.5, ls="--")
            ax.text(x, -1.3, f"truncated after t={t}\nscan cut: β={0}", ha="center", va="top",
                    fontsize=8, color="#cc0000")
            ax.text(t + 0.5, 2.05, f"bootstrap_values[{t}] = {ROW['bootstrap_values'][t]:g}\n"
                    f"→ local term of step {t} (in α_{t})", ha="center", fontsize=8, color="#cc0000",
                    bbox=dict(boxstyle="round", fc="white", ec="#cc0000"))
            ax.add_patch(FancyArrowPatch((t + 0.5, 1.9), (t + 0.5, 0.5), arrowstyle="-|>",
                                         mutation_scale=12, color="#cc0000"))
    # window end
    x = T
    ax.plot([x, x], [-1.05, 0.6], color="#1155cc", lw=2.5, ls=":")
    ax.text(x, -1.3, "window end\n(d := 1)", ha="center", va="top", fontsize=8, color="#1155cc")
    ax.text(x + 0.45, 2.05, f"V(s_T) = bootstrap_values[{T - 1}] = {ROW['bootstrap_values'][T - 1]:g}\n"
            "→ scan carry Z_T (or carry= of the next window)", ha="center", fontsize=8,
            color="#1155cc", bbox=dict(boxstyle="round", fc="white", ec="#1155cc"))
    ax.add_patch(FancyArrowPatch((x + 0.45, 1.9), (x - 0.35, 0.5), arrowstyle="-|>",
                                 mutation_scale=12, color="#1155cc"))
    ax.text(-0.7, 2.35, "bootstrap_values is NaN in every other slot: never read.", fontsize=8,
            color="#555555")

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(os.path.normpath(main()))
