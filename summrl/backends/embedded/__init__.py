"""The embedded backend: ART's Backend protocol on an in-process model (cpu, cuda or mps).

``EmbeddedBackend`` is imported on first use: the engine alone (``load_causal_lm``, which summrl.export uses) needs
torch and transformers, not ART, whose import takes about 10 s on 2 cores.
"""

from typing import Any

__all__ = ["EmbeddedBackend"]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedBackend":
        from summrl.backends.embedded.backend import EmbeddedBackend

        return EmbeddedBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
