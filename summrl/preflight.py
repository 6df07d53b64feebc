"""What a local run needs from this machine and its environment, checked before anything loads.

Every missing item is listed at once with its fix (``backend=skypilot`` has its own, in summrl.cloud.launch).
"""

from __future__ import annotations

import os
from typing import Any

from summrl.config import ConfigError


class PreflightError(ConfigError):
    """Something the run needs is missing; the message lists each item and its fix."""


def problems(config: Any) -> list[str]:
    from summrl.backends import BackendUnavailable, check_local_gpu
    from summrl.judges import missing_keys
    from summrl.storage import resolve_bucket

    found = [f"judge.api_key_env={name}: the judge's key is not set: export {name} or put it in .env"
             for name in missing_keys(config.judge)]
    if config.sft.kind == "distill":
        found += [f"sft.teacher.api_key_env={name}: the teacher's key is not set: export {name} or put it in .env"
                  for name in missing_keys(config.sft.teacher)]
    if config.backend.kind == "local_gpu":
        try:
            check_local_gpu()
        except BackendUnavailable as e:
            found.append(str(e))
    if config.backend.kind == "serverless" and not os.environ.get("WANDB_API_KEY"):
        found.append("backend=serverless needs WANDB_API_KEY (W&B Training): export it or put it in .env")
    if config.storage.enabled and not resolve_bucket(config.storage):
        found.append("storage.enabled=true needs a bucket: set BACKUP_BUCKET in the environment or .env, "
                     "or storage.bucket=<name>; or turn backups off with storage.enabled=false")
    return found


def check(config: Any) -> None:
    found = problems(config)
    if found:
        raise PreflightError("this run can't start yet:\n" + "\n".join(f"  - {p}" for p in found))
