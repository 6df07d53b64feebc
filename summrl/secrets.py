"""Secrets come from the environment (or .env) and must never be written anywhere.

``redact`` masks the *values* of secret environment variables wherever they appear, and masks the
values of config keys that look like secrets. Used on everything summrl saves or sends (W&B config,
logs); the config itself never holds a key, only the *name* of the variable that does.
"""

from __future__ import annotations

import os
import re
from typing import Any

# Variables whose values are secrets (WANDB_API_KEY, GEMINI_API_KEY, AWS_SECRET_ACCESS_KEY, ...).
SECRET_NAME = re.compile(r"(API_KEY|SECRET|TOKEN|PASSWORD|ACCESS_KEY)", re.IGNORECASE)
# Config keys whose values would be secrets; ``*_env`` keys hold a variable's name, which is not a secret.
SECRET_KEY = re.compile(r"(api_key|secret|token|password|access_key)(?!_env)", re.IGNORECASE)
MASK = "***"


def secret_values() -> list[str]:
    """The current secret values, longest first (so that one containing another is masked whole)."""
    values = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= 4}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, values: list[str] | None = None) -> str:
    for value in values if values is not None else secret_values():
        text = text.replace(value, MASK)
    return text


def redact(obj: Any, values: list[str] | None = None) -> Any:
    """A copy of a JSON-like object with secret values and secret-looking keys masked."""
    values = secret_values() if values is None else values
    if isinstance(obj, dict):
        return {k: MASK if SECRET_KEY.search(str(k)) and v is not None else redact(v, values) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v, values) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj, values)
    return obj
