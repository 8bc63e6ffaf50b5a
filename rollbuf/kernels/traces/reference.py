"""Eligibility traces and episodic sums: the float64 reference loop, the oracle.

:mod:`rollbuf.reference` gathers the families' loops; its docstring gives the conventions they share.
"""

from __future__ import annotations

import math

import torch

from rollbuf.oracle import differentiable, elems, kept, stacked


def _forward(x, terminated, truncated, mask, initial, decay):
    """``y_t = x_t + decay (1-d_{t-1}) y_{t-1}``, ``y_{-1} = initial``, ``d_{-1} = 0``; d = term or trunc."""
    N, T = x.shape[0], x.shape[1]
    feat = tuple(x.shape[2:])
    F = math.prod(feat)
    diff = differentiable(x, initial)
    xs = x.to(torch.float64).reshape(N, T, F)  # features flattened
    init = None if initial is None else initial.to(torch.float64).reshape(N, F)
    ys = [[[0.0] * F for _ in range(T)] for _ in range(N)]
    finals = []
    for n in range(N):
        x_row = [elems(xs[n, t], diff) for t in range(T)]
        term = [False] * T if terminated is None else terminated[n].tolist()
        trunc = [False] * T if truncated is None else truncated[n].tolist()
        e = [0.0] * F if init is None else elems(init[n], diff)  # e_{-1}
        d_prev = 0  # d_{-1}
        for t in kept(mask, n, T):
            e = [x_row[t][f] + decay * (1 - d_prev) * e[f] for f in range(F)]
            ys[n][t] = e
            d_prev = 1 if (term[t] or trunc[t]) else 0
        finals.append([(1 - d_prev) * e[f] for f in range(F)])  # no step: d_prev = 0, e = initial
    dev = x.device
    if not diff:
        return (torch.tensor(ys, dtype=torch.float64, device=dev).reshape(N, T, *feat),
                torch.tensor(finals, dtype=torch.float64, device=dev).reshape(N, *feat))
    return stacked(ys, dev).reshape(N, T, *feat), stacked(finals, dev).reshape(N, *feat)


def eligibility_traces(x, terminated, truncated, mask, gamma, lam, initial):
    """``e_t = x_t + γλ(1-d_{t-1})e_{t-1}``; returns ``(traces, final = (1-d_last) e_last)``."""
    return _forward(x, terminated, truncated, mask, initial, float(gamma) * float(lam))


def episodic_sums(x, terminated, truncated, mask, initial):
    """``S_t = x_t + (1-d_{t-1})S_{t-1}``; returns ``(sums, final = (1-d_last) S_last)``."""
    return _forward(x, terminated, truncated, mask, initial, 1.0)
