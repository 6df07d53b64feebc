"""``python -m summrl.serve``'s typed config: which run and step to serve, and how (``conf/serve.yaml``).

The model, its prompt (``trainer.prompt``, ``max_words``, ``max_summary_tokens``, ``temperature``), the backend and the
judge are the run's own (``storage.trained_config``): a server answers as the run was trained.
``+backend.<key>=<value>`` and ``+judge.<key>=<value>`` change one setting of the run's own (``+``: Hydra adds a key
the composed config lacks); ``judge=<option>`` or ``backend=<option>`` replaces the run's with that option (its
defaults, then ``judge.<key>=...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from summrl.backends import device_problems
from summrl.checkpoints import TrainedRun, resolve_step, run_config, trained_run
from summrl.config import EMBEDDED_JUDGES, KIND_SCHEMAS, _require, config_error, typed_entry, unknown_key
from summrl.errors import ConfigError

SELECTORS = ("ruler", "rubric", "length")
RELOAD = ("off", "auto")


@dataclass
class ServeSection:
    host: str = "127.0.0.1"
    port: int = 8000
    # The variable holding the bearer key clients must send (Authorization: Bearer <key>); null: no key asked.
    api_key_env: Optional[str] = None
    best_of_n: int = 1  # summaries sampled per request; the selector returns the best
    selector: str = "ruler"  # ruler (the judge ranks them) | rubric (the document's rubrics) | length (no judge)
    temperature: Optional[float] = None  # null: the run's trainer.temperature
    max_document_tokens: int = 4096  # in the policy's tokens; a longer document gets 413
    max_queue: int = 64  # requests in flight beyond this get 429 with Retry-After
    max_n: int = 16  # the most choices one chat completion may ask for (n); more get 400: one request can't hog it
    record: bool = False  # append each summarized document to <run_dir>/inbox/ (online learning: dataset=inbox)
    reload: str = "off"  # auto: serve a newer checkpoint of the run as soon as training writes one
    reload_check_s: float = 2.0  # how often auto reload looks for a newer checkpoint (loaded between requests)
    # Ctrl-C or SIGTERM: how long requests in flight get to finish before they are cut (a stream open for minutes
    # kept the server up as long)
    shutdown_grace_s: float = 10.0

    def __post_init__(self) -> None:
        _require(1 <= self.port <= 65535, "serve.port", f"must be in 1..65535, got {self.port}")
        _require(self.best_of_n >= 1, "serve.best_of_n", f"must be >= 1, got {self.best_of_n}")
        _require(self.selector in SELECTORS, "serve.selector",
                 f"must be one of {', '.join(SELECTORS)}, got {self.selector!r}")
        _require(self.temperature is None or 0.0 <= self.temperature <= 2.0, "serve.temperature",
                 f"must be in [0, 2] or null (the run's trainer.temperature), got {self.temperature}")
        # greedy samples are one summary N times, ranked (by a judge that may be paid) for nothing
        _require(self.best_of_n == 1 or self.temperature != 0, "serve.temperature",
                 f"is 0 (greedy), so serve.best_of_n={self.best_of_n} would sample one summary {self.best_of_n} "
                 "times: leave the temperature at the run's (null) or above 0, or set serve.best_of_n=1")
        _require(self.max_document_tokens > 0, "serve.max_document_tokens", f"must be > 0, got {self.max_document_tokens}")
        _require(self.max_queue > 0, "serve.max_queue", f"must be > 0, got {self.max_queue}")
        _require(self.max_n > 0, "serve.max_n", f"must be > 0, got {self.max_n}")
        _require(self.reload in RELOAD, "serve.reload", f"must be off or auto, got {self.reload!r}")
        _require(self.reload_check_s > 0, "serve.reload_check_s", f"must be > 0, got {self.reload_check_s}")
        _require(self.shutdown_grace_s >= 0, "serve.shutdown_grace_s", f"must be >= 0, got {self.shutdown_grace_s}")

    @property
    def judged(self) -> bool:
        """A judge ranks each request's samples: best-of-n with the ruler or rubric selector (length needs none)."""
        return self.best_of_n > 1 and self.selector != "length"


