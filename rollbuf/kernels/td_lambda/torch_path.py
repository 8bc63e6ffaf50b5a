"""The TD(λ) family on the torch backend: its step maps and its outputs (``t``: the call,
:class:`rollbuf.backends.torch_backend.Loader`, which loads, scans and masks)."""

import torch

from rollbuf.kernels.td_lambda.coefficients import lambda_out, lambda_step


def steps(t):
    """The own-step maps ``(α, β)`` of ``Z_t = (1−λ)V_t + λG_t`` and the fields the outputs read."""
    r, k, tr, boot = t.backward_fields()
    v = t.load("values") if t.p.fields.get("values") is not None else torch.zeros_like(r)
    return torch.broadcast_tensors(*lambda_step(r, v, k, tr, boot, t.p.gamma, t.p.lam)), dict(r=r, k=k, tr=tr,
                                                                                              boot=boot, v=v)


def outputs(t, elems, env):
    """``G_t`` and ``A_t = G_t − V_t`` (those the problem asks for), and the carry ``Z_0``."""
    z_next, z0 = t.backward_scan(*elems)
    g = lambda_out(env["r"], env["k"], env["tr"], env["boot"], t.p.gamma, z_next)
    named = {"returns": g, "advantages": g - env["v"]}
    return t.masked(tuple(named[o] for o in t.p.outputs)), z0
