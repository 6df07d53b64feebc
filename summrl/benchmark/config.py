"""The benchmark's typed config, and every check that can fail before a model loads or money is spent.

``conf/benchmark.yaml`` reuses training's groups (model, dataset, reward, judge, backend) and its
``trainer`` prompt settings, validated by the same schemas as training. ``benchmark.models`` is
parsed here into :class:`ModelEntry` / :class:`BestOfNEntry`, and ``benchmark.run_dir`` into a
:class:`TrainedRun` whose checkpoints exist and match the configured model.
"""

from __future__ import annotations

import logging
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from summrl.backends import BackendUnavailable, check_local_gpu, device_problems
from summrl.data import DataError, resolve_path
from summrl.config import (EMBEDDED_JUDGES, ModelConfig, StorageConfig, TrainerConfig, check_api_base, reward_kinds,
                           typed_config)
from summrl.errors import ConfigError
from summrl.judges import missing_keys
from summrl.keys import missing_model_keys
from summrl.preflight import refuse, unknown_provider
from summrl.checkpoints import TrainedRun, checkpoint_steps, find_trained_model, load_trained, sft_step
from summrl.job import override_key, read_result
from summrl.storage import bucket_problems, trained_config
from summrl.prompt import PROMPT_BEFORE_THE_OPTION

log = logging.getLogger(__name__)


@dataclass
class ModelEntry:
    """A model reached through litellm: a hosted id, or any OpenAI-compatible server via ``api_base``."""

    model: str
    label: str = ""  # the name in tables and charts; defaults to the model id
    api_base: Optional[str] = None
    api_key_env: Optional[str] = None  # the variable holding its key; null: litellm's usual variable


@dataclass
class BestOfNEntry:
    """RULER as test-time compute: ``n`` candidates per summary, ranked by RULER, the best one kept."""

    n: int
    label: str
    model: Optional[ModelEntry] = None  # candidates from a litellm model ...
    step: Optional[int] = None  # ... or from a checkpoint of benchmark.run_dir (0 = the base model)


@dataclass
class BenchmarkSettings:
    name: str
    output_dir: str
    models: list[Union[ModelEntry, BestOfNEntry]]
    run: Optional[TrainedRun]
    rollouts_per_doc: int
    max_concurrency: int
    timeout_s: float
    max_retries: int
    confirm: bool
    split: str = "val"  # val: training's val split; all: every document of the dataset (train_size/val_size unused)
    max_cost_usd: Optional[float] = None  # the folder's $ (models and judge, every invocation); null: no limit


@dataclass
class BenchmarkConfig:
    model: ModelConfig
    dataset: Any  # RepliqaDatasetConfig | DocumentsDatasetConfig
    trainer: TrainerConfig  # the prompt (prompt, max_words), max_summary_tokens, temperature, seed
    reward: Any
    judge: Any
    backend: Any
    benchmark: BenchmarkSettings
    project: str = "summrl"
    storage: StorageConfig = field(default_factory=StorageConfig)  # results to S3 when a bucket is configured
    logger: Any = None  # logger=wandb: the table, the rows and the charts as one W&B run
    choices: dict[str, Optional[str]] = field(default_factory=dict)


SPLITS = ("val", "all")
SERVING_BACKENDS = ("embedded", "local_gpu")


