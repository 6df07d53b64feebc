"""One Hydra job: what it was asked to run (overrides, group choices, its sweep), and its ``result.json``.

Light on purpose (no torch, no ART): train.py records a job that fails before anything loads, and
summrl.report reads the records back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

RESULT_FILE = "result.json"
# Left out of a job's display name, so that the seeds of one configuration share it (W&B, reports).
NAME_EXCLUDED = ("seed", "run.name", "logger", "hydra", "experiment")


@dataclass
class JobInfo:
    overrides: list[str] = field(default_factory=list)  # this job's command-line overrides
    choices: dict[str, Optional[str]] = field(default_factory=dict)  # config group -> chosen option
    sweep: Optional[str] = None  # the multirun folder's name, e.g. 2026-11-22_05-10-00; None for a single run
    num: Optional[int] = None  # the job's number within its sweep

    @classmethod
    def from_hydra(cls) -> "JobInfo":
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
        choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra/")}
        if hydra_cfg.mode != RunMode.MULTIRUN:
            return cls(list(hydra_cfg.overrides.task), choices)
        sweep_dir = Path(hydra_cfg.sweep.dir)
        return cls(list(hydra_cfg.overrides.task), choices, f"{sweep_dir.parent.name}_{sweep_dir.name}",
                   hydra_cfg.job.num)

    @property
    def name(self) -> str:
        """The overrides that define the configuration, without seed, run name and logger keys."""
        kept = sorted(o for o in self.overrides if _key(o).split(".")[0] not in NAME_EXCLUDED
                      and _key(o) not in NAME_EXCLUDED)
        return ",".join(kept) or "defaults"

    def record(self) -> dict[str, Any]:
        return {"overrides": self.overrides, "choices": self.choices, "sweep": self.sweep, "job_num": self.num}


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def write_json(path: Path, record: dict) -> None:
    """Write a JSON record atomically: a reader never sees half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def write_result(run_dir: str | Path, result: dict) -> None:
    write_json(Path(run_dir) / RESULT_FILE, result)


def read_result(run_dir: str | Path) -> Optional[dict]:
    path = Path(run_dir) / RESULT_FILE
    return json.loads(path.read_text()) if path.is_file() else None
