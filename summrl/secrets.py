"""Secrets come from the environment (or .env) and must never be written anywhere.

``redact`` masks the *values* of secret environment variables wherever they appear, and masks the
values of config keys that look like secrets. Used on everything summrl saves or sends (W&B config,
logs); the config itself never holds a key, only the *name* of the variable that does. A URL that
carries a credential (``user:password@``, ``?key=``) is refused when the config is checked
(``config.refuse_secrets``), since Hydra saves the config as typed; ``redact_text`` masks such parts too,
in case one reaches a message another way.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Optional
from urllib.parse import parse_qsl, urlsplit

# Variables whose values are secrets (WANDB_API_KEY, GEMINI_API_KEY, AWS_SECRET_ACCESS_KEY, ...).
MIN_SECRET = 4  # shorter values are placeholders ("x", "none"), and masking them would garble every message
SECRET_NAME = re.compile(r"(API_KEY|SECRET|TOKEN|PASSWORD|ACCESS_KEY)", re.IGNORECASE)
# Config keys whose values would be secrets, as a whole word of the key (hf_token, aws_secret_access_key; not
# max_summary_tokens); ``*_env`` keys hold a variable's name, which is not a secret.
SECRET_KEY = re.compile(r"^(?!.*_env$).*(?:^|[._])(?:api_?key|secret|token|password|access_key)(?:[._]|$)",
                        re.IGNORECASE)  # (a flattened key's words part at "." too: model.init_args.token)


def secret_key_name(path: str) -> bool:
    """Whether a setting's name (its last dotted part) names a secret."""
    return bool(SECRET_KEY.search(path.rsplit(".", 1)[-1]))


# A URL's query parameters that carry a credential: any name with one of these words in it (Google's ?key=, signed
# URLs' sig= and X-Amz-Signature=, ?access_token=, ?api_token=, ?client_secret=, ?x-api-key=). A list of whole names
# let ?api_token= and S3's presigned X-Amz-Security-Token= through, saved and logged as typed.
SECRET_PARAM = r"[\w.-]*?(?:key|token|secret|sig|signature|credential|password|passwd|auth)[\w.-]*"
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
MASK = "***"
_named: set[str] = set()  # variables the config names as holding a key (judge.api_key_env=JUDGE_KEY)


def name_secret_variables(names: Iterable[str]) -> None:
    """Mask these variables' values too, whatever their names: a config's ``*_env`` settings name them."""
    _named.update(names)


def secret_values() -> list[str]:
    """The current secret values, longest first (so that one containing another is masked whole)."""
    values = {v for k, v in os.environ.items() if (SECRET_NAME.search(k) or k in _named) and len(v) >= MIN_SECRET}
    return sorted(values, key=len, reverse=True)


def url_secret(text: str) -> Optional[str]:
    """What credential a URL in ``text`` carries (its user:password@, a key= query parameter), or None."""
    for found in URL.finditer(text):
        try:
            parts = urlsplit(found.group(0))
        except ValueError:
            continue
        if "@" in parts.netloc:
            return "a user name or password (user:password@host)"
        for name, _ in parse_qsl(parts.query, keep_blank_values=True):
            if re.fullmatch(SECRET_PARAM, name, re.IGNORECASE):
                return f"a credential in its query ({name}=)"
    return None


def _mask_urls(text: str) -> str:
    text = re.sub(r"(://)[^/\s@'\"<>]+@", rf"\1{MASK}@", text)
    return re.sub(rf"([?&](?:{SECRET_PARAM})=)[^&\s'\"<>#]+", rf"\1{MASK}", text, flags=re.IGNORECASE)


def redact_text(text: str, values: list[str] | None = None) -> str:
    for value in values if values is not None else secret_values():
        text = text.replace(value, MASK)
    return _mask_urls(text) if "://" in text else text


def mask_keys(text: str, keys: Iterable[Optional[str]]) -> str:
    """``text`` with a caller's own ``keys`` masked (one held in memory is in no variable), then every known secret
    (``redact_text``). A placeholder shorter than MIN_SECRET ("x", "none") is left alone."""
    for key in keys:
        if key and len(key) >= MIN_SECRET:
            text = text.replace(key, MASK)
    return redact_text(text)


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