@dataclass
class BenchmarkSection:
    """conf/benchmark.yaml's ``benchmark:`` section as Hydra types it; :func:`validate_benchmark` reads its models
    and run folder into :class:`BenchmarkSettings`."""

    name: str = MISSING  # the output folder is benchmarks/<name>; rerunning with the same name resumes
    output_dir: Optional[str] = MISSING  # Hydra's output folder: null only under --cfg, which makes none
    # Each entry: a litellm id; or {model: <litellm id>, label:, api_base:, api_key_env:};
    # or {best_of_n: {model: <litellm id> | step: <checkpoint step>, n: 4, label:, api_base:, api_key_env:}}.
    models: list[Any] = field(default_factory=list)
    run_dir: Optional[str] = None  # a training run folder (runs/<name>): its checkpoints are served by the backend
    steps: Optional[list[int]] = None  # e.g. [0, 8, 16] (0 = the base model); null: every `every`th step, the last, 0
    every: int = 1
    rollouts_per_doc: int = 2
    max_concurrency: int = 8  # documents in flight per model
    timeout_s: float = 120.0  # per model call
    max_retries: int = 3  # per model call (litellm's retries)
    confirm: bool = True  # ask on stdin before any call that may cost money
    split: str = "val"  # val: training's val split (dataset.val_size); all: every document of the dataset's files
    # A hard limit on the folder's spend (model and judge calls, over every invocation): an estimate over it calls
    # nothing, and no document starts whose calls might pass it. null: no limit (the estimate is still confirmed).
    max_cost_usd: Optional[float] = None

    def __post_init__(self) -> None:
        if self.max_cost_usd is not None and not 0 < self.max_cost_usd < math.inf:
            raise ConfigError(f"benchmark.max_cost_usd: must be a number of $ above 0, or null (no limit), got "
                              f"{self.max_cost_usd!r}")
        for key, low in (("rollouts_per_doc", 1), ("max_concurrency", 1), ("every", 1), ("max_retries", 0)):
            if getattr(self, key) < low:
                raise ConfigError(f"benchmark.{key}: must be an integer >= {low}, got {getattr(self, key)!r}")
        if self.timeout_s <= 0:
            raise ConfigError(f"benchmark.timeout_s: must be > 0, got {self.timeout_s!r}")
        if self.split not in SPLITS:
            raise ConfigError(f"benchmark.split: must be one of {', '.join(SPLITS)} (all: every document of the "
                              f"dataset), got {self.split!r}")


@dataclass
class BenchmarkSchema:
    """The schema of conf/benchmark.yaml (``benchmark_schema`` in Hydra's ConfigStore): training's groups and
    schemas (summrl.config), its prompt settings (trainer), and the benchmark's own section."""

    model: ModelConfig = MISSING
    dataset: Any = MISSING  # RepliqaDatasetConfig | DocumentsDatasetConfig
    reward: Any = MISSING
    judge: Any = MISSING
    backend: Any = MISSING
    logger: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # the prompt, max_summary_tokens, ...
    storage: StorageConfig = field(default_factory=StorageConfig)  # results to S3 when a bucket is configured
    benchmark: BenchmarkSection = field(default_factory=BenchmarkSection)
    project: str = "summrl"


ConfigStore.instance().store(name="benchmark_schema", node=BenchmarkSchema)


def validate_benchmark(cfg: DictConfig, choices: Optional[dict[str, Optional[str]]] = None) -> BenchmarkConfig:
    """Type a composed ``conf/benchmark.yaml`` (Hydra has checked every key and type) and check what spans fields:
    the model entries, the run folder and its steps, and the cross-group rules."""
    choices = choices or {}
    typed = typed_config(cfg, BenchmarkSchema)
    section = typed.benchmark
    settings = _settings(section)
    config = BenchmarkConfig(model=typed.model, dataset=typed.dataset, trainer=typed.trainer, reward=typed.reward,
                             judge=typed.judge, backend=typed.backend, benchmark=settings, project=typed.project,
                             storage=typed.storage, logger=typed.logger, choices=choices)
    _check_cross(config)
    return config


# The trainer settings a benchmark reads: what its summarizers are asked and how they sample. The others are training's
# (an experiment preset sets them for both entry points, so only the command line's are refused).
TRAINER_KEYS_READ = ("prompt", "max_words", "max_summary_tokens", "temperature")


