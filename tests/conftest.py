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
