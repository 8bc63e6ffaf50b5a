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
        adv, ret = F.gae(0.99, 0.95, rewards=r, values=v, terminated=k, truncated=tr,
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


def test_custom_op_passes_opcheck():
    """The op's schema, fake (meta) implementation and dispatch agree (torch.library.opcheck)."""
    from rollbuf.kernels import op

    f = make_rollout(2, 19, seed=3, p_masked=0.3, device=DEV)
    args = (f["rewards"], f["values"], f["terminated"], f["truncated"], f["bootstrap_values"], f["mask"],
            None, None, None, None, None, "lambda", "advantages,returns", 0.99, 0.95, 1.0, 1.0, 1.0, 1.0,
            "bootstrap", False, True, torch.float32, torch.float32, [], True)
    torch.library.opcheck(op.scan, args, test_utils=("test_schema", "test_faketensor"))
