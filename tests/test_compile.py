"""A training step that calls the estimators compiles with ``torch.compile(fullgraph=True)``.

The torch backend is traced op by op; the triton backend goes through the ``rollbuf::scan``
custom op (one opaque node with a fake implementation). On a CPU machine the kernel runs under
Triton's interpreter; the GPU session runs the same tests on CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch

from rollbuf import Rollout
from rollbuf import functional as F
from rollbuf.testing import make_rollout

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _step(backend):
    def step(r, v, k, tr, bv, lp, tlp, x):
        adv, _ = F.gae(0.99, 0.95, rewards=r, values=v, terminated=k, truncated=tr,
                       bootstrap_values=bv, backend=backend)
        vs, pg = F.vtrace(tlp, 0.99, log_probs=lp, rewards=r, values=v, terminated=k, truncated=tr,
                          bootstrap_values=bv, backend=backend)
        g, carry = F.lambda_returns(0.99, 0.9, rewards=r, values=v, terminated=k, truncated=tr,
                                    bootstrap_values=bv, backend=backend, return_carry=True)
        e, final = F.eligibility_traces(x, 0.99, 0.9, terminated=k, truncated=tr, backend=backend)
        loss = (adv * tlp).mean() + (vs - v).pow(2).mean() + pg.mean() + g.mean() + e.mean()
        return loss, adv, carry, final

    return step


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fullgraph_compile_equals_eager(backend):
    torch._dynamo.reset()
    f = make_rollout(3, 41, seed=5, p_masked=0.0, device=DEV)
    args = (f["rewards"], f["values"], f["terminated"], f["truncated"], f["bootstrap_values"],
            f["log_probs"], f["target_log_probs"], torch.randn(3, 41, 2, device=DEV))
    eager = _step(backend)(*args)
    compiled = torch.compile(_step(backend), fullgraph=True)(*args)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_rollout_method_compiles():
    torch._dynamo.reset()
    f = make_rollout(2, 23, seed=1, p_masked=0.0, device=DEV)
    ro = Rollout(rewards=f["rewards"], values=f["values"], terminated=f["terminated"],
                 truncated=f["truncated"], bootstrap_values=f["bootstrap_values"], batch_size=[2, 23])

    def step(ro):
        adv, ret = ro.gae(0.99, 0.95)
        return adv.sum() + ret.sum()

    torch.testing.assert_close(torch.compile(step, fullgraph=True)(ro), step(ro))


@pytest.mark.parametrize("layout", ["env", "time"])
def test_custom_op_passes_opcheck(layout):
    """The op's schema, fake (meta) implementation and dispatch agree (torch.library.opcheck),
    strides included: time-major inputs give time-major outputs in the fake too."""
    from rollbuf.kernels import op

    f = make_rollout(2, 19, seed=3, p_masked=0.3, device=DEV)
    if layout == "time":
        f = {k: (v.mT.contiguous().mT if isinstance(v, torch.Tensor) else v) for k, v in f.items()}
    fields = [f["rewards"], f["values"], f["terminated"], f["truncated"], f["bootstrap_values"], f["mask"],
              None, None, None, None]
    args = (fields, None, "lambda", "advantages,returns", [0.99, 0.95, 1.0, 1.0, 1.0, 1.0], [False, True, True],
            "bootstrap", torch.float32, torch.float32, [])
    torch.library.opcheck(op.scan, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_compiled_training_step_gradients_equal_eager(backend):
    """A loss built on the estimators, differentiated under ``torch.compile(fullgraph=True)``: the
    gradients equal the eager ones (with grads, the compiled call traces the torch backend)."""
    torch._dynamo.reset()
    f = make_rollout(3, 37, seed=9, p_masked=0.2, garbage=False, device=DEV)
    for k in ("rewards", "values", "bootstrap_values", "log_probs", "target_log_probs"):
        f[k] = torch.nan_to_num(f[k])

    def step(r, v, tlp):
        adv, ret = F.gae(0.99, 0.95, rewards=r, values=v, terminated=f["terminated"], truncated=f["truncated"],
                         bootstrap_values=f["bootstrap_values"], mask=f["mask"], backend=backend)
        vs, pg = F.vtrace(tlp, 0.99, log_probs=f["log_probs"], rewards=r, values=v, terminated=f["terminated"],
                          truncated=f["truncated"], bootstrap_values=f["bootstrap_values"], mask=f["mask"],
                          backend=backend)
        return (adv.square().mean() + ret.mean() + (vs - v).square().mean() + (pg * tlp).mean())

    def grads(fn):
        xs = [f[k].clone().requires_grad_() for k in ("rewards", "values", "target_log_probs")]
        loss = fn(*xs)
        return (loss, *torch.autograd.grad(loss, xs))

    eager = grads(step)
    compiled = grads(torch.compile(step, fullgraph=True))
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    """The eager kernel path records into a CUDA graph (no host syncs, the split rows' workspace
    reset inside the kernel) and replays on new inputs copied into the captured buffers: short
    tiled rows, walked rows, split rows chained by the decoupled look-back and one long split row
    (three passes) in one graph."""
    shapes = [(4096, 37), (1100, 2501), (8, 65537), (1, 300001)]
    bufs = [make_rollout(n, t, seed=i, p_masked=0.1, device="cuda") for i, (n, t) in enumerate(shapes)]

    def calls():
        outs = []
        for f in bufs:
            outs += list(F.gae(0.99, 0.95, rewards=f["rewards"], values=f["values"], terminated=f["terminated"],
                               truncated=f["truncated"], bootstrap_values=f["bootstrap_values"], mask=f["mask"],
                               backend="triton"))
            outs += list(F.vtrace(f["target_log_probs"], 0.99, log_probs=f["log_probs"], rewards=f["rewards"],
                                  values=f["values"], terminated=f["terminated"], truncated=f["truncated"],
                                  bootstrap_values=f["bootstrap_values"], mask=f["mask"], backend="triton"))
        return outs

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        calls()  # warm-up (compilation) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = calls()
    for seed in (11, 12):  # replay twice: the workspace must be clean after every launch
        for i, (f, (n, t)) in enumerate(zip(bufs, shapes)):
            new = make_rollout(n, t, seed=seed * 10 + i, p_masked=0.1, device="cuda")
            for k, v in new.items():
                if isinstance(v, torch.Tensor):
                    f[k].copy_(v)
        g.replay()
        torch.cuda.synchronize()
        for got, want in zip(captured, calls()):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