def check_trainer_overrides(overrides: list[str]) -> None:
    """A ``trainer.*`` override the benchmark does not read (``trainer.max_steps=5``) would be accepted and change
    nothing: refused, naming the ones it reads."""
    for override in overrides:
        key = override_key(override)
        if key.startswith("trainer.") and key.split(".")[1] not in TRAINER_KEYS_READ:
            raise ConfigError(f"{key}: the benchmark does not read it (it reads trainer."
                              f"{', trainer.'.join(TRAINER_KEYS_READ)}): remove it")


def _settings(section: BenchmarkSection) -> BenchmarkSettings:
    models = [_entry(i, e) for i, e in enumerate(section.models)]
    labels = [m.label for m in models]
    duplicate = next((label for label in labels if labels.count(label) > 1), None)
    if duplicate:
        raise ConfigError(f"benchmark.models: two entries are labelled {duplicate!r}; give one a distinct label")
    run = _trained_run(section.run_dir, section.steps, section.every)
    if section.output_dir is None:
        raise ConfigError("benchmark.output_dir: null; it is Hydra's output folder (benchmarks/<benchmark.name>): set "
                          "hydra.run.dir=<folder> instead")
    if not models and (run is None or not run.steps):  # benchmark.steps=[]: the run's steps are none of them
        raise ConfigError("benchmark: nothing to benchmark; list benchmark.models, or set benchmark.run_dir and its "
                          "benchmark.steps")
    return BenchmarkSettings(
        name=section.name, output_dir=section.output_dir, models=models, run=run,
        rollouts_per_doc=section.rollouts_per_doc, max_concurrency=section.max_concurrency,
        timeout_s=section.timeout_s, max_retries=section.max_retries, confirm=section.confirm, split=section.split,
        max_cost_usd=section.max_cost_usd,
    )


MODEL_KEYS = {"model", "label", "api_base", "api_key_env"}


def _model_entry(where: str, value: Any) -> ModelEntry:
    if isinstance(value, str):
        value = {"model": value}
    if not isinstance(value, dict) or not isinstance(value.get("model"), str) or not value["model"].strip():
        raise ConfigError(f"{where}: expected a litellm model id or {{model: <id>, ...}}, got {value!r}")
    unknown = sorted(set(value) - MODEL_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]} is not a setting of a model entry; valid keys: {', '.join(sorted(MODEL_KEYS))}")
    model = value["model"].strip()
    _check_litellm_id(where, model)
    check_api_base(value.get("api_base"), f"{where}.api_base")
    return ModelEntry(model=model, label=str(value.get("label") or model), api_base=value.get("api_base"),
                      api_key_env=value.get("api_key_env"))


def _check_litellm_id(where: str, model: str) -> None:
    import litellm

    litellm.suppress_debug_info = True
    try:
        litellm.get_llm_provider(model)
    except Exception:
        raise ConfigError(
            f"{where}: {model!r} is not a litellm model id; prefix it with its provider, e.g. openrouter/openai/gpt-4o, "
            "gemini/gemini-2.5-pro, or openai/<name> with api_base for an OpenAI-compatible server"
        ) from None


def _entry(index: int, value: Any) -> Union[ModelEntry, BestOfNEntry]:
    where = f"benchmark.models[{index}]"
    if isinstance(value, dict) and "best_of_n" in value:
        if set(value) != {"best_of_n"}:
            raise ConfigError(f"{where}: a best_of_n entry holds only best_of_n: {{model or step, n}}")
        spec = dict(value["best_of_n"] or {})
        where = f"{where}.best_of_n"
        n = spec.pop("n", 4)
        if not isinstance(n, int) or isinstance(n, bool) or n < 2:
            raise ConfigError(f"{where}.n: must be an integer >= 2 (candidates to rank), got {n!r}")
        has_model, has_step = "model" in spec, "step" in spec
        if has_model == has_step:
            raise ConfigError(f"{where}: set exactly one of model (a litellm id) or step (a checkpoint of benchmark.run_dir)")
        label = spec.pop("label", None)
        if has_step:
            step = spec.pop("step")
            if spec:
                raise ConfigError(f"{where}.{sorted(spec)[0]} is not a setting with step; valid: step, n, label")
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise ConfigError(f"{where}.step: must be a checkpoint step >= 0 (0 = the base model), got {step!r}")
            return BestOfNEntry(n=n, step=step, label=str(label or f"best-of-{n} step {step}"))
        inner = _model_entry(where, spec)
        return BestOfNEntry(n=n, model=inner, label=str(label or f"best-of-{n} {inner.label}"))
    return _model_entry(where, value)


