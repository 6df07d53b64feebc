"""A training run folder's checkpoints, as the benchmark, ``summrl.serve`` and ``summrl.export`` read them.

ART's layout: ``<run_dir>/art/<project>/models/<name>/checkpoints/<step:04d>/`` holds the LoRA adapter after each step.
A step is named ``best`` (the checkpoint with the best val score in ``result.json``), ``latest``, or by number.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from summrl.errors import ConfigError
from summrl.job import comparable
from summrl.storage import SFT_DIR, SFT_RECORD, trained_config


@dataclass
class TrainedRun:
    """A training run folder's ART model and the checkpoint steps to benchmark (0 = the base model)."""

    run_dir: Path
    name: str  # the ART model name (the run's run.name)
    checkpoints_dir: Path
    steps: list[int]
    sft_step: Optional[int] = None  # the SFT checkpoint's step, for a run with an SFT stage (sft=...)

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints_dir / f"{step:04d}"

    def stage(self, step: int) -> str:
        """Which stage wrote a step's weights: base (step 0), sft (the SFT checkpoint) or grpo."""
        return "base" if step == 0 else "sft" if step == self.sft_step else "grpo"


def sft_step(run_dir: Path) -> Optional[int]:
    """The step of a run's SFT checkpoint (sft/record.json, written once SFT has trained), or None."""
    path = run_dir / SFT_DIR / SFT_RECORD
    return int(json.loads(path.read_text())["step"]) if path.is_file() else None


def find_trained_model(run_dir: Path, key: str = "run_dir") -> tuple[str, Path]:
    """The ART model of a run folder: ``art/<project>/models/<name>/checkpoints``."""
    found = sorted(p for p in run_dir.glob("art/*/models/*/checkpoints") if p.is_dir())
    if not found:
        raise ConfigError(f"{key}: {run_dir} has no checkpoints (expected art/<project>/models/<name>/"
                          "checkpoints/NNNN, as python -m summrl.train writes); point it at a training run folder")
    if len(found) > 1:
        raise ConfigError(f"{key}: {run_dir} holds several models ({', '.join(p.parent.name for p in found)}); "
                          "point it at one run's folder")
    return found[0].parent.name, found[0]


def checkpoint_steps(checkpoints_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in checkpoints_dir.iterdir()
                  if p.is_dir() and re.fullmatch(r"\d+", p.name) and (p / "adapter_model.safetensors").exists())




def trained_run(run_dir: Union[str, Path], key: str = "run_dir") -> TrainedRun:
    """The run at ``run_dir`` with every checkpoint it has."""
    path = Path(str(run_dir)).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{key}: {path} is not a folder (a training run folder, e.g. runs/<run.name>)")
    name, checkpoints_dir = find_trained_model(path, key)
    return TrainedRun(run_dir=path, name=name, checkpoints_dir=checkpoints_dir,
                      steps=checkpoint_steps(checkpoints_dir), sft_step=sft_step(path))


def best_axis(record: dict) -> str:
    """The val figure ``step=best`` ranks a run's checkpoints by, from its result.json: RULER-scored runs record
    val_qa_accuracy (summrl.loop.best_by); runs recorded before ``best_by`` rank by val_reward."""
    return record.get("best_by") or "val_reward"


def resolve_step(run: TrainedRun, spec: Union[str, int], key: str = "step") -> int:
    """``best`` (the best val score in result.json among the steps with a checkpoint, the later step on a tie; 0, the
    base model, when it scored best), ``latest``, or a step number with a checkpoint (0: the base model)."""
    available = run.steps
    text = str(spec).strip().lower()
    if text == "latest":
        if not available:
            raise ConfigError(f"{key}=latest: {run.checkpoints_dir} has no checkpoint yet")
        return available[-1]
    if text == "best":
        result = run.run_dir / "result.json"
        try:
            record = json.loads(result.read_text())
        except (OSError, ValueError):
            record = {}
        history = record.get("val_history") or []
        axis = best_axis(record)
        # after online learning, the best of the scores measured as the latest was (summrl.job.comparable)
        scored = [(h[axis], h["step"]) for h in comparable([h for h in history if isinstance(h, dict)])
                  if h.get(axis) is not None and h.get("step") in {0, *available}]
        if not scored:
            raise ConfigError(f"{key}=best: {result} has no val score for a step with a checkpoint; name the step "
                              f"({key}=latest or {key}=<N>, available: {', '.join(map(str, available)) or 'none'})")
        return max(scored)[1]
    if not re.fullmatch(r"\d+", text) or int(text) not in {0, *available}:
        raise ConfigError(f"{key}={spec}: not a checkpoint of {run.run_dir}: use best, latest or one of 0 (the base "
                          f"model), {', '.join(map(str, available)) or 'none'}")
    return int(text)


def load_trained(path: Path, key: str, groups: Any = ()) -> Any:
    """A run folder's saved training config, read, with each of ``groups`` in it: one cut short or edited by hand
    ended serve, export and the benchmark in yaml's traceback, and an empty one in an error about an override the
    user never typed."""
    from omegaconf import DictConfig, OmegaConf

    try:
        saved = OmegaConf.load(path)
    except Exception as e:  # yaml's errors, a file that is not text
        raise ConfigError(f"{key}: {path} can't be read ({' '.join(str(e).split())[:200]}): it is not the config "
                          f"python -m summrl.train saved; point {key} at a training run folder") from None
    missing = [group for group in groups if not isinstance(saved, DictConfig) or group not in saved]
    if missing:
        raise ConfigError(f"{key}: {path} is not a training config (it has no {', '.join(missing)}): point {key} at a "
                          "training run folder")
    return saved


def run_config(run: TrainedRun, key: str = "run_dir"):
    """The training config the run was made with (``storage.trained_config``: Hydra's, as its last training invocation
    saved it), typed and
    validated: the model (base, weights, LoRA), the prompt settings (trainer.prompt, max_words, max_summary_tokens), the judge
    and the backend a server or an export needs."""
    from omegaconf import OmegaConf

    from summrl.config import KIND_SCHEMAS, Config, typed_config
    from summrl.prompt import PROMPT_BEFORE_THE_OPTION

    path = trained_config(run.run_dir)
    if not path.is_file():
        raise ConfigError(f"{key}: {path} is missing (python -m summrl.train writes it): point {key} at a training run "
                          "folder")
    saved = load_trained(path, key, KIND_SCHEMAS)
    for group, schemas in KIND_SCHEMAS.items():  # each group typed by its option's schema, as Hydra composed it
        kind = saved[group].get("kind")
        if kind not in schemas:
            raise ConfigError(f"{key}: {path} has {group}.kind={kind!r}, which this summrl does not know")
        saved[group] = OmegaConf.merge(OmegaConf.structured(schemas[kind]), saved[group])
    if OmegaConf.select(saved, "trainer.prompt") is None:  # a run from before the option
        OmegaConf.update(saved, "trainer.prompt", PROMPT_BEFORE_THE_OPTION, force_add=True)
    # Hydra saves the config unresolved: run.dir and run.name point at Hydra's runtime, which only a run has
    cfg = OmegaConf.merge(OmegaConf.structured(Config), saved, {"run": {"dir": str(run.run_dir), "name": run.name}})
    return typed_config(cfg, Config)
