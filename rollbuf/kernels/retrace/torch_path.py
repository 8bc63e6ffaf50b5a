"""Retrace on the torch backend: its step maps and its output (``t``: the call,
:class:`rollbuf.backends.torch_backend.Loader`, which loads, scans and masks)."""

import torch

from rollbuf.kernels.retrace.coefficients import retrace_step
from rollbuf.kernels.td_lambda.coefficients import lambda_out
from rollbuf.kernels.vtrace.torch_path import weights


def steps(t):
    """The own-step maps of ``W_t = V_t + c_t(Q^ret_t − q_t)`` and the fields the output reads."""
    p = t.p
    r, k, tr, boot = t.backward_fields()
    _, c, _ = weights(t.load("target_log_probs") - t.load("log_probs"), p.lam, None, p.c_bar, None)
    elems = retrace_step(r, t.load("values"), k, tr, boot, t.load("q_values"), c, p.gamma)
    return torch.broadcast_tensors(*elems), dict(r=r, k=k, tr=tr, boot=boot)


def outputs(t, elems, env):
    """``Q^ret_t = local_t + γ·nd_t·W_{t+1}`` and the carry ``W_0``."""
    z_next, z0 = t.backward_scan(*elems)
    return t.masked((lambda_out(env["r"], env["k"], env["tr"], env["boot"], t.p.gamma, z_next),)), z0