def _trained_run(run_dir: Any, steps: Any, every: int) -> Optional[TrainedRun]:
    if run_dir is None:
        if steps is not None:
            raise ConfigError("benchmark.steps: set benchmark.run_dir to the training run whose checkpoints to benchmark")
        return None
    path = Path(str(run_dir)).expanduser()
    if not path.is_dir():
        raise ConfigError(f"benchmark.run_dir: {path} is not a folder (a training run folder, e.g. runs/<run.name>)")
    name, checkpoints_dir = find_trained_model(path, "benchmark.run_dir")
    available = checkpoint_steps(checkpoints_dir)
    sft = sft_step(path)
    if steps is None:  # the base model, the SFT checkpoint, every `every`th step and the last
        chosen = {0, *(s for s in available if s % every == 0 or s == sft)}
        if available:
            chosen.add(available[-1])
    else:
        if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
            raise ConfigError(f"benchmark.steps: must be a list of checkpoint steps, e.g. [0, 8, 16], got {steps!r}")
        missing = sorted(set(steps) - {0, *available})
        if missing:
            raise ConfigError(f"benchmark.steps: step {missing[0]} has no checkpoint in {checkpoints_dir}; "
                              f"available: 0 (base), {', '.join(map(str, available)) or 'none'}")
        chosen = set(steps)
    return TrainedRun(run_dir=path, name=name, checkpoints_dir=checkpoints_dir, steps=sorted(chosen), sft_step=sft)


def _check_cross(config: BenchmarkConfig) -> None:
    settings = config.benchmark
    if config.dataset.kind == "inbox":  # it reads a training run's folder, which a benchmark has not (a traceback)
        raise ConfigError("dataset=inbox is online learning's (python -m summrl.train run.name=<name> dataset=inbox); "
                          "benchmark recorded documents with dataset=documents dataset.path=runs/<name>/inbox/"
                          "documents.jsonl")
    uses_ruler = any(isinstance(m, BestOfNEntry) for m in settings.models) or "ruler" in reward_kinds(config.reward)
    if uses_ruler and config.judge.kind == "lexical":
        raise ConfigError("best_of_n and reward=ruler rank summaries with RULER, which needs an LLM judge; got judge=lexical: "
                          "use judge=gemini_flash, judge=openai_compatible or judge=embedded")
    best_of = [m for m in settings.models if isinstance(m, BestOfNEntry)]
    if config.trainer.temperature == 0 and (best_of or settings.rollouts_per_doc > 1):
        # greedy: one summary drawn N times, paid N times and ranked, or counted as N draws in the CI
        what = f"{best_of[0].label} (best-of-{best_of[0].n}) would sample" if best_of else \
            f"benchmark.rollouts_per_doc={settings.rollouts_per_doc} would count"
        raise ConfigError(f"trainer.temperature is 0 (greedy), so {what} one summary several times: set "
                          "trainer.temperature > 0 (1.0 is Summary-RL's), or benchmark.rollouts_per_doc=1 with no "
                          "best_of_n entry")
    needs_checkpoints = settings.run is not None or any(
        isinstance(m, BestOfNEntry) and m.step is not None for m in settings.models)
    for m in settings.models:
        if isinstance(m, BestOfNEntry) and m.step is not None:
            if settings.run is None:
                raise ConfigError(f"benchmark.models: {m.label} draws from step {m.step}; set benchmark.run_dir")
            available = {0, *checkpoint_steps(settings.run.checkpoints_dir)}
            if m.step not in available:
                raise ConfigError(f"benchmark.models: {m.label}: step {m.step} has no checkpoint in "
                                  f"{settings.run.checkpoints_dir}")
    if needs_checkpoints and config.backend.kind not in SERVING_BACKENDS:
        raise ConfigError(f"backend={config.choices.get('backend') or config.backend.kind}: checkpoints are served by "
                          "backend=embedded (CPU) or backend=local_gpu (GPU)")
    if config.judge.kind in EMBEDDED_JUDGES and config.backend.kind != "embedded":
        raise ConfigError(f"judge={config.judge.kind} uses the embedded backend's model; got "
                          f"backend.kind={config.backend.kind}: use backend=embedded or another judge")
    if needs_checkpoints and config.backend.kind == "embedded":
        for problem in device_problems(config.backend.device):
            raise ConfigError(problem)
    if needs_checkpoints and config.backend.kind == "local_gpu":
        try:
            check_local_gpu(config)
        except BackendUnavailable as e:
            raise ConfigError(str(e)) from None
    if settings.run is not None:
        if settings.run.name in {m.label for m in settings.models}:
            raise ConfigError(f"benchmark.models: the label {settings.run.name!r} is the trained run's name; pick another label")
        _check_run_matches(config, settings.run)


