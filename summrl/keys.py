"""The environment variables a litellm model entry (a judge, sft=distill's teacher, a benchmark model) reads its key
from: named by its ``api_key_env``, or else litellm's own for its provider. Checked before anything loads, and
forwarded to a remote job."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any


def load_env_file() -> None:
    """Keys (and any other variable) from ``.env``: the nearest one in the folder a command runs from or a folder above
    it, else the checkout's root. Loaded before Hydra composes the config, so ``${oc.env:X}`` reads an X that only
    ``.env`` sets. A variable already in the environment wins."""
    from dotenv import find_dotenv, load_dotenv

    load_dotenv(find_dotenv(usecwd=True) or Path(__file__).resolve().parents[1] / ".env")


@functools.lru_cache(maxsize=None)
def model_key_names(model: str) -> tuple[str, ...]:
    """The environment variables litellm reads ``model``'s key from (e.g. OPENAI_API_KEY for gpt-4.1; gemini/...
    takes GEMINI_API_KEY or GOOGLE_API_KEY), without a network call: litellm's own table, asked with none set.
    Cached: the environment is emptied for a moment, which the preflight does before any other thread starts."""
    from unittest import mock

    import litellm

    with mock.patch.dict(os.environ, clear=True):  # validate_environment names a key only when it is missing
        return tuple(litellm.validate_environment(model=model).get("missing_keys") or ())


def missing_model_keys(entry: Any) -> list[str]:
    """Variables a litellm model entry (``model``, ``api_key_env``, ``api_base``) needs that are not set. A model
    on its own api_base needs only its api_key_env; otherwise any one of litellm's variables for it will do."""
    if entry.api_key_env:
        return [] if os.environ.get(entry.api_key_env) else [entry.api_key_env]
    if entry.api_base:
        return []
    names = model_key_names(entry.model)
    return [] if not names or any(os.environ.get(n) for n in names) else list(names)


def key_names(entry: Any) -> list[str]:
    """The variables that hold the entry's key, set or not (to forward to a remote job)."""
    if entry.api_key_env:
        return [entry.api_key_env]
    return [] if entry.api_base else list(model_key_names(entry.model))
