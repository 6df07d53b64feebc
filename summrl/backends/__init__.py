"""Backends: where the policy samples and trains. Each is an ART ``Backend``."""

from __future__ import annotations

from typing import Any


def build_backend(config: Any, run_dir: str) -> Any:
    """The ART backend for ``config.backend``. ART state (history, checkpoints) goes under ``run_dir/art``."""
    from pathlib import Path

    art_path = str(Path(run_dir) / "art")
    if config.backend.kind == "embedded":
        from summrl.backends.embedded import EmbeddedBackend

        return EmbeddedBackend(config.backend, model=config.model, path=art_path)
    raise ValueError(f"backend.kind={config.backend.kind} is not available yet")