def _check_run_matches(config: BenchmarkConfig, run: TrainedRun) -> None:
    """The checkpoints are LoRA adapters of the run's base model: the configured model must be the same one."""
    saved = trained_config(run.run_dir)
    if not saved.exists():
        return  # a run folder without Hydra's record (copied checkpoints): the adapter load checks shapes
    trained = load_trained(saved, "benchmark.run_dir")
    choice = _saved_choice(run.run_dir, "model")
    fix = f"pass model={choice}" if choice else "select the model the run was trained with"
    base = OmegaConf.select(trained, "model.base_model")
    if base is not None and base != config.model.base_model:
        raise ConfigError(f"model.base_model: the run in {run.run_dir} trained {base}, the benchmark is configured with "
                          f"{config.model.base_model}; {fix}")
    lora = OmegaConf.select(trained, "model.lora")
    if lora is not None:
        for key in ("r", "alpha", "target_modules"):
            if OmegaConf.to_container(lora).get(key) != getattr(config.model.lora, key):
                raise ConfigError(f"model.lora.{key}: the run in {run.run_dir} trained its adapters with "
                                  f"{key}={lora[key]}, the benchmark has {getattr(config.model.lora, key)}; {fix}")
    weights = _trained_value(run.run_dir, trained, "model.weights", default=_ABSENT)
    if weights is not _ABSENT and not _same_weights(weights, config.model.weights):  # else a traceback, once loaded (or wrong scores)
        raise ConfigError(f"model.weights: the run in {run.run_dir} trained on {weights}, the benchmark loads "
                          f"{config.model.weights}; pass {shlex.quote(f'model.weights={weights}')}")
    _check_same_val_and_prompt(config, trained, run.run_dir)


def _same_weights(theirs: Optional[str], ours: Optional[str]) -> bool:
    """The same weights: the same spelling, or paths to the same file or folder."""
    if theirs == ours:
        return True
    if theirs is None or ours is None:
        return False
    try:
        return resolve_path(theirs).resolve() == resolve_path(ours).resolve()
    except DataError:  # a package that is not installed: told when the model loads
        return False


_ABSENT = object()


def _trained_value(run_dir: Path, trained: Any, key: str, default: Any = None) -> Any:
    """``key`` as the run resolved it (result.json's config): Hydra's saved config holds the interpolations
    themselves, which resolved here read today's environment (VAL_SIZE unset: 91), as strings ("2" is not 2)."""
    resolved = (read_result(run_dir) or {}).get("config")
    if isinstance(resolved, dict) and key in resolved:
        return resolved[key]
    value = OmegaConf.select(trained, key, default=default)
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return int(value) if isinstance(value, str) and value.isdigit() else value


