"""The worked example of docs/semantics.md: one row, three episode boundaries, γ = 0.9, λ = 0.8.

Run it to print the markdown tables pasted into docs/semantics.md between the markers
``<!-- BEGIN WORKED EXAMPLE -->`` and ``<!-- END WORKED EXAMPLE -->`` (tests/test_docs.py checks that
the two agree). Every number is computed by ``backend="reference"``, the float64 oracle.

    python docs/examples/worked_example.py
"""

from __future__ import annotations

import torch

import rollbuf.functional as F

GAMMA, LAM = 0.9, 0.8
NAN = float("nan")

# One env, T = 8 steps. Episode 1 = steps 0-2 (terminated after step 2), episode 2 = steps 3-5
# (truncated after step 5: time limit, V(s'_5) = 3 recorded in bootstrap_values[5]), episode 3 =
# steps 6-7, cut by the window end (V(s_T) = 2 in bootstrap_values[7], e.g. by Rollout.bootstrap).
# bootstrap_values is NaN wherever it is not read: none of it may leak into an output.
ROW = dict(
    rewards=[0.0, 1.0, 2.0, 0.0, 1.0, 1.0, 0.0, 2.0],
    values=[1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 1.0, 2.0],
    terminated=[0, 0, 1, 0, 0, 0, 0, 0],
    truncated=[0, 0, 0, 0, 0, 1, 0, 0],
    bootstrap_values=[NAN, NAN, NAN, NAN, NAN, 3.0, NAN, 2.0],
)
T = len(ROW["rewards"])


def fields() -> dict:
    """The row as rollbuf fields: float64 ``[1, T]`` tensors, bool flags."""
    return dict(
        rewards=torch.tensor([ROW["rewards"]], dtype=torch.float64),
        values=torch.tensor([ROW["values"]], dtype=torch.float64),
        terminated=torch.tensor([ROW["terminated"]], dtype=torch.bool),
        truncated=torch.tensor([ROW["truncated"]], dtype=torch.bool),
        bootstrap_values=torch.tensor([ROW["bootstrap_values"]], dtype=torch.float64),
    )


def compute() -> dict[str, list[float]]:
    """All outputs of the example, by the reference backend."""
    f = fields()
    no_values = {k: v for k, v in f.items() if k != "values"}
    ref = dict(backend="reference")
    delta = F.gae(GAMMA, 0.0, **f, **ref).advantages  # GAE with λ = 0 is the TD error δ_t
    gae = F.gae(GAMMA, LAM, **f, **ref)
    out = {
        "δ_t (GAE with λ = 0)": delta,
        "GAE advantages A_t": gae.advantages,
        "GAE returns A_t + V_t": gae.returns,
        "TD(λ) returns": F.lambda_returns(GAMMA, LAM, **f, **ref),
        "discounted returns, bootstrap=True": F.discounted_returns(GAMMA, **no_values, **ref),
        "discounted returns, bootstrap=False (MC)": F.discounted_returns(
            GAMMA, bootstrap=False, **no_values, **ref),
        "GAE advantages, window_end='terminal'": F.gae(
            GAMMA, LAM, **f, window_end="terminal", **ref).advantages,
    }
    return {k: v[0].tolist() for k, v in out.items()}


def successor_values() -> list[str]:
    """``V'_t`` of SPEC §1, as text: where each step's successor value comes from."""
    out = []
    for t in range(T):
        if ROW["terminated"][t]:
            out.append("0 (terminal)")
        elif ROW["truncated"][t]:
            out.append(f"B_{t} = {ROW['bootstrap_values'][t]:g}")
        elif t == T - 1:
            out.append(f"V(s_T) = {ROW['bootstrap_values'][t]:g}")
        else:
            out.append(f"V_{t + 1} = {ROW['values'][t + 1]:g}")
    return out


def _num(x: float) -> str:
    return "NaN" if x != x else f"{x:.4f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render() -> str:
    """The markdown pasted into docs/semantics.md."""
    header = [""] + [f"t={t}" for t in range(T)]
    flag = {0: "", 1: "**1**"}
    after = []
    for t in range(T):
        if ROW["terminated"][t]:
            after.append("terminated")
        elif ROW["truncated"][t]:
            after.append("truncated")
        elif t == T - 1:
            after.append("window end")
        else:
            after.append("")
    inputs = _table(header, [
        ["`rewards` r_t"] + [f"{x:g}" for x in ROW["rewards"]],
        ["`values` V_t"] + [f"{x:g}" for x in ROW["values"]],
        ["`terminated`"] + [flag[x] for x in ROW["terminated"]],
        ["`truncated`"] + [flag[x] for x in ROW["truncated"]],
        ["`bootstrap_values`"] + [_num(x) if x != x else f"**{x:g}**" for x in ROW["bootstrap_values"]],
        ["after step t"] + after,
        ["successor value V'_t"] + successor_values(),
    ])
    outputs = _table(["γ = 0.9, λ = 0.8"] + header[1:],
                     [[name] + [_num(x) for x in xs] for name, xs in compute().items()])
    return f"Inputs (one env, `[1, 8]`):\n\n{inputs}\n\nOutputs (`backend=\"reference\"`, float64):\n\n{outputs}"


if __name__ == "__main__":
    print(render())
