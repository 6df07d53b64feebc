"""What a local run needs from this machine and its environment, checked before anything loads.

Every missing item is listed at once with its fix (``backend=skypilot`` has its own, in summrl.cloud.launch).
"""

from __future__ import annotations

import os
from typing import Any

from summrl.backends import BackendUnavailable, check_local_gpu, device_problems
from summrl.data.document import resolve_path
from summrl.data.split import DataError
from summrl.errors import ConfigError
from summrl.judges import missing_keys
from summrl.keys import key_names, missing_model_keys
from summrl.storage import bucket_problems, resolve_bucket


class PreflightError(ConfigError):
    """Something the run needs is missing; the message lists each item and its fix."""

    failure = "preflight"


def problems(config: Any) -> list[str]:
    found = [f"judge.api_key_env={name}: the judge's key is not set: export {name} or put it in .env"
             if config.judge.api_key_env else
             f"judge.model={config.judge.model} needs {name} (litellm's variable for its provider): export it or put "
             "it in .env, or name another with judge.api_key_env" for name in missing_keys(config.judge)]
    if config.judge.kind == "litellm":
        found += unknown_provider(config.judge, "judge")
    if config.sft.kind == "distill":
        found += unknown_provider(config.sft.teacher, "sft.teacher")
    found += teacher_key_problems(config)
    if config.backend.kind == "embedded":
        found += device_problems(config.backend.device)
    if config.backend.kind in ("embedded", "local_gpu") and config.model.weights:  # a cluster's paths are its own
        try:
            path = resolve_path(config.model.weights)
            if not path.exists():
                found.append(f"model.weights={config.model.weights}: {path} does not exist: point it at a model "
                             "folder or .gguf file")
        except DataError as e:  # pkg:<package>/... of a package not installed
            found.append(f"model.weights: {e}")
    if config.backend.kind == "local_gpu":
        try:
            check_local_gpu(config)
        except BackendUnavailable as e:
            found.append(str(e))
    if config.backend.kind == "serverless" and not os.environ.get("WANDB_API_KEY"):
        found.append("backend=serverless needs WANDB_API_KEY (W&B Training): export it or put it in .env")
    if config.storage.enabled and not resolve_bucket(config.storage):
        found.append("storage.enabled=true needs a bucket: set BACKUP_BUCKET in the environment or .env, "
                     "or storage.bucket=<name>; or turn backups off with storage.enabled=false")
    return found + bucket_problems(config.storage)


def unknown_provider(entry: Any, at: str) -> list[str]:
    """A litellm model id (``model``, ``api_base``) whose provider litellm can't tell, e.g. a misspelled or
    unprefixed name: offline, from litellm's own table, so that it fails here and not at the first call."""
    import litellm

    litellm.suppress_debug_info = True  # its "Provider List" banner on every failed lookup
    try:
        litellm.get_llm_provider(model=entry.model, api_base=entry.api_base)
    except Exception:  # litellm.BadRequestError: "LLM Provider NOT provided"
        return [f"{at}.model={entry.model}: litellm can't tell which provider serves it: check the spelling, or "
                f"prefix the provider (gemini/gemini-2.5-flash, openrouter/..., or openai/<name> with {at}.api_base "
                "for an OpenAI-compatible server)"]
    return []


def teacher_key_names(config: Any) -> list[str]:
    """The variables that hold sft=distill's teacher key (to forward to a remote job), set or not."""
    return key_names(config.sft.teacher) if config.sft.kind == "distill" else []


def teacher_key_problems(config: Any) -> list[str]:
    """sft=distill's teacher key, checked before the model loads (a hosted teacher with api_key_env=null
    reads litellm's usual variable for its provider)."""
    if config.sft.kind != "distill":
        return []
    missing = missing_model_keys(config.sft.teacher)
    if not missing:
        return []
    fix = "" if config.sft.teacher.api_key_env else " (or name another with sft.teacher.api_key_env)"
    return [f"sft.teacher.model={config.sft.teacher.model} needs {' or '.join(missing)}: export it or put it in "
            f".env{fix}"]


def check(config: Any) -> None:
    refuse(problems(config))


def refuse(found: list[str], what: str = "this run") -> None:
    """PreflightError listing every item ``found`` (each with its fix), so that they are fixed at once."""
    if found:
        raise PreflightError(f"{what} can't start yet:\n" + "\n".join(f"  - {p}" for p in found))