@dataclass
class ServeSchema:
    """conf/serve.yaml (``serve_schema`` in Hydra's ConfigStore)."""

    run_dir: str = MISSING  # a training run folder, runs/<run.name>
    step: str = "best"  # best (the best val score in result.json) | latest | <N>; 0 is the base model
    serve: ServeSection = field(default_factory=ServeSection)
    judge: Any = None  # null: the run's judge
    backend: Any = None  # null: the run's backend
    # With reload=auto the served step follows training: step=latest serves each new step, step=best the new best.


@dataclass
class ServeConfig:
    """The validated config a server runs with: the run, its step, the run's training config (model, trainer,
    backend, judge, reward) with this command's overrides applied, and the serve section."""

    run: TrainedRun
    step: int
    follow: str  # what reload=auto follows: latest | best | fixed
    train: Any  # summrl.config.Config
    serve: ServeSection


def with_settings(group: str, section: Any, settings: dict) -> Any:
    """The run's judge or backend with some of its settings changed (``+backend.device=cuda``), each checked as
    training checks it. Raises ConfigError naming the key."""
    if settings.get("kind", section.kind) != section.kind:
        raise ConfigError(f"+{group}.kind: a {group} of another kind is an option: choose it with {group}=<option>")
    schema = type(section)
    for key in settings:
        if key not in {f.name for f in fields(schema)}:
            raise unknown_key(f"{group}.{key}", schema)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(section), settings))
    except OmegaConfBaseException as e:
        raise config_error(e, prefix=group) from None


def register() -> None:
    ConfigStore.instance().store(name="serve_schema", node=ServeSchema)


def validate_serve(cfg: DictConfig) -> ServeConfig:
    """Type conf/serve.yaml, read the run's own config and resolve the step. Raises ConfigError (one line)."""
    schema: ServeSchema = typed_entry(cfg, ServeSchema)
    run = trained_run(schema.run_dir, "run_dir")
    train = run_config(run)
    for group in ("judge", "backend"):
        chosen = getattr(schema, group)
        if isinstance(chosen, dict):  # +backend.device=cuda: settings changed on the run's own
            setattr(train, group, with_settings(group, getattr(train, group), chosen))
        elif chosen is not None:  # judge=<option> on the command line: its YAML starts from its kind's schema
            if type(chosen) not in KIND_SCHEMAS[group].values():
                raise ConfigError(f"{group}: choose one of its options ({group}=<option>), got {chosen!r}")
            setattr(train, group, chosen)
    if train.backend.kind not in ("embedded", "local_gpu"):
        given = schema.backend is not None and not isinstance(schema.backend, dict)  # backend=<option> given here
        said = (f"backend={train.backend.kind} can't serve a checkpoint" if given
                else f"the run was trained with backend={train.backend.kind}")
        raise ConfigError(f"backend: {said}; serve it on this machine with backend=embedded (CPU, CUDA or MPS) or "
                          "backend=local_gpu (vLLM on a GPU)")
    if train.backend.kind == "embedded":
        for problem in device_problems(train.backend.device):
            raise ConfigError(problem)
    s = schema.serve
    if s.judged and s.selector == "ruler" and train.judge.kind == "lexical":
        raise ConfigError("serve.selector=ruler ranks the samples with an LLM judge; the run's judge is lexical: choose "
                          "judge=local (offline), judge=gemini_flash, or serve.selector=length")
    if s.judged:  # else every request samples N, then falls back
        from summrl.judges import missing_keys

        for name in missing_keys(train.judge):
            raise ConfigError(f"serve.selector={s.selector} ranks the samples with the judge ({train.judge.model}), "
                              f"whose key {name} is not set: export it or put it in .env, or use serve.selector=length")
    if s.judged and train.judge.kind in EMBEDDED_JUDGES and train.backend.kind != "embedded":
        raise ConfigError(f"judge={train.judge.kind} uses the embedded model: serve with backend=embedded, or choose "
                          "another judge")
    text = str(schema.step).strip().lower()
    step = resolve_step(run, schema.step, "step")
    follow = text if text in ("latest", "best") else "fixed"
    if s.reload == "auto" and follow == "fixed":
        raise ConfigError(f"serve.reload=auto follows the run's new checkpoints, but step={schema.step} is fixed: use "
                          "step=latest or step=best with it, or leave serve.reload off")
    return ServeConfig(run=run, step=step, follow=follow, train=train, serve=s)


register()

