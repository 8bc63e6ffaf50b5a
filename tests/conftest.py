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
    """Tests marked ``gpu`` (full-size rows, > 2^31 elements) run in the GPU session
    (``python -m pytest tests/test_kernels.py`` on a CUDA machine); elsewhere they are deselected,
    not skipped: the interpreter tests cover the same code paths at small sizes."""
    if _cuda:
        return
    keep = [it for it in items if it.get_closest_marker("gpu") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[it for it in items if it.get_closest_marker("gpu") is not None])
        items[:] = keep