DATASET_SOURCE = ("kind", "files", "path", "hf_path", "hf_split")  # which documents: the same ones, or others


def _check_same_val_and_prompt(config: BenchmarkConfig, trained: Any, run_dir: Path) -> None:
    """The checkpoints scored on the run's own val documents, with the prompt they were trained on. Val is the first
    val_size documents of a seeded shuffle: another seed, or a larger val_size (VAL_SIZE), took in documents the run
    trained on, and nothing said so."""
    def saved(key: str) -> Any:
        return _trained_value(run_dir, trained, key)

    def refuse(key: str, ours: Any, theirs: Any, why: str) -> None:
        raise ConfigError(f"{key}: the run in {run_dir} was trained with {key}={theirs}, the benchmark has {ours}: "
                          f"{why}; pass {key}={theirs}")

    d = config.dataset
    same_documents = all(saved(f"dataset.{k}") == getattr(d, k, None) for k in DATASET_SOURCE)
    if same_documents and config.benchmark.split == "val":
        seed = saved("dataset.seed")
        if seed != d.seed:
            refuse("dataset.seed", d.seed, seed, "another shuffle puts the run's training documents in val")
        theirs = saved("dataset.val_size")
        prefix = isinstance(theirs, int) and isinstance(d.val_size, int) and d.val_size <= theirs  # a part of its val
        if theirs != d.val_size and not prefix:
            refuse("dataset.val_size", d.val_size, theirs, "a larger val takes in documents the run trained on (a "
                   "smaller count is a part of its val)")
    elif same_documents:
        log.warning("summrl: benchmark.split=all scores the run's checkpoints on its training documents too: their "
                    "scores are not held-out scores")
    prompt = saved("trainer.prompt") or PROMPT_BEFORE_THE_OPTION
    if prompt != config.trainer.prompt:
        refuse("trainer.prompt", config.trainer.prompt, prompt, "its checkpoints learned to answer the other prompt")
    max_words = saved("trainer.max_words")
    if max_words is not None and max_words != config.trainer.max_words:
        refuse("trainer.max_words", config.trainer.max_words, max_words, "the prompt and the length rewards read it")


def _saved_choice(run_dir: Path, group: str) -> Optional[str]:
    hydra_yaml = run_dir / ".hydra" / "hydra.yaml"
    if not hydra_yaml.exists():
        return None
    return OmegaConf.select(OmegaConf.load(hydra_yaml), f"hydra.runtime.choices.{group}")


def check_keys(config: BenchmarkConfig) -> None:
    """Every key a paid model or judge needs, before anything is loaded or called: all of them in one preflight error
    (exit 3), as training lists its own (a config error named one at a time)."""
    found = [f"judge={config.choices.get('judge') or config.judge.kind} needs {name}: export it or put it in .env"
             for name in missing_keys(config.judge)]
    if config.judge.kind == "litellm":  # a misspelled judge failed at its first call, the models' summaries bought
        found += unknown_provider(config.judge, "judge")
    for i, entry in enumerate(config.benchmark.models):
        model = entry.model if isinstance(entry, BestOfNEntry) else entry
        if model is None:
            continue
        found += unknown_provider(model, f"benchmark.models.{i}")
        missing = missing_model_keys(model)
        if missing:
            other = "" if model.api_key_env else " (or name another with the entry's api_key_env)"
            found.append(f"benchmark.models: {entry.label} needs {' or '.join(missing)}: export it or put it in "
                         f".env{other}")
    refuse(found + bucket_problems(config.storage), "the benchmark")  # results go up after every call is paid


def same_command(config: BenchmarkConfig, overrides: list[str]) -> str:
    """How to resume or retry: the same command, plus benchmark.name where it defaulted to the time the benchmark
    started (rerun as it was typed, a new folder began, and every row was paid for again)."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    return ("the same command" if "benchmark.name" in given
            else f"the same command with benchmark.name={config.benchmark.name}")
