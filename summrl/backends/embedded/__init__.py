"""The embedded backend: ART's Backend protocol on an in-process model (cpu, cuda or mps)."""

from summrl.backends.embedded.backend import EmbeddedBackend

__all__ = ["EmbeddedBackend"]
