import os

from hypothesis import HealthCheck, settings

# Profiles: "ci" (default, quick) and "thorough" (>= 1000 examples per property, run by hand:
# HYPOTHESIS_PROFILE=thorough python -m pytest tests -k property).
settings.register_profile("ci", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The Triton kernels run on CPU tensors under Triton's interpreter; it must be switched on before
# triton.jit wraps the kernels, i.e. before rollbuf.kernels is imported. On a CUDA machine the
# kernel tests run compiled on the GPU instead.
try:
    import torch

    _cuda = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` (full-size rows, > 2^31 elements) or ``multigpu`` (NCCL over two GPUs)
    run in the GPU sessions (``python -m pytest tests`` on a machine with the devices); elsewhere they
    are deselected, not skipped: the CPU tests cover the same code paths at small sizes (the
    kernels under Triton's interpreter, the time-sharded estimators over gloo)."""
    n_gpu = torch.cuda.device_count() if _cuda else 0
    drop = {"gpu"} if n_gpu == 0 else set()
    if n_gpu < 2:
        drop.add("multigpu")
    gone = [it for it in items if any(it.get_closest_marker(m) is not None for m in drop)]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = [it for it in items if it not in gone]
