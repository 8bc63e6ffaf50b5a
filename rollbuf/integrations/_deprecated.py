"""The deprecated module paths ``rollbuf.gym`` and ``rollbuf.llm``: aliases of their new homes."""

from __future__ import annotations

import importlib
import warnings


def alias(old: str, new: str, namespace: dict) -> None:
    """Fill the old module's ``namespace`` from ``new`` and warn once, at import.

    Every public name (``__all__``) is re-exported; any other attribute (private helpers included)
    is forwarded by a module ``__getattr__``, so code written against the old path keeps working.
    """
    module = importlib.import_module(new)
    for name in module.__all__:
        namespace[name] = getattr(module, name)
    namespace["__all__"] = list(module.__all__)
    namespace["__getattr__"] = lambda name: getattr(module, name)
    namespace["__dir__"] = lambda: sorted(set(namespace) | set(dir(module)))
    warnings.warn(
        f"{old} has moved to {new}; import it from there ({old} will be removed in a future release)",
        DeprecationWarning,
        stacklevel=3,
    )
