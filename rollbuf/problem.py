"""One estimator call after validation: what every backend receives.

``fields`` hold the caller's tensors with the leading batch dimensions flattened to one
(``[N, T]``, ``x`` of the forward estimators ``[N, T, *F]``), flags still in their own dtype,
``bootstrap_values`` either ``[N, T]`` or ``[N]`` (window-end column only), absent fields ``None``.
"""

from __future__ import annotations

import attrs
import torch


@attrs.define(slots=True, kw_only=True)
class Problem:
    family: str  # "lambda" | "retrace" | "vtrace" | "trace": which scan the estimator is
    outputs: tuple[str, ...]  # names of the per-step outputs, in order
    fields: dict[str, torch.Tensor | None]
    gamma: float = 1.0
    lam: float = 1.0
    rho_bar: float = 1.0
    c_bar: float = 1.0
    pg_rho_bar: float = 1.0
    decay: float = 1.0
    window_end: str = "bootstrap"  # "bootstrap" | "terminal"
    no_bootstrap: bool = False  # Monte-Carlo returns: truncation cuts, nothing is ever read
    carry: torch.Tensor | None = None  # chained window: the scan state past the window
    compute_dtype: torch.dtype = torch.float32
    out_dtype: torch.dtype = torch.float32
    batch_shape: tuple[int, ...] = ()
    feature_shape: tuple[int, ...] = ()
    reverse: bool = True  # only read by the generic affine_scan
    want_carry: bool = False  # return_carry=True: the kernel also writes the row's carry out


    @property
    def pair(self) -> bool:
        return self.family == "vtrace"

    @property
    def main(self) -> torch.Tensor:
        return self.fields["x" if self.family in ("trace", "affine") else "rewards"]
