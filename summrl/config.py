"""Typed schemas for every config group, registered in Hydra's ConfigStore, and the one validation pass.

Hydra composes ``conf/`` against these dataclasses (:func:`register_configs`), so an unknown key or a value of the
wrong type fails while it composes, naming the key's full path. Each field's own rule lives in its dataclass's
``__post_init__``; :func:`validate` types the composed config and checks the rules that span groups
(:func:`check`). Errors are :class:`summrl.errors.ConfigError`, one line naming the key and the fix
(:func:`config_error` words Hydra's). Nothing heavy is imported, so a bad value fails in well under 2 s, before any
model, cluster or API is touched.

Groups whose options differ in shape (dataset, judge, reward, backend, logger) have a schema per kind: an option's YAML
starts from ``base_<kind>`` and holds only what differs from its defaults. The ``kind`` field says which schema a
section has; the option chooses it.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
import shlex
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence, Union
from urllib.parse import urlsplit

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from summrl.errors import ConfigError
from summrl.prompt import PROMPTS
from summrl.secrets import SECRET_NAME, name_secret_variables, redact_text, secret_key_name, url_secret

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"  # the config tree Hydra composes


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


# --------------------------------------------------------------------------- model


@dataclass
class LoraConfig:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    # Module names as in the Hugging Face model (Llama/Qwen naming).
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    def __post_init__(self) -> None:
        _require(self.r > 0, "model.lora.r", f"must be > 0, got {self.r}")
        _require(self.alpha > 0, "model.lora.alpha", f"must be > 0, got {self.alpha}")
        _require(0.0 <= self.dropout < 1.0, "model.lora.dropout", f"must be in [0, 1), got {self.dropout}")
        _require(len(self.target_modules) > 0, "model.lora.target_modules", "must name at least one module")


@dataclass
class ModelConfig:
    name: str  # short id, used in run names and W&B tags
    base_model: str  # Hugging Face id; ART records it and GPU backends load it
    # Where the embedded backend reads weights instead of the hub: a local folder, a .gguf file,
    # or "pkg:<python package>/<file>" for weights shipped inside an installed package.
    weights: Optional[str] = None
    lr: float = 5e-5
    lora: LoraConfig = field(default_factory=LoraConfig)
    # What the model needs on a GPU backend (backend=skypilot checks backend.accelerators against it before
    # launch): the memory of each GPU, and how many GPUs (2: ART's dedicated mode, training on GPU 0, vLLM on GPU 1).
    min_gpu_memory_gb: Optional[int] = None
    gpus: int = 1
    # Minutes one GRPO step takes at the trainer's defaults on an H100 (an estimate, for the cost before launch).
    step_minutes: Optional[float] = None
    # vLLM engine args and Unsloth init args that fit this model (ART's _internal_config). backend.local_gpu's own
    # fields and its engine_args are applied on top, so a key they own is refused here.
    engine_args: dict[str, Any] = field(default_factory=dict)
    init_args: dict[str, Any] = field(default_factory=dict)
    # Passed to the chat template wherever a prompt is rendered: rollouts (vLLM, the embedded engine) and training's
    # tokenization alike, so the two see one prompt. Qwen3's hybrid models need {enable_thinking: false} for summaries.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(self.lr > 0, "model.lr", f"must be > 0, got {self.lr} (e.g. model.lr=1e-5)")
        _require(bool(self.base_model), "model.base_model", "must not be empty")
        _require(bool(self.name), "model.name", "must not be empty (it names runs, W&B tags and report rows)")
        _require(self.gpus in (1, 2), "model.gpus",
                 f"must be 1 or 2 (2: ART's dedicated mode; ART 0.5.18 serves on one GPU only), got {self.gpus}")
        _require(self.min_gpu_memory_gb is None or self.min_gpu_memory_gb > 0, "model.min_gpu_memory_gb",
                 f"must be > 0 or null, got {self.min_gpu_memory_gb}")
        _require(self.step_minutes is None or self.step_minutes > 0, "model.step_minutes",
                 f"must be > 0 or null, got {self.step_minutes}")
        for key in ("gpu_memory_utilization", "max_model_len", "enforce_eager", "enable_sleep_mode"):
            _require(key not in self.engine_args, f"model.engine_args.{key}",
                     f"is the backend's to set: backend.local_gpu.{key} (backend.{key} with backend=local_gpu)"
                     if key != "enable_sleep_mode" else "is ART's to set (off in dedicated mode)")
        for key in ("load_in_4bit", "max_seq_length", "model_name"):
            _require(key not in self.init_args, f"model.init_args.{key}",
                     f"is the backend's to set: backend.local_gpu.{key} (backend.{key} with backend=local_gpu)"
                     if key != "model_name" else "is model.base_model")


# --------------------------------------------------------------------------- dataset


SPLIT_SIZE_HELP = "a count (e.g. 91), a fraction of the documents (e.g. 0.9), or all (every document the other split leaves)"


def split_size(value: Any, key: str) -> Union[int, float, str]:
    """A split size as given on the command line, in YAML or through TRAIN_SIZE / VAL_SIZE (always a string): a
    count > 0, a fraction in (0, 1), or ``all``."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "all":
            return "all"
        try:
            value = int(text) if text.lstrip("+-").isdigit() else float(text)
        except ValueError:
            raise ConfigError(f"{key}: must be {SPLIT_SIZE_HELP}; got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}: must be {SPLIT_SIZE_HELP}; got {value!r}")
    if isinstance(value, float) and value.is_integer() and value >= 1:
        value = int(value)
    if isinstance(value, int):
        _require(value > 0, key, f"must be > 0 ({SPLIT_SIZE_HELP}), got {value}")
        return value
    _require(0.0 < value < 1.0, key, f"a fraction must lie in (0, 1) ({SPLIT_SIZE_HELP}), got {value}")
    return value


@dataclass
class SplitConfig:
    """The seeded val/train split every dataset shares: the documents are shuffled with ``seed``, val is the first
    ``val_size`` of them, train the next ``train_size``."""

    seed: int = 80  # Summary-RL's shuffle seed
    train_size: Any = 3500  # SPLIT_SIZE_HELP; conf/dataset/repliqa.yaml reads TRAIN_SIZE
    val_size: Any = 91  # SPLIT_SIZE_HELP; conf/dataset/repliqa.yaml reads VAL_SIZE

    def __post_init__(self) -> None:
        for key, variable in (("train_size", "TRAIN_SIZE"), ("val_size", "VAL_SIZE")):
            try:
                setattr(self, key, split_size(getattr(self, key), f"dataset.{key}"))
            except ConfigError as e:  # the value may have come from the environment (dataset=repliqa reads it)
                given = os.environ.get(variable)
                if given is None or str(getattr(self, key)).strip() != given.strip():
                    raise
                raise ConfigError(f"{e} (from the environment variable {variable}={given!r})") from None
        _require(not (self.train_size == "all" and self.val_size == "all"), "dataset.val_size",
                 "train_size and val_size can't both be all: give val a count or a fraction, e.g. dataset.val_size=0.1")
        fractions = [s for s in (self.train_size, self.val_size) if isinstance(s, float)]
        _require(sum(fractions) <= 1.0, "dataset.train_size",
                 f"the fractions add up to {sum(fractions):g} > 1: lower dataset.train_size or dataset.val_size")


@dataclass
class RepliqaDatasetConfig(SplitConfig):
    """ServiceNow/repliqa: one row per question (5 per document), from the hub or local files in its schema."""

    kind: str = "repliqa"
    name: str = "repliqa"
    # Local parquet/jsonl files in Repliqa's schema, read instead of the hub when set.
    # "pkg:summrl/data/x.jsonl" points inside the installed package.
    files: Optional[list[str]] = None
    hf_path: str = "ServiceNow/repliqa"
    hf_split: str = "repliqa_0"

    # Documents in the hub's splits whose size is known: sizes they can't meet are refused as the config composes,
    # not after a cloud machine was rented and set up to download them
    HUB_DOCUMENTS: ClassVar[dict[tuple[str, str], int]] = {("ServiceNow/repliqa", "repliqa_0"): 3591}

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("name", "hf_path", "hf_split"):  # a run's name and where its data comes from
            _require(bool(getattr(self, key)), f"dataset.{key}", "must not be empty")
        _require(self.files is None or len(self.files) > 0, "dataset.files",
                 "is an empty list, which would read the hub instead: list the files, or dataset.files=null for "
                 f"{self.hf_path}")
        documents = self.HUB_DOCUMENTS.get((self.hf_path, self.hf_split)) if self.files is None else None
        if documents is not None:
            from summrl.data.split import DataError, split_counts

            try:
                split_counts(documents, self.train_size, self.val_size, f"{self.hf_path} {self.hf_split}",
                             env_sizes=self.name == "repliqa")
            except DataError as e:
                raise ConfigError(f"dataset.train_size: {e}") from None


LONG_DOCUMENTS = ("split", "skip", "error")


def _check_long_documents(dataset: Any) -> None:
    _require(dataset.long_documents in LONG_DOCUMENTS, "dataset.long_documents",
             f"must be one of {', '.join(LONG_DOCUMENTS)}, got {dataset.long_documents!r}")
    _require(dataset.max_document_tokens is None or dataset.max_document_tokens > 0, "dataset.max_document_tokens",
             f"must be > 0 or null (no limit), got {dataset.max_document_tokens}")


@dataclass
class QuestionsConfig:
    """Questions for documents that have none (dataset=documents): the judge writes them, with reference answers,
    checks each (kept only if answered correctly from the document and not without it), and caches them on disk."""

    per_document: int = 5
    unanswerable_share: float = 0.2  # as in Repliqa: questions whose reference answer is UNANSWERABLE
    # The open-book/closed-book check; false keeps every written question (not recommended: see README).
    check: bool = True
    cache_dir: str = "~/.cache/summrl/questions"  # keyed by document hash + writer (model, endpoint, prompt) + settings
    confirm: bool = True  # ask on a terminal before paid question writing (the estimate is printed either way)
    max_cost_usd: Optional[float] = None  # a hard budget for question writing; null: none

    def __post_init__(self) -> None:
        _require(self.per_document > 0, "dataset.questions.per_document", f"must be > 0, got {self.per_document}")
        _require(0.0 <= self.unanswerable_share < 1.0, "dataset.questions.unanswerable_share",
                 f"must be in [0, 1), got {self.unanswerable_share}")
        unanswerable = round(self.per_document * self.unanswerable_share)  # as the writer asks for them
        _require(self.per_document - unanswerable >= 1, "dataset.questions.unanswerable_share",
                 f"{self.unanswerable_share} of dataset.questions.per_document={self.per_document} makes all "
                 f"{self.per_document} unanswerable, and a document with no answerable question is left out: lower "
                 "it, or raise per_document")
        _require(self.max_cost_usd is None or self.max_cost_usd >= 0, "dataset.questions.max_cost_usd",
                 f"must be >= 0 or null, got {self.max_cost_usd}")
        _require(bool(self.cache_dir), "dataset.questions.cache_dir", "must name a folder")


@dataclass
class DocumentsDatasetConfig(SplitConfig):
    """Your own documents: a folder of .txt/.md/.html/.pdf files, or one .jsonl/.parquet/.csv file with a row per
    document. Questions come from the questions column when a row has them, otherwise the judge writes them."""

    kind: str = "documents"
    name: str = "documents"
    path: str = MISSING  # a folder, or a .jsonl / .parquet / .csv file
    train_size: Any = "all"
    val_size: Any = 0.1
    # Table columns (a folder's ids are the files' relative paths). A column named here is used when the file has it.
    text_field: str = "text"
    id_field: str = "id"  # absent: the id is the text's hash (stable across reruns and reorderings)
    questions_field: str = "questions"  # a list of {question, answer} per row; UNANSWERABLE as the answer allowed
    positive_rubrics_field: str = "positive_rubrics"
    negative_rubrics_field: str = "negative_rubrics"
    # Longer documents (in the policy's tokens) are split at paragraph boundaries, skipped, or refused; null: no limit.
    max_document_tokens: Optional[int] = 4096
    long_documents: str = "split"  # split | skip | error; never a silent truncation
    questions: QuestionsConfig = field(default_factory=QuestionsConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(bool(str(self.path).strip()), "dataset.path", "must name a folder or a .jsonl/.parquet/.csv file")
        _check_long_documents(self)
        _require(bool(self.text_field), "dataset.text_field", "must name the text column")


@dataclass
class InboxDatasetConfig:
    """Online learning (dataset=inbox): the documents ``summrl.serve`` recorded in this run's ``inbox/`` (serve.record),
    each trained on once, in the order they arrived, continuing the run from its latest checkpoint. The first
    ``val_size`` recorded documents are the online val set (fixed as the inbox grows; never trained on); their questions
    are written as for dataset=documents. trainer.min_new_documents says how many new ones a run needs."""

    kind: str = "inbox"
    name: str = "inbox"
    val_size: int = 4
    max_document_tokens: Optional[int] = 4096
    long_documents: str = "skip"  # split | skip | error (a served document passed serve.max_document_tokens)
    questions: QuestionsConfig = field(default_factory=QuestionsConfig)
    seed: int = 80  # unused: the inbox keeps its order

    def __post_init__(self) -> None:
        _require(self.val_size > 0, "dataset.val_size", f"must be > 0 (the first recorded documents), got {self.val_size}")
        _check_long_documents(self)


# --------------------------------------------------------------------------- trainer


@dataclass
class TrainerConfig:
    max_steps: int = 40
    groups_per_step: int = 10  # documents per step
    rollouts_per_group: int = 10  # summaries per document; GRPO compares them
    eval_every: int = 1  # score the val set every N steps (and at the start and the end)
    val_rollouts_per_doc: int = 2
    max_summary_tokens: int = 1000
    temperature: float = 1.0
    # Val sampling temperature; null = temperature. 0 = greedy val: one deterministic summary per document
    # (it needs val_rollouts_per_doc=1). Val samples are seeded either way (loop.evaluate).
    val_temperature: Optional[float] = None
    max_words: int = 350  # the length rewards read it, and prompt=facts asks for it
    # The summarizer's messages (summrl/prompt.py): summary_rl is Summary-RL's own, word for word (no word limit in
    # it: the QA reward's max_chars is the limit); facts asks for at most max_words words and names the kinds of fact
    # to keep (experiment=local's).
    prompt: str = "summary_rl"
    num_epochs: int = 100  # passes over the train split; max_steps normally ends the run first
    # A rollout whose reward is missing (a judge call failed after its retries) is left out of training.
    # When more than this share of a window of the last `missing_reward_window` rollouts (train and val)
    # have no reward, the run stops, naming the judge, the errors by kind and what to do.
    max_missing_reward_rate: float = 0.2
    missing_reward_window: int = 64
    # dataset=inbox: a run needs at least this many new recorded documents; with fewer it waits up to
    # wait_for_documents_s (0: it does not wait), then ends cleanly (exit 0) without training.
    min_new_documents: int = 1
    wait_for_documents_s: float = 0.0
    # The QA rules val/qa_accuracy is measured with (as reward=qa's max_chars and forbid_han) where the reward has no QA
    # term, or several (ruler, rubric): Summary-RL's, as reward=qa's defaults, so that every reward is measured alike;
    # val_qa_forbid_han=false for Chinese or Japanese documents. A reward with one QA term is measured by it: validation
    # sets these to its settings.
    val_qa_max_chars: Optional[int] = 3000
    val_qa_forbid_han: bool = True

    def __post_init__(self) -> None:
        for key in ("max_steps", "groups_per_step", "rollouts_per_group", "eval_every",
                    "val_rollouts_per_doc", "max_summary_tokens", "max_words", "num_epochs", "missing_reward_window",
                    "min_new_documents"):
            value = getattr(self, key)
            _require(value > 0, f"trainer.{key}", f"must be > 0, got {value}")
        _require(self.rollouts_per_group >= 2, "trainer.rollouts_per_group",
                 f"GRPO compares rollouts within a group, so it needs at least 2, got {self.rollouts_per_group}")
        _require(0.0 <= self.temperature <= 2.0, "trainer.temperature", f"must be in [0, 2], got {self.temperature}")
        _require(self.val_temperature is None or 0.0 <= self.val_temperature <= 2.0, "trainer.val_temperature",
                 f"must be in [0, 2] or null (= trainer.temperature), got {self.val_temperature}")
        _require(self.val_temperature != 0 or self.val_rollouts_per_doc == 1, "trainer.val_rollouts_per_doc",
                 f"greedy val (trainer.val_temperature=0) writes the same summary every time: set "
                 f"trainer.val_rollouts_per_doc=1, got {self.val_rollouts_per_doc}")
        _require(self.prompt in PROMPTS, "trainer.prompt",
                 f"must be one of {', '.join(PROMPTS)} (summrl/prompt.py), got {self.prompt!r}")
        _require(0.0 <= self.max_missing_reward_rate <= 1.0, "trainer.max_missing_reward_rate",
                 f"must be in [0, 1], got {self.max_missing_reward_rate}")
        _require(self.wait_for_documents_s >= 0, "trainer.wait_for_documents_s",
                 f"must be >= 0 (0: no wait), got {self.wait_for_documents_s}")
        _require(self.val_qa_max_chars is None or self.val_qa_max_chars > 0, "trainer.val_qa_max_chars",
                 f"must be > 0 or null, got {self.val_qa_max_chars}")


# --------------------------------------------------------------------------- algorithm


@dataclass
class AlgorithmConfig:
    """The GRPO update: what ART 0.5.18's ``backend.train`` accepts, plus the learning-rate schedule.

    Every default is ART's own (LocalBackend.train, art/loss.py), and summrl.algorithm passes only the
    values that differ from it, so ``algorithm=grpo`` trains exactly as ART does by default.
    """

    name: str = "grpo"  # the preset's name, shown in run names and reports
    loss_fn: str = "cispo"  # cispo (clipped IS weight x log-prob) | ppo (clipped surrogate)
    epsilon: Optional[float] = None  # lower clip of the importance ratio; null = ART's: 1.0 (cispo), 0.2 (ppo)
    epsilon_high: Optional[float] = None  # upper clip; null = ART's: 4.0 (cispo), epsilon (ppo)
    kl_penalty_coef: float = 0.0  # KL-penalized advantages against the reference; 0 = no reference pass
    # null = the base model (LoRA disabled); N = this run's checkpoint N (1 = the SFT checkpoint with sft=)
    kl_penalty_reference_step: Optional[int] = None
    advantage_balance: float = 0.0  # in [-1, 1]: > 0 shrinks negative advantages, < 0 positive ones
    scale_rewards: bool = True  # divide advantages by the group's reward std (false: Dr. GRPO)
    # LocalBackend's older alias of scale_rewards: false is accepted only together with scale_rewards=false
    normalize_advantages: bool = True
    importance_sampling_level: str = "token"  # token | sequence | average | geometric_average
    # Caps the importance ratio (ART 0.5.18 caps every token's, whatever its advantage's sign); null = no cap
    max_negative_advantage_importance_sampling_weight: Optional[float] = None
    # Learning rate of GRPO step s (0-based), from model.lr: during warmup (s < warmup_steps)
    # model.lr x (s + 1) / (warmup_steps + 1), reaching model.lr at s = warmup_steps; then constant, or
    # linear/cosine decay reaching min_lr_ratio x model.lr at the last step (max_steps - 1).
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        _require(bool(self.name), "algorithm.name", "must not be empty (it names runs and report rows)")
        _require(self.loss_fn in ("cispo", "ppo"), "algorithm.loss_fn",
                 f"must be cispo or ppo (ART 0.5.18's losses), got {self.loss_fn!r}")
        _require(self.epsilon is None or self.epsilon > 0, "algorithm.epsilon",
                 f"must be > 0 or null (ART's default), got {self.epsilon}")
        _require(self.epsilon_high is None or self.epsilon_high > 0, "algorithm.epsilon_high",
                 f"must be > 0 or null (ART's default), got {self.epsilon_high}")
        _require(self.kl_penalty_coef >= 0, "algorithm.kl_penalty_coef",
                 f"must be >= 0 (0 disables the KL penalty), got {self.kl_penalty_coef}")
        _require(self.kl_penalty_reference_step is None or self.kl_penalty_reference_step >= 0,
                 "algorithm.kl_penalty_reference_step", f"must be >= 0 or null, got {self.kl_penalty_reference_step}")
        _require(self.kl_penalty_reference_step is None or self.kl_penalty_coef > 0,
                 "algorithm.kl_penalty_reference_step",
                 f"is {self.kl_penalty_reference_step} but algorithm.kl_penalty_coef is 0, so no KL penalty is "
                 f"computed: set algorithm.kl_penalty_coef > 0 (e.g. algorithm=grpo_kl) or leave it null")
        _require(self.normalize_advantages or not self.scale_rewards, "algorithm.normalize_advantages",
                 "false turns off scale_rewards (LocalBackend's alias), but algorithm.scale_rewards is true: "
                 "set algorithm.scale_rewards=false (the one setting for this) and leave normalize_advantages "
                 "at true")
        _require(-1.0 <= self.advantage_balance <= 1.0, "algorithm.advantage_balance",
                 f"must be in [-1, 1], got {self.advantage_balance}")
        _require(self.importance_sampling_level in ("token", "sequence", "average", "geometric_average"),
                 "algorithm.importance_sampling_level",
                 f"must be token, sequence, average or geometric_average, got {self.importance_sampling_level!r}")
        w = self.max_negative_advantage_importance_sampling_weight
        _require(w is None or w > 0, "algorithm.max_negative_advantage_importance_sampling_weight",
                 f"must be > 0 or null, got {w}")
        _require(self.lr_schedule in ("constant", "linear", "cosine"), "algorithm.lr_schedule",
                 f"must be constant, linear or cosine, got {self.lr_schedule!r}")
        _require(self.warmup_steps >= 0, "algorithm.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        _require(0.0 <= self.min_lr_ratio <= 1.0, "algorithm.min_lr_ratio",
                 f"must be in [0, 1], got {self.min_lr_ratio}")


# The fields that are summrl's (not backend.train arguments).
SCHEDULE_FIELDS = ("name", "lr_schedule", "warmup_steps", "min_lr_ratio")
# backend.train arguments a backend does not accept, and whose train() that is. skypilot runs local_gpu remotely.
UNSUPPORTED: dict[str, set[str]] = {
    "local_gpu": set(),
    "skypilot": set(),
    # ServerlessBackend.train has no KL penalty and no normalize_advantages alias (use scale_rewards).
    "serverless": {"kl_penalty_coef", "kl_penalty_reference_step", "normalize_advantages"},
    "embedded": set(),
}
TRAIN_OF = {"local_gpu": "ART 0.5.18's LocalBackend.train", "skypilot": "ART 0.5.18's LocalBackend.train",
            "serverless": "ART 0.5.18's ServerlessBackend.train", "embedded": "summrl's embedded backend"}
_DEFAULTS = AlgorithmConfig()


def changed_knobs(algorithm: AlgorithmConfig) -> dict[str, Any]:
    """The backend.train arguments whose value differs from ART's default."""
    return {
        f.name: getattr(algorithm, f.name)
        for f in fields(AlgorithmConfig)
        if f.name not in SCHEDULE_FIELDS and getattr(algorithm, f.name) != getattr(_DEFAULTS, f.name)
    }


def check_backend_support(algorithm: AlgorithmConfig, backend: str) -> None:
    for knob in sorted(changed_knobs(algorithm)):
        if knob in UNSUPPORTED.get(backend, set()):
            raise ConfigError(f"algorithm.{knob}: backend={backend} does not support it ({TRAIN_OF[backend]} "
                              f"has no such setting); leave it at its default or use another backend")


# --------------------------------------------------------------------------- judge

# Judges that run on this machine: no key, no network, no bill, nothing to confirm.
FREE_JUDGES = ("lexical", "embedded", "local")
# Judges whose LLM is the embedded model (judge=local grades QA lexically and asks it only for RULER).
EMBEDDED_JUDGES = ("embedded", "local")


def _check_calls(client: Any, at: str) -> None:
    """The call settings every LLM client has (judge, teacher): a semaphore of 0 would wait forever, a negative
    backoff would retry at once."""
    _require(client.max_concurrency > 0, f"{at}.max_concurrency", f"must be > 0, got {client.max_concurrency}")
    # "" read as off, silently: a resumed run then paid again for every reply it had cached
    _require(getattr(client, "cache_dir", None) != "", f"{at}.cache_dir",
             "is empty: name a folder, or null to keep no cache of replies")
    _require(client.timeout_s > 0, f"{at}.timeout_s", f"must be > 0, got {client.timeout_s}")
    _require(client.max_retries >= 0, f"{at}.max_retries", f"must be >= 0, got {client.max_retries}")
    for key in ("retry_base_s", "retry_max_s"):
        _require(getattr(client, key) >= 0, f"{at}.{key}", f"must be >= 0, got {getattr(client, key)}")
    check_api_base(getattr(client, "api_base", None), f"{at}.api_base")


def check_api_base(url: Optional[str], at: str, example: str = "http://localhost:8000/v1") -> None:
    """An OpenAI-compatible server's base URL: http(s)://host[:port][/path]. One without its scheme (localhost:8000/v1)
    was taken, and every call failed as a connection error after the model loaded and val ran, retried and backed off,
    with "rerun the same command" for a fix."""
    if url is None or str(url).startswith("${"):
        return
    try:
        parts = urlsplit(str(url))
        fine = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        fine = False
    _require(fine, at, f"must be an http:// or https:// URL with a host, e.g. {example}; "
                       f"got {redact_text(str(url))!r}")


def bucket_problem(bucket: Optional[str], at: str) -> Optional[str]:
    """An S3 bucket given as a URL or a path (s3://b, b/runs): boto3 refused it only at the first request, on a rented
    cluster after its setup, or as "can't reach S3". ``at`` names where it came from; a name from $BACKUP_BUCKET
    travels as a secret, so the message does not echo it."""
    if bucket is None or str(bucket).startswith("${"):
        return None
    name = str(bucket)
    if name and not any(c in name for c in "/: \t") and len(name) <= 255:
        return None
    shown = "" if at.startswith("$") else f" {name!r}"
    return (f"{at} is{shown} not a bucket name: give the bucket's name alone, e.g. my-bucket (a folder within it is "
            "storage.prefix)")


@dataclass
class LexicalJudgeConfig:
    """Offline, deterministic judge: checks the gold answer's content words against the summary."""

    kind: str = "lexical"
    # An answerable question counts as answered when at least this fraction of its gold
    # answer's content words occur in the summary.
    min_recall: float = 0.6

    def __post_init__(self) -> None:
        _require(0.0 < self.min_recall <= 1.0, "judge.min_recall", f"must be in (0, 1], got {self.min_recall}")


@dataclass
class LLMJudgeConfig:
    """A judge reached through litellm (hosted, OpenAI-compatible, or the embedded model)."""

    kind: str = "litellm"
    model: str = "gemini/gemini-2.5-flash"  # any litellm model id
    api_key_env: Optional[str] = None  # the variable holding the key; the key itself is never in config
    api_base: Optional[str] = None
    max_concurrency: int = 20
    timeout_s: float = 60.0  # per call
    max_retries: int = 5  # on 429, 5xx, timeouts, malformed JSON and wrong shapes; backoff with jitter
    retry_base_s: float = 1.0
    retry_max_s: float = 30.0  # the longest wait before a retry, a server's Retry-After included
    cache_dir: Optional[str] = "~/.cache/summrl/judge"  # replies cached on disk; null disables

    def __post_init__(self) -> None:
        _require(bool(self.model), "judge.model", "must name a litellm model id, e.g. gemini/gemini-2.5-flash")
        _check_calls(self, "judge")


@dataclass
class EmbeddedJudgeConfig:
    """The embedded model with base weights (no LoRA) as an LLM judge, on the embedded backend's endpoint.
    Its JSON replies are decoded under a grammar (xgrammar), so they are valid by construction."""

    kind: str = "embedded"
    max_concurrency: int = 8
    timeout_s: float = 600.0
    max_retries: int = 2
    retry_base_s: float = 1.0
    retry_max_s: float = 30.0
    cache_dir: Optional[str] = "~/.cache/summrl/judge"

    def __post_init__(self) -> None:
        _check_calls(self, "judge")


@dataclass
class LocalJudgeConfig(EmbeddedJudgeConfig):
    """The offline pair that lets every reward run on a laptop: the lexical judge grades QA (fast, deterministic)
    and the embedded model, with base weights, is RULER's judge. The other fields configure the embedded model."""

    kind: str = "local"
    min_recall: float = 0.6  # the lexical judge's threshold (see LexicalJudgeConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(0.0 < self.min_recall <= 1.0, "judge.min_recall", f"must be in (0, 1], got {self.min_recall}")


# --------------------------------------------------------------------------- reward


@dataclass
class QARewardConfig:
    kind: str = "qa"
    # Summary-RL scored 0 for a summary over 3000 characters or with Han characters.
    max_chars: Optional[int] = 3000
    forbid_han: bool = True
    include_unanswerable: bool = True

    def __post_init__(self) -> None:
        _require(self.max_chars is None or self.max_chars > 0, "reward.max_chars",
                 f"must be > 0 or null, got {self.max_chars}")


@dataclass
class RulerRewardConfig:
    """ART's RULER: the judge ranks a group's summaries against each other with this rubric."""

    kind: str = "ruler"
    rubric: str = (
        "A good summary is faithful to the document, dense with its concrete facts (names, dates, numbers, places), "
        "covers what a reader would ask about, and stays under the word limit."
    )

    def __post_init__(self) -> None:
        _require(bool(self.rubric.strip()), "reward.rubric", "must not be empty")


@dataclass
class RubricRewardConfig:
    """Per-document positive and negative rubrics scored in [0, 1]; the reward is their weighted mean with the
    negatives flipped (1 - s). Rubrics come from the dataset's positive_rubrics / negative_rubrics columns, or an
    LLM judge writes them once per document (cached); judge=lexical or local writes and scores them lexically."""

    kind: str = "rubric"
    max_rubrics: int = 8  # per side, when the judge writes them
    positive_weight: float = 1.0  # each positive rubric's weight in the mean
    # each (flipped) negative rubric's weight: 4 makes the offline writer's one negative ("invents a fact") weigh
    # as much as half of its 8 positives
    negative_weight: float = 4.0
    cache_dir: Optional[str] = "~/.cache/summrl/rubrics"  # written rubrics, per document hash + judge + prompt version

    def __post_init__(self) -> None:
        _require(self.max_rubrics > 0, "reward.max_rubrics", f"must be > 0, got {self.max_rubrics}")
        for key in ("positive_weight", "negative_weight"):
            _require(getattr(self, key) >= 0, f"reward.{key}", f"must be >= 0, got {getattr(self, key)}")
        _require(self.positive_weight + self.negative_weight > 0, "reward.positive_weight",
                 "must be > 0 when reward.negative_weight is 0 (the rubrics would weigh nothing)")
        # "" read as off, silently, as judge.cache_dir's: every run paid again for the rubrics it had written
        _require(self.cache_dir != "", "reward.cache_dir",
                 "is empty: name a folder, or null to keep no written rubrics")


LENGTH_SHAPES = ("hard", "linear", "quadratic")


@dataclass
class LengthRewardConfig:
    """A term of reward=weighted: 0 within trainer.max_words, -over (linear) or -over**2 (quadratic) beyond it,
    with over = the relative overshoot, times its weight (the penalty's strength). hard multiplies the other terms'
    sum by 0 beyond the limit (by 1 within it): such a summary scores 0 in total; its weight is not used."""

    kind: str = "length"
    shape: str = "linear"

    def __post_init__(self) -> None:
        _require(self.shape in LENGTH_SHAPES, "reward.shape",
                 f"must be one of {', '.join(LENGTH_SHAPES)}, got {self.shape!r}")


@dataclass
class LengthPenalizedRewardConfig:
    """reward=length_penalized, kept in its original keys: a base reward (with its defaults) minus a penalty for
    words beyond trainer.max_words. Validation turns it into reward=weighted: {<base>: weight 1, length: {shape,
    weight: strength}}. For other base settings or more terms, compose reward=weighted."""

    kind: str = "length_penalized"
    base: str = "qa"  # qa | ruler
    shape: str = "linear"  # hard (0 beyond the limit; strength not used) | linear | quadratic, in the overshoot
    strength: float = 1.0

    def __post_init__(self) -> None:
        _require(self.base in ("qa", "ruler"), "reward.base", f"must be qa or ruler, got {self.base!r}")
        _require(self.shape in LENGTH_SHAPES, "reward.shape",
                 f"must be one of {', '.join(LENGTH_SHAPES)}, got {self.shape!r}")
        _require(self.strength >= 0, "reward.strength", f"must be >= 0, got {self.strength}")

    def as_weighted(self) -> "WeightedRewardConfig":
        base = KIND_SCHEMAS["reward"][self.base]()
        weighted = WeightedRewardConfig(terms={self.base: WeightedTerm(1.0, base), "length": WeightedTerm(
            self.strength, LengthRewardConfig(shape=self.shape))})
        # the keys the user set and sweeps (reward.strength=...), for the W&B config and result.json beside the terms
        weighted.as_given = {"base": self.base, "shape": self.shape, "strength": self.strength}
        return weighted


@dataclass
class WeightedTerm:
    weight: float
    reward: Any  # one of TERM_SCHEMAS' configs


@dataclass
class WeightedRewardConfig:
    """A weighted sum of rewards: ``terms`` maps a term's name (logged as <split>/reward_<name>) to a reward config plus
    its ``weight``, e.g. {qa: {kind: qa, weight: 1.0}, rubric: {kind: rubric, weight: 0.2}}. Each term's kind picks
    its schema (TERM_SCHEMAS), which Hydra can't express in a dict, so the terms are typed here: after
    construction each is a :class:`WeightedTerm`."""

    kind: str = "weighted"
    terms: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.terms and all(isinstance(t, WeightedTerm) for t in self.terms.values()):
            return  # already typed (as_weighted)
        _require(len(self.terms) > 0, "reward.terms",
                 "must name at least one term, e.g. '+reward.terms={qa: {kind: qa, weight: 1.0}, "
                 "rubric: {kind: rubric, weight: 0.2}}'")
        self.terms = {str(name): _typed_term(f"reward.terms.{name}", term) for name, term in self.terms.items()}
        factors = [name for name, term in self.terms.items() if _is_factor(term.reward)]
        if len(factors) == len(self.terms):
            raise ConfigError(f"reward.terms.{factors[0]}.shape: hard multiplies the other terms' sum (by 0 beyond "
                              "trainer.max_words), and there is none: add one, e.g. +reward.terms.qa.kind=qa")
        # every summary would score 0: GRPO's advantages are all 0 and the run trains nothing, paying for the judge
        weightless = [name for name, term in self.terms.items() if not _is_factor(term.reward) and term.weight == 0]
        if len(weightless) + len(factors) == len(self.terms):
            raise ConfigError(f"{', '.join(f'reward.terms.{name}.weight' for name in weightless)}: every term's "
                              f"weight is 0, so every summary scores 0 and nothing is learned: give a term a nonzero "
                              f"weight, e.g. reward.terms.{weightless[0]}.weight=1.0")


def _typed_term(key: str, term: Any) -> WeightedTerm:
    """One term of reward=weighted: its reward config (by kind) plus a numeric weight."""
    if isinstance(term, WeightedTerm):
        return term
    _require(isinstance(term, (dict, DictConfig)), key, f"must be a mapping with kind and weight, got {term!r}")
    body = dict(term)
    weight = body.pop("weight", 1.0)
    _require(isinstance(weight, (int, float)) and not isinstance(weight, bool), f"{key}.weight",
             f"must be a number, got {weight!r}")
    # (a negative weight is allowed: a term the sum counts against, e.g. a rubric of things to avoid; reward_range
    # bounds it)
    _require(math.isfinite(weight), f"{key}.weight", f"must be a finite number, got {weight!r}")
    kind = body.get("kind")
    _require(kind in TERM_SCHEMAS, f"{key}.kind", f"must be one of {', '.join(TERM_SCHEMAS)}, got {kind!r}")
    try:
        reward = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TERM_SCHEMAS[kind]), body))
    except OmegaConfBaseException as e:
        raise config_error(e, prefix=key) from None
    except ConfigError as e:  # the schemas' own checks name reward.<key>: point at the term instead
        message = str(e)
        raise ConfigError(f"{key}.{message[len('reward.'):]}" if message.startswith("reward.") else message) from None
    return WeightedTerm(weight=float(weight), reward=reward)


# --------------------------------------------------------------------------- backend

# The max_lora_rank values vLLM's LoRAConfig accepts (MaxLoRARanks, vllm/config/lora.py): any other exits its runtime
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass
class EmbeddedBackendConfig:
    """ART Backend that trains LoRA in-process and serves it on a loopback OpenAI endpoint."""

    kind: str = "embedded"
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "float32"  # float32 | bfloat16 | float16
    num_threads: Optional[int] = None  # torch intra-op threads; null = torch's default
    max_batch_size: int = 64  # concurrent requests (rows) merged into one generate call
    batch_window_ms: float = 100.0  # a batch closes when no request arrived for this long (or 0.5 s after its first)
    packed_sequence_length: Optional[int] = None  # null: the longest packed group, rounded up to 128
    # JSON replies (response_format) are grammar-constrained; free-text strings are capped at this many
    # characters so that a small model's reply always closes (see engine.bound_strings).
    json_max_string_chars: int = 300

    def __post_init__(self) -> None:
        _require(self.dtype in ("float32", "bfloat16", "float16"), "backend.dtype",
                 f"must be one of float32, bfloat16, float16, got {self.dtype!r}")
        _require(self.num_threads is None or self.num_threads > 0, "backend.num_threads",
                 f"must be > 0 or null (torch's default), got {self.num_threads}")
        _require(self.max_batch_size > 0, "backend.max_batch_size", f"must be > 0, got {self.max_batch_size}")
        _require(self.batch_window_ms >= 0, "backend.batch_window_ms", f"must be >= 0, got {self.batch_window_ms}")
        _require(re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device) is not None, "backend.device",
                 f"must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")
        _require(self.packed_sequence_length is None or self.packed_sequence_length > 0,
                 "backend.packed_sequence_length", f"must be > 0 or null (the longest packed group, rounded up to "
                 f"128), got {self.packed_sequence_length}")
        _require(self.json_max_string_chars > 0, "backend.json_max_string_chars",
                 f"must be > 0, got {self.json_max_string_chars}")


@dataclass
class LocalGPUBackendConfig:
    """ART's LocalBackend (vLLM for sampling, Unsloth for training) on this machine's GPU; needs the [gpu] extra."""

    kind: str = "local_gpu"
    # vLLM's share of GPU memory (Unsloth trains in the rest). ART issue #452: a 3B model runs out of
    # memory on 24 GB without lowering it.
    gpu_memory_utilization: float = 0.8
    max_model_len: Optional[int] = None  # vLLM context length; null = the model's
    enforce_eager: bool = False  # skip CUDA graphs (less memory, slower sampling)
    load_in_4bit: bool = True  # Unsloth's QLoRA (ART's default)
    max_seq_length: int = 32768  # Unsloth's training context
    # Any other vLLM engine argument (art.dev.EngineArgs), e.g. {max_num_seqs: 64}.
    engine_args: dict[str, Any] = field(default_factory=dict)
    at: ClassVar[str] = "backend"  # where its settings are written (errors name them there)

    def __post_init__(self) -> None:
        at = self.at
        _require(0.0 < self.gpu_memory_utilization <= 1.0, f"{at}.gpu_memory_utilization",
                 f"must be in (0, 1], got {self.gpu_memory_utilization} (e.g. 0.6 on a 24 GB GPU)")
        _require(self.max_model_len is None or self.max_model_len > 0, f"{at}.max_model_len",
                 f"must be > 0 or null, got {self.max_model_len}")
        _require(self.max_seq_length > 0, f"{at}.max_seq_length", f"must be > 0, got {self.max_seq_length}")
        for key in ("gpu_memory_utilization", "max_model_len", "enforce_eager"):
            _require(key not in self.engine_args, f"{at}.engine_args.{key}", f"has its own setting: use {at}.{key}")
        # ART sets it (on in shared mode, off in dedicated) and refuses the other value when vLLM starts on the GPU
        _require("enable_sleep_mode" not in self.engine_args, f"{at}.engine_args.enable_sleep_mode",
                 "is ART's to set (off in dedicated mode)")


@dataclass
class RemoteLocalGPUConfig(LocalGPUBackendConfig):
    """backend=skypilot's settings for the backend=local_gpu it runs on the cloud GPU: backend.local_gpu.<key>."""

    at: ClassVar[str] = "backend.local_gpu"


# Memory of one GPU (GB) by SkyPilot's accelerator name (`sky show-gpus`): what a model preset's
# min_gpu_memory_gb is checked against, offline. An accelerator not listed is not checked.
GPU_MEMORY_GB = {"H100": 80, "H100-SXM": 80, "H100-NVL": 94, "H200": 141, "B200": 180, "GH200": 96,
                 "A100-80GB": 80, "A100": 40, "L40S": 48, "L40": 48, "A6000": 48, "RTXA6000": 48, "A40": 48,
                 "L4": 24, "A10G": 24, "A10": 24, "RTX4090": 24, "RTX3090": 24, "T4": 16, "V100": 16}
RECOVERY_STRATEGIES = ("EAGER_NEXT_REGION", "FAILOVER")  # SkyPilot's managed-job recovery strategies


def parse_accelerators(value: str, key: str) -> tuple[str, int]:
    """NAME or NAME:COUNT (SkyPilot's syntax), as (name, count)."""
    name, _, count = str(value).partition(":")
    _require(bool(name) and (not count or count.isdigit() and int(count) > 0), key,
             f"must be NAME or NAME:COUNT, e.g. H100:1, got {value!r}")
    return name, int(count or 1)


@dataclass
class JobRecoveryConfig:
    """SkyPilot's ``resources.job_recovery`` for a managed job: how it comes back after a preemption or a failure."""

    strategy: str = "EAGER_NEXT_REGION"  # EAGER_NEXT_REGION (SkyPilot's default) | FAILOVER (same region first)
    max_restarts_on_errors: int = 0  # restarts after the job itself fails (preemptions are always recovered)
    recover_on_exit_codes: list[int] = field(default_factory=list)  # exit codes recovered without counting

    def __post_init__(self) -> None:
        _require(self.strategy in RECOVERY_STRATEGIES, "backend.job_recovery.strategy",
                 f"must be one of {', '.join(RECOVERY_STRATEGIES)}, got {self.strategy!r}")
        _require(self.max_restarts_on_errors >= 0, "backend.job_recovery.max_restarts_on_errors",
                 f"must be >= 0, got {self.max_restarts_on_errors}")
        _require(all(0 <= c <= 255 for c in self.recover_on_exit_codes), "backend.job_recovery.recover_on_exit_codes",
                 f"must be exit codes in [0, 255], got {list(self.recover_on_exit_codes)}")
        codes = list(self.recover_on_exit_codes)  # SkyPilot's schema refuses a repeated one, as it launches
        _require(len(set(codes)) == len(codes), "backend.job_recovery.recover_on_exit_codes",
                 f"lists an exit code twice: {codes}; list each once")


@dataclass
class CandidateConfig:
    """One machine the job may run on (backend.candidates): SkyPilot's any_of / ordered entries."""

    accelerators: str = MISSING  # e.g. H100:1, H100-SXM:1, A100-80GB:1
    infra: Optional[str] = None  # runpod, lambda, aws, ...; null: any infra SkyPilot has enabled
    use_spot: Optional[bool] = None  # null: backend.use_spot


FAILOVER = ("cheapest", "ordered")


@dataclass
class SkyPilotBackendConfig:
    """Run this same job on a cloud GPU that SkyPilot provisions, with backend=local_gpu there."""

    kind: str = "skypilot"
    infra: str = "runpod"  # any SkyPilot infra: runpod, aws, gcp/us-central1, k8s, ...
    accelerators: str = "H100:1"  # e.g. H100-SXM:1, A100-80GB:1
    disk_size: int = 100  # GB: the model, vLLM, checkpoints
    # The cluster to create or reuse. In a multirun each job drives its own: <name>-<job number>.
    cluster_name: str = "summrl"
    # RunPod can't stop a cluster, only delete it: after this many idle minutes it is taken down.
    idle_minutes_to_autostop: int = 10
    down_after_run: bool = False  # take the cluster down when the job ends (Summary-RL's DESTROY_AFTER_RUN)
    dry_run: bool = False  # print the task (secrets redacted), validate it offline, launch nothing
    extras: str = "gpu"  # the project's extras installed on the cluster
    setup: Optional[str] = None  # extra shell run after the install, e.g. "pip install flash-attn"
    # The remote backend=local_gpu's settings, e.g. backend.local_gpu.gpu_memory_utilization=0.7
    local_gpu: RemoteLocalGPUConfig = field(default_factory=RemoteLocalGPUConfig)
    # A managed job (sky.jobs.launch): SkyPilot's jobs controller provisions it, recovers it after a preemption and
    # takes its machine down at the end; the job resumes from the S3 backup (storage.enabled=true). Submits and returns.
    managed: bool = False
    use_spot: bool = False  # spot GPUs (managed jobs only: a spot pod is interrupted without notice)
    spot_fallback: bool = False  # on-demand when no spot capacity: any_of [{use_spot: true}, {use_spot: false}]
    job_recovery: JobRecoveryConfig = field(default_factory=JobRecoveryConfig)
    # Machines to fail over across, instead of infra + accelerators, e.g.
    # [{infra: runpod, accelerators: "H100:1"}, {infra: lambda, accelerators: "H100:1"}, {accelerators: "A100-80GB:1"}]
    candidates: list[CandidateConfig] = field(default_factory=list)
    failover: str = "cheapest"  # cheapest: SkyPilot's any_of; ordered: the candidates in their order
    # Refuse a launch (a sweep: the whole sweep) whose estimated GPU + judge cost is over this many $; null: no limit.
    max_cost_usd: Optional[float] = None
    # Minutes before step 0 (provisioning, install, model download) billed at the GPU's price in the estimate.
    setup_minutes: float = 15.0

    def __post_init__(self) -> None:
        _require(bool(self.infra), "backend.infra", "must name a SkyPilot infra, e.g. runpod")
        # the remote job runs backend=local_gpu, which needs ART's backend (vLLM, Unsloth): without it the job failed
        # its own preflight on the cluster, after the paid setup
        extras = [e.strip() for e in self.extras.split(",") if e.strip()]
        with_gpu = shlex.quote("backend.extras=" + "\\,".join(["gpu", *extras]))  # Hydra reads \, as a comma
        _require("gpu" in extras, "backend.extras",
                 f"must include gpu (ART's GPU backend, which the remote job runs), got {self.extras!r}: e.g. "
                 f"{with_gpu}")
        parse_accelerators(self.accelerators, "backend.accelerators")
        for i, c in enumerate(self.candidates):
            parse_accelerators(c.accelerators, f"backend.candidates.{i}.accelerators")
        _require(self.failover in FAILOVER, "backend.failover",
                 f"must be cheapest (SkyPilot's any_of) or ordered, got {self.failover!r}")
        # settings the task would drop without a word: the machine is the candidates' when they are given
        if self.candidates:
            for key in ("infra", "accelerators"):
                value, default = getattr(self, key), getattr(SkyPilotBackendConfig, key)
                _require(value == default, f"backend.{key}",
                         f"is {value}, but backend.candidates lists the machines and only they are asked for: put "
                         f"{key}: {value} in a candidate, or leave backend.{key} out")
        _require(self.failover != "ordered" or len(self.candidates) > 1, "backend.failover",
                 f"is ordered, but backend.candidates lists {len(self.candidates)} machines: list two or more to try in "
                 "order, or leave backend.failover out")
        _require(self.managed or self.job_recovery == JobRecoveryConfig(), "backend.job_recovery",
                 "is how SkyPilot recovers a managed job, and this job is not managed: add backend.managed=true, or "
                 "leave backend.job_recovery out")
        spot = self.use_spot or any(c.use_spot for c in self.candidates)
        _require(not spot or self.managed, "backend.use_spot",
                 "a spot pod is interrupted without notice and only a managed job comes back: add backend.managed=true")
        _require(not self.spot_fallback or spot, "backend.spot_fallback",
                 "falls back from spot to on-demand, and no GPU asks for spot: add backend.use_spot=true "
                 "backend.managed=true (spot runs as a managed job)")
        _require(self.max_cost_usd is None or self.max_cost_usd >= 0, "backend.max_cost_usd",
                 f"must be >= 0 or null (no limit), got {self.max_cost_usd}")
        _require(self.setup_minutes >= 0, "backend.setup_minutes", f"must be >= 0, got {self.setup_minutes}")
        _require(self.disk_size > 0, "backend.disk_size", f"must be > 0, got {self.disk_size}")
        _require(self.idle_minutes_to_autostop >= 0, "backend.idle_minutes_to_autostop",
                 f"must be >= 0, got {self.idle_minutes_to_autostop}")
        _require(bool(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", self.cluster_name)), "backend.cluster_name",
                 f"must be lowercase letters, digits and '-', starting with a letter, got {self.cluster_name!r}")


@dataclass
class ServerlessBackendConfig:
    """ART's ServerlessBackend (W&B Training): sampling and training run on W&B's GPUs; needs WANDB_API_KEY."""

    kind: str = "serverless"
    base_url: Optional[str] = None  # null = W&B's default endpoint

    def __post_init__(self) -> None:
        check_api_base(self.base_url, "backend.base_url")


# --------------------------------------------------------------------------- storage


@dataclass
class StorageConfig:
    """S3 backup of each run's checkpoints and history, and resume from it on a fresh machine."""

    enabled: bool = True
    bucket: Optional[str] = None  # null = $BACKUP_BUCKET (environment or .env)
    prefix: str = "summrl"  # objects live under s3://<bucket>/<prefix>/<project>/<run name>/
    endpoint_url: Optional[str] = None  # S3-compatible stores: R2, MinIO, ...
    region: Optional[str] = None  # null = boto3's default (AWS_DEFAULT_REGION)
    backup_every: int = 1  # steps between backups (the last step is always backed up)
    create_bucket: bool = True  # create the bucket when it does not exist
    restore: bool = True  # a run with no local checkpoint resumes from the latest complete backup

    def __post_init__(self) -> None:
        _require(self.backup_every > 0, "storage.backup_every", f"must be > 0, got {self.backup_every}")
        _require(not self.prefix.startswith("/") and not self.prefix.endswith("/"), "storage.prefix",
                 f"must not start or end with '/', got {self.prefix!r}")
        check_api_base(self.endpoint_url, "storage.endpoint_url", "http://localhost:9000")
        problem = bucket_problem(self.bucket, "storage.bucket")
        if problem:
            raise ConfigError(problem)


# --------------------------------------------------------------------------- logger


@dataclass
class NoLoggerConfig:
    kind: str = "none"


@dataclass
class WandbLoggerConfig:
    """One W&B run per job: group = the sweep, name = the job's overrides, tags = reward/judge/model/backend/algorithm/sft."""

    kind: str = "wandb"
    project: str = "summrl"
    entity: Optional[str] = None
    mode: str = "auto"  # auto: $WANDB_MODE if set, else online when WANDB_API_KEY is set, offline otherwise
    log_samples: bool = True  # a table of val summaries with per-question correctness at every eval

    def __post_init__(self) -> None:
        _require(self.mode in ("auto", "online", "offline"), "logger.mode",
                 f"must be one of auto, online, offline, got {self.mode!r}")
        _require(bool(self.project), "logger.project", "must name a W&B project")
        _require(self.entity is None or bool(self.entity), "logger.entity",
                 "must name a W&B team or user, or be null (your default entity), not empty")


# --------------------------------------------------------------------------- sft (#13)


@dataclass
class TeacherConfig:
    """The model that writes SFT summaries for sft=distill: any litellm id, or an OpenAI-compatible endpoint."""

    model: Optional[str] = None  # e.g. gemini/gemini-2.5-pro, gpt-4.1, openai/<served name> with api_base
    api_base: Optional[str] = None
    api_key_env: Optional[str] = None  # the variable holding the key; the key itself is never in config
    max_concurrency: int = 8
    timeout_s: float = 120.0  # per call
    max_retries: int = 5  # on 429, 5xx and timeouts (an empty reply: once); backoff with jitter, Retry-After honoured
    retry_base_s: float = 1.0
    retry_max_s: float = 30.0
    # A hard budget for the teacher's calls in one invocation, retries included: an estimate over it is refused before
    # any call, and the collection stops once a call would pass it (what was written is kept). null: none.
    max_cost_usd: Optional[float] = None

    def __post_init__(self) -> None:
        _check_calls(self, "sft.teacher")
        _require(self.max_cost_usd is None or self.max_cost_usd >= 0, "sft.teacher.max_cost_usd",
                 f"must be >= 0 or null (no limit), got {self.max_cost_usd}")


@dataclass
class SFTConfig:
    """A warm start before GRPO: collect summaries (a teacher's, or the policy's own best), fine-tune, then RL."""

    kind: str = "none"  # none | distill | best_of_n
    samples_per_doc: int = 4  # summaries written per train document
    # Filter by the run's reward: keep those >= min_reward, or (min_reward null) the top_k of each document.
    min_reward: Optional[float] = None
    top_k: Optional[int] = 1
    # A summary cut off at trainer.max_summary_tokens is not kept: an SFT sample is a finished turn, its end-of-turn
    # token trained, so a cut one teaches the model to stop mid-sentence. true keeps them (a small model that never
    # ends within the limit, e.g. experiment=sft_ablation_local's 64 tokens).
    keep_cut_off: bool = False
    max_docs: Optional[int] = None  # collect from at most this many train documents (null: all)
    epochs: int = 1
    lr: float = 5e-5
    batch_size: int = 4
    confirm: bool = True  # ask before paid teacher calls (the estimated cost is printed either way)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)

    def __post_init__(self) -> None:
        _require(self.kind in ("none", "distill", "best_of_n"), "sft.kind",
                 f"must be one of none, distill, best_of_n (sft=none|distill|best_of_n), got {self.kind!r}")
        _require(self.samples_per_doc >= 1, "sft.samples_per_doc", f"must be >= 1, got {self.samples_per_doc}")
        for key in ("epochs", "batch_size"):
            _require(getattr(self, key) > 0, f"sft.{key}", f"must be > 0, got {getattr(self, key)}")
        _require(self.lr > 0, "sft.lr", f"must be > 0, got {self.lr}")
        _require(self.max_docs is None or self.max_docs > 0, "sft.max_docs", f"must be > 0 or null, got {self.max_docs}")
        _require(self.min_reward is not None or self.top_k is not None, "sft.top_k",
                 "set sft.min_reward or sft.top_k: one of them filters the samples")
        _require(self.top_k is None or 1 <= self.top_k <= self.samples_per_doc, "sft.top_k",
                 f"must be in [1, sft.samples_per_doc={self.samples_per_doc}], got {self.top_k}")
        # top_k defaults to 1, so only a larger one can be told from the default: that one would be ignored
        _require(self.min_reward is None or self.top_k is None or self.top_k == 1, "sft.top_k",
                 f"is {self.top_k}, but sft.min_reward={self.min_reward} keeps every sample at or above it and top_k "
                 "is not used: set one of them (sft.top_k=null, or sft.min_reward=null)")
        if self.kind == "distill":
            _require(bool(self.teacher.model), "sft.teacher.model",
                     "sft=distill needs a teacher: sft.teacher.model=<litellm id> (e.g. gemini/gemini-2.5-pro), "
                     "or openai/<name> with sft.teacher.api_base=http://host:8000/v1")


# --------------------------------------------------------------------------- run


@dataclass
class RunConfig:
    name: str = MISSING  # ART model name (and W&B run id): one per run; rerunning with it resumes
    dir: Optional[str] = MISSING  # the run folder (Hydra's output folder: null only under --cfg, which makes none)

    def __post_init__(self) -> None:
        _check_folder_name(self.name, "run.name")


def _check_folder_name(value: str, key: str) -> None:
    """A name that becomes one folder of the run's path (art/<project>/models/<run.name>)."""
    _require(bool(value.strip()) and "/" not in value and value not in (".", ".."), key,
             f"must be a non-empty name without '/', got {value!r}")


# Groups whose options differ in shape: each option's YAML starts from its kind's schema, registered in Hydra's
# ConfigStore as <group>/base_<kind> (conf/judge/gemini_flash.yaml: defaults: [base_litellm, _self_]).
KIND_SCHEMAS: dict[str, dict[str, type]] = {
    "dataset": {"repliqa": RepliqaDatasetConfig, "documents": DocumentsDatasetConfig, "inbox": InboxDatasetConfig},
    "judge": {"lexical": LexicalJudgeConfig, "litellm": LLMJudgeConfig, "embedded": EmbeddedJudgeConfig,
              "local": LocalJudgeConfig},
    "reward": {"qa": QARewardConfig, "ruler": RulerRewardConfig, "rubric": RubricRewardConfig,
               "weighted": WeightedRewardConfig, "length_penalized": LengthPenalizedRewardConfig},
    "backend": {"embedded": EmbeddedBackendConfig, "skypilot": SkyPilotBackendConfig,
                "local_gpu": LocalGPUBackendConfig, "serverless": ServerlessBackendConfig},
    "logger": {"none": NoLoggerConfig, "wandb": WandbLoggerConfig},
}
# What a weighted reward's term may be: any reward but another weighted one, or the length penalty.
TERM_SCHEMAS: dict[str, type] = {"qa": QARewardConfig, "ruler": RulerRewardConfig, "rubric": RubricRewardConfig,
                                 "length": LengthRewardConfig}


@dataclass
class Config:
    """The schema of conf/train.yaml (``train_schema`` in Hydra's ConfigStore): Hydra refuses an unknown key or a
    value of the wrong type while it composes. The groups whose options differ in shape are typed by their
    option's own schema (KIND_SCHEMAS); after :func:`validate` each holds one of these dataclasses."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = MISSING
    dataset: Any = MISSING  # RepliqaDatasetConfig | DocumentsDatasetConfig | InboxDatasetConfig
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: Any = MISSING  # QARewardConfig | RulerRewardConfig | RubricRewardConfig | WeightedRewardConfig
    judge: Any = MISSING  # LexicalJudgeConfig | LLMJudgeConfig | EmbeddedJudgeConfig | LocalJudgeConfig
    backend: Any = MISSING  # EmbeddedBackendConfig | SkyPilotBackendConfig | LocalGPUBackendConfig | Serverless...
    logger: Any = MISSING  # NoLoggerConfig | WandbLoggerConfig
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    project: str = "summrl"
    # The training seed: data order, sampling, LoRA init. The val/train split keeps dataset.seed, so the seeds of
    # an ablation are compared on the same val documents.
    seed: int = 80

    def __post_init__(self) -> None:
        _require(0 <= self.seed < 2**32, "seed", f"must be in [0, 2**32 - 1] (numpy's seed range), got {self.seed}")
        _check_folder_name(self.project, "project")


def register_configs() -> None:
    """Put every schema in Hydra's ConfigStore: ``train_schema`` (conf/train.yaml's first default) and each
    kind's ``<group>/base_<kind>``. Called on import, before Hydra composes anything."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=Config)
    for group, schemas in KIND_SCHEMAS.items():
        for kind, schema in schemas.items():
            store.store(group=group, name=f"base_{kind}", node=schema)


def _is_factor(reward: Any) -> bool:
    """A term that multiplies the weighted sum instead of adding to it: the hard length limit."""
    return reward.kind == "length" and reward.shape == "hard"


def reward_kinds(reward: Any) -> set[str]:
    """The kinds a reward config uses: its own, or its terms' for reward=weighted."""
    if reward.kind == "weighted":
        return {term.reward.kind for term in reward.terms.values()}
    return {reward.kind}


# Settings (the last part of a key) that change how a run gets its scores, never the scores: a resume or a comparison
# of runs may differ in them (a cloud job pins reward.cache_dir to the cluster's path).
OPERATIONAL = ("cache_dir", "max_concurrency", "timeout_s", "max_retries", "retry_base_s", "retry_max_s", "confirm",
               "max_cost_usd")
# What a judge's scores depend on besides its replies' content: another of these puts scores on another scale
# (summrl.report's "not on one scale", an online run's val set).
JUDGE_KEYS = ("kind", "model", "min_recall")


def rewards_of_kind(reward: Any, kind: str) -> dict[str, Any]:
    """The rewards of ``kind`` in a reward config, by the path of their settings' keys in an override: ``reward``, or
    ``reward.terms.<name>`` (a term's settings sit beside its weight there)."""
    if reward.kind == "weighted":
        return {f"reward.terms.{name}": term.reward for name, term in reward.terms.items()
                if term.reward.kind == kind}
    return {"reward": reward} if reward.kind == kind else {}



REWARD_BOUNDS = {"qa": (0.0, 1.0), "ruler": (0.0, 1.0), "rubric": (0.0, 1.0)}


def reward_range(reward: Any) -> tuple[float, float]:
    """The lowest and highest reward a (validated) reward config can give: qa, ruler and rubric lie in [0, 1]; a
    linear or quadratic length term in (-inf, 0] (the overshoot is unbounded); a weighted sum adds its terms'
    bounds times their weights, and a hard length term (a factor of 0 or 1) adds 0 to the range."""
    if reward.kind in REWARD_BOUNDS:
        return REWARD_BOUNDS[reward.kind]
    if reward.kind == "length":
        return (0.0, 1.0) if _is_factor(reward) else (-math.inf, 0.0)
    if reward.kind == "weighted":
        low = high = 0.0
        for term in reward.terms.values():
            if _is_factor(term.reward) or term.weight == 0:  # 0 x inf would be nan
                continue
            ends = sorted(term.weight * end for end in reward_range(term.reward))
            low, high = low + ends[0], high + ends[1]
        if any(_is_factor(term.reward) for term in reward.terms.values()):
            low, high = min(low, 0.0), max(high, 0.0)
        return low, high
    raise ValueError(f"reward.kind={reward.kind} has no known range")


# --------------------------------------------------------------------------- errors Hydra raises while composing


def config_error(e: BaseException, prefix: str = "") -> ConfigError:
    """An error Hydra or OmegaConf raised while composing or typing the config, as one ConfigError line that names
    the key's full path, with a "did you mean" hint for an unknown key. ``prefix`` is the path of a node that was
    typed on its own (a weighted reward's term)."""
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
    if not isinstance(cause, OmegaConfBaseException) or not cause.full_key:
        text = " ".join(str(e).split("Config search path")[0].split())  # e.g. an unknown option: Hydra lists them
        # a group this command does not have: Hydra's fix (+experiment=local) failed in turn on serve and export
        if group := re.match(r"Could not override '([\w.]+)'\. No match in the defaults list", text):
            return ConfigError(f"{group[1]}: this command has no such config group (--help lists its groups; serve "
                               "and export read the model and settings the run trained with from its run folder): "
                               "drop it")
        return ConfigError(text)
    key = ".".join(p for p in (prefix, str(cause.full_key)) if p)
    schema = cause.object_type if isinstance(cause.object_type, type) else None
    name = schema.__name__ if schema else "the config"
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        if schema is not None and not is_dataclass(schema):  # a map (reward.terms), or a group left null (serve's)
            kind = cause.parent_node.get("kind") if isinstance(cause.parent_node, DictConfig) else None
            typed = TERM_SCHEMAS.get(kind) if key.startswith("reward.terms.") else None  # a term, typed later
            if typed and key.rsplit(".", 1)[-1] not in {f.name for f in fields(typed)}:
                return unknown_key(key, typed)
            return new_key(key, cause.parent_node, str(e))  # not in the node yet (a term's setting its preset omits)
        return unknown_key(key, schema)
    message = str(cause.msg).splitlines()[0]
    unset = re.search(r"Environment variable '([^']+)' not found", message)  # ${oc.env:X} with X set nowhere
    if unset:
        return ConfigError(f"{key}: reads ${{oc.env:{unset[1]}}}, and {unset[1]} is not set: export it or put it in "
                           f".env (or give a default: ${{oc.env:{unset[1]},<default>}})")
    if isinstance(cause, MissingMandatoryValue):
        return ConfigError(f"{key}: needs a value ({message})")
    return ConfigError(f"{key}: {message} (check the value's type in {name})")


def unknown_key(key: str, schema: Optional[type]) -> ConfigError:
    """``key`` (its full path) is not a field of ``schema``: the error, with the closest field and the valid ones."""
    valid = [f.name for f in fields(schema)] if schema and is_dataclass(schema) else []
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], valid, n=1)
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    hint = f" Did you mean {'.'.join(p for p in (parent, close[0]) if p)}?" if close else ""
    listing = f" Valid keys: {', '.join(valid)}." if valid else ""
    name = schema.__name__ if schema else "the config"
    return ConfigError(f"{key} is not a setting of {name}.{hint}{listing}")


def new_key(key: str, parent: Any, hydra_message: str) -> ConfigError:
    """``key`` is not in an untyped node (a map such as reward.terms, or summrl.serve's judge or backend, null there
    until chosen): Hydra overrides only what exists; ``+`` adds."""
    held = [str(k) for k in parent.keys()] if isinstance(parent, DictConfig) else []
    where = key.rsplit(".", 1)[0] if "." in key else "the config"
    what = f"{where} holds {', '.join(held)}" if held else f"{where} is empty here"
    added = re.search(r"use (\+.+)$", hydra_message, re.M)  # the whole override: a map's value has spaces
    if secret_key_name(key):  # its value is a secret, not to be echoed (and refused once added)
        added = None
    return ConfigError(f"{key} is not in the config ({what}), so it can't be overridden: add it with "
                       f"{shlex.quote(added.group(1)) if added else f'+{key}=<value>'}")


def compose(config_name: str, overrides: list[str], *, return_hydra_config: bool = False) -> DictConfig:
    """Compose conf/<config_name>.yaml in-process (tests, summrl.perf), raising ConfigError as the CLI reports it."""
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name, overrides=overrides, return_hydra_config=return_hydra_config)
    except (HydraException, OmegaConfBaseException) as e:
        raise config_error(e) from None


# --------------------------------------------------------------------------- validation


def _refuse_non_finite(node: Any, path: str) -> None:
    """Every number setting is finite: inf passes the ``> 0`` checks and then made rewards (inf x 0) or the learning
    rate NaN, trained on as if scores; a NaN weight passed a type check."""
    if isinstance(node, float):
        _require(math.isfinite(node), path, f"must be a finite number, got {node}")
    elif is_dataclass(node):
        for f in fields(node):
            _refuse_non_finite(getattr(node, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(node, dict):
        for key, value in node.items():
            _refuse_non_finite(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _refuse_non_finite(value, f"{path}.{i}")


def typed_config(cfg: DictConfig, schema: type) -> Any:
    """A composed config as its schema's dataclasses (train_schema, benchmark_schema): Hydra has checked every key
    and type; the keys ``+key=value`` added and each option's kind are checked here. length_penalized becomes
    reward=weighted."""
    if "hydra" in cfg:  # composed with return_hydra_config (tests, perf): Hydra's own node is not ours to type
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            cfg.pop("hydra")
    refuse_secrets(cfg)
    _refuse_added_keys(cfg, "")
    try:
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise config_error(e) from None
    if not isinstance(config, schema):  # a config composed without its schema (an old conf/ tree)
        raise ConfigError(f"the composed config is not typed by {schema.__name__}: its YAML's defaults must start "
                          "with its schema (train_schema, benchmark_schema)")
    _refuse_non_finite(config, "")
    for group, schemas in KIND_SCHEMAS.items():
        section = getattr(config, group)
        if type(section) not in schemas.values():
            raise ConfigError(f"{group}: the option's YAML must start from its kind's schema, e.g. defaults: "
                              f"[base_{next(iter(schemas))}, _self_]; got {type(section).__name__}")
        _require(section.kind == _default_kind(type(section)), f"{group}.kind",
                 f"is fixed by the option ({group}=...); got {section.kind!r}")
    if isinstance(config.reward, LengthPenalizedRewardConfig):
        config.reward = config.reward.as_weighted()
    return config


VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A key that is also a valid variable name (Gemini's AIza..., Hugging Face's hf_..., GitHub's, AWS's key id), or any
# long run of mixed-case letters and digits with no "_" between words: no variable is named like that, and the key
# is saved with the run.
# backend.setup's shell words ("-" kept: Gemini's keys have them), and a value typed for a key's variable or flag
SHELL_WORD = re.compile(r"[^\s=\"';&|()]+")
TYPED_KEY = re.compile(r"\b[A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD)=[\"']?(?!\$)[^\s\"';&|]+"
                       r"|--(?:token|api[-_]key|password)[= ]+[\"']?(?!\$)[^\s\"';&|]+")


def typed_key(command: str) -> bool:
    """A key typed into a shell command: a word shaped like one, or a literal value given to a key's variable
    (WANDB_API_KEY=...) or flag (--token ...), where ``$VAR`` would read it from the environment."""
    return bool(TYPED_KEY.search(command)) or any(
        KEY_LIKE.fullmatch(w) or re.fullmatch(r"AIza[\w-]{30,}", w) for w in SHELL_WORD.findall(command))


KEY_LIKE = re.compile(r"(AIza|hf_|ghp_|gho_|ghs_|github_pat_|AKIA|ASIA)\w{12,}"
                      r"|(?=[A-Za-z0-9]*[a-z])(?=[A-Za-z0-9]*[A-Z])(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{32,}")
# In a ``*_env`` setting, also a provider's short prefix and a long run (Groq's gsk_..., Fireworks' fw_..., Replicate's
# r8_...) and a long hex key: shaped like variable names, they were taken as one and echoed in "export gsk_...".
ENV_KEY_LIKE = re.compile(rf"{KEY_LIKE.pattern}|[a-z][a-z0-9]{{0,5}}_[A-Za-z0-9]{{20,}}|[0-9a-fA-F]{{32,}}")


def refuse_secrets(cfg: DictConfig, overrides: Sequence[str] = ()) -> None:
    """No secret in the config: Hydra saves it with the run as typed, and it is logged and sent to W&B. A URL that
    carries a credential (user:password@, ?key=) is refused, and so is a ``*_env`` setting that holds something
    other than a variable's name (the key itself, typed in the wrong place); the error names the key, never the
    value. The variables the ``*_env`` settings name are masked from then on (secrets.name_secret_variables).
    ``overrides``: a multirun's, whose swept values are not composed yet when its folder is made."""
    named: list[str] = []

    def fix(path: str) -> str:
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        if path.startswith("storage."):
            return "S3's keys belong in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (the environment or .env)"
        if parent in ("judge", "sft.teacher") or re.fullmatch(r"benchmark\.models\.\d+", parent):  # they name a key's variable
            return f"put the key in an environment variable (or .env) and name it with {parent}.api_key_env"
        return ("put it in an environment variable (or .env) that the tool reads itself, e.g. HF_TOKEN for the "
                "Hugging Face hub")

    def refuse_url(path: str, text: str) -> None:
        reason = url_secret(text)
        if reason:
            raise ConfigError(f"{path}: the URL carries {reason}, and the config is saved with the run, logged and "
                              f"sent to W&B: remove it; {fix(path)}")

    def refuse_typed_secret(path: str, raw: Any) -> None:
        # a key named for a secret (model.init_args.token=hf_...) with the secret itself: saved as typed
        if secret_key_name(path) and isinstance(raw, str) and raw and not raw.startswith("${"):
            if path.startswith("hydra.job.env_set."):  # the job's environment, set from the command line
                raise ConfigError(f"{path}: a secret typed here is saved with the run (.hydra/hydra.yaml): export "
                                  f"{path.rsplit('.', 1)[-1]} in your shell (or put it in .env) instead; the job "
                                  "inherits the environment")
            raise ConfigError(f"{path}: a secret typed into the config is saved with the run, logged and sent to W&B: "
                              "put it in an environment variable (or .env) and refer to it as ${oc.env:THE_VARIABLE}")

    def check(path: str, raw: Any, value: Any) -> None:
        refuse_typed_secret(path, raw)
        if path.endswith("_env") and isinstance(raw, str) and raw.startswith("${"):
            # it resolves to what it names, e.g. the key itself, which the config then saves, logs and sends to W&B
            raise ConfigError(f"{path}: must name the environment variable that holds the key, as it is, not an "
                              f"interpolation: set {path}=MY_KEY")
        if path.endswith("_env") and isinstance(raw, str):
            if not VARIABLE_NAME.fullmatch(raw) or ENV_KEY_LIKE.fullmatch(raw):
                raise ConfigError(f"{path}: must name the environment variable that holds the key (letters, digits "
                                  f"and _), not hold the key itself: export MY_KEY=<the key> and set {path}=MY_KEY")
            named.append(raw)
        for text in {t for t in (raw, value) if isinstance(t, str)}:
            refuse_url(path, text)
        if path == "backend.setup" and isinstance(raw, str) and typed_key(raw):
            # a shell command on the cluster: `huggingface-cli login --token hf_...`
            raise ConfigError("backend.setup: a key typed into the command is saved with the run, logged and sent to "
                              "W&B and SkyPilot: write its variable instead ($HF_TOKEN); the job gets HF_TOKEN, "
                              "WANDB_API_KEY and the judge's key from your environment or .env")

    def walk(node: Any, path: str) -> None:
        keys = range(len(node)) if isinstance(node, ListConfig) else [k for k in node.keys() if path or k != "hydra"]
        for key in keys:
            where = f"{path}.{key}" if path else str(key)
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)) and not child._is_interpolation():
                if not child._is_none() and not child._is_missing():
                    walk(child, where)
                continue
            try:
                value = node[key]  # resolved: ${oc.env:...} included
            except Exception:  # resolved only inside the job (${hydra:...}): its text is still checked
                value = None
            check(where, child._value(), value)

    walk(cfg, "")
    for override in overrides:  # the swept values' URLs (an *_env value is checked once composed, in its job)
        key, _, values = override.lstrip("~+").partition("=")
        refuse_typed_secret(key, values)
        refuse_url(key, values)
        variable = key.removeprefix("hydra.job.env_set.")
        if variable != key and (variable in named or SECRET_NAME.search(variable)) and values and "${" not in values:
            # the variable a *_env setting names (judge.api_key_env=MY_JUDGE_KEY), which no key-like name gave away
            raise ConfigError(f"{key}: a secret typed here is saved with the run (.hydra/hydra.yaml): export "
                              f"{variable} in your shell (or put it in .env) instead; the job inherits the environment")
    name_secret_variables(named)


def typed_entry(cfg: DictConfig, schema: type) -> Any:
    """An entry point's own composed config (conf/serve.yaml, conf/export.yaml) as its schema's dataclass, Hydra's node
    left out. Raises ConfigError (one line) for a wrong type or a missing value."""
    if "hydra" in cfg:
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])  # type: ignore[arg-type]
    refuse_secrets(cfg)
    try:
        entry = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))
    except OmegaConfBaseException as e:
        raise config_error(e) from None
    _refuse_non_finite(entry, "")
    return entry


def validate(cfg: DictConfig) -> Config:
    """Type a composed conf/train.yaml and check the rules that span fields and groups. Raises ConfigError."""
    config = typed_config(cfg, Config)
    check(config)
    return config


def check_val_qa(reward: Any, trainer: TrainerConfig) -> None:
    """A reward with one QA term is val/qa_accuracy's own: trainer.val_qa_* become its settings (so result.json and
    W&B say what val QA read), and another value set for them is refused, naming the term's key."""
    qa = rewards_of_kind(reward, "qa")
    if len(qa) != 1:
        return
    ((path, term),) = qa.items()
    for key in ("max_chars", "forbid_han"):
        value, default = getattr(trainer, f"val_qa_{key}"), getattr(TrainerConfig, f"val_qa_{key}")
        # reward=length_penalized keeps its base's defaults: other base settings need reward=weighted
        # a weighted reward's term holds only the keys its YAML gives: ++ sets the key whether it is there or not
        fix = (f"compose reward=weighted with its QA term's +{path}.{key}={value}"
               if getattr(reward, "as_given", None) else
               f"set {'++' if path.startswith('reward.terms.') else ''}{path}.{key}={value}")
        _require(value in (default, getattr(term, key)), f"trainer.val_qa_{key}",
                 f"is {value}, but val QA is the reward's QA term, with {path}.{key}={getattr(term, key)}: {fix} "
                 f"(or leave trainer.val_qa_{key} out)")
        setattr(trainer, f"val_qa_{key}", getattr(term, key))


def _refuse_added_keys(node: DictConfig, path: str) -> None:
    """Hydra's ``+key=value`` adds a key even to a typed node, and OmegaConf.to_object drops it silently: an
    unknown key is refused here, as Hydra refuses it without the ``+``."""
    schema = OmegaConf.get_type(node)
    valid = {f.name for f in fields(schema)} if schema and is_dataclass(schema) else None
    for key, child in node.items_ex(resolve=False):
        full = f"{path}.{key}" if path else str(key)
        if valid is not None and key not in valid:
            raise unknown_key(full, schema)
        if isinstance(child, DictConfig):
            _refuse_added_keys(child, full)


def _default_kind(schema: type) -> str:
    return next(f.default for f in fields(schema) if f.name == "kind")


def check_skypilot(config: Config) -> None:
    """A managed job resumes only from S3; and the model must fit every GPU the job may land on."""
    b, model = config.backend, config.model
    _require(not b.managed or config.storage.enabled, "backend.managed",
             "a recovered job restarts on a fresh machine and resumes only from the S3 backup: set "
             "storage.enabled=true (with BACKUP_BUCKET), or backend.managed=false")
    _require(not b.managed or config.storage.restore, "storage.restore",
             "false would start every recovery of this managed job again from step 0, paying for the steps the S3 "
             "backup holds: leave it true (to start a run afresh, give it a new run.name)")
    # SkyPilot's rule for a managed job's name, <cluster_name>-<run.name>: its launch refused others with a bare
    # ValueError
    name = f"{b.cluster_name}-{config.run.name}"
    _require(not b.managed or re.fullmatch(r"[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?", name) is not None,
             "run.name", f"{config.run.name!r} can't be part of a managed job's name ({name!r}: SkyPilot takes a "
             "letter, then letters, digits, '-', '_' or '.', ending in a letter or digit): rename the run")
    for key, accelerators in [(f"backend.candidates.{i}.accelerators", c.accelerators)
                              for i, c in enumerate(b.candidates)] or [("backend.accelerators", b.accelerators)]:
        name, count = parse_accelerators(accelerators, key)
        memory = next((gb for gpu, gb in GPU_MEMORY_GB.items() if gpu.lower() == name.lower()), None)  # l4 = L4
        _require(memory is None or model.min_gpu_memory_gb is None or memory >= model.min_gpu_memory_gb, key,
                 f"{accelerators} is too small for model={model.name}: it needs {model.min_gpu_memory_gb} GB per GPU, "
                 f"{name} has {memory} GB; choose a larger GPU (e.g. H100:{model.gpus}) or a smaller model")
        _require(count >= model.gpus, key,
                 f"{accelerators} is too small for model={model.name}: it trains on {model.gpus} GPUs (ART's dedicated "
                 f"mode), got {count}; use {name}:{model.gpus}")


def check(config: Config) -> None:
    """The rules that span fields and groups."""
    check_val_qa(config.reward, config.trainer)
    if "ruler" in reward_kinds(config.reward) and config.judge.kind == "lexical":
        offline = (", judge=embedded, or judge=local (offline: lexical QA grading, the embedded model for RULER)"
                   if config.backend.kind == "embedded" else "")  # the embedded judges run on backend=embedded only
        raise ConfigError("a RULER reward (reward=ruler, or a ruler term or base of the reward) needs an LLM judge, "
                          f"got judge=lexical: use judge=gemini_flash, judge=openai_compatible{offline}")
    if config.judge.kind in EMBEDDED_JUDGES and config.backend.kind != "embedded":
        raise ConfigError(f"judge={config.judge.kind} uses the embedded backend's model; got "
                          f"backend.kind={config.backend.kind}: use backend=embedded or another judge")
    if config.backend.kind == "skypilot":
        check_skypilot(config)
    gpu = {"local_gpu": config.backend, "skypilot": getattr(config.backend, "local_gpu", None)}.get(config.backend.kind)
    if gpu is not None:  # vLLM refuses a request past its context only at the first rollout, on a paid GPU
        r = config.model.lora.r  # and an adapter above every rank it serves when its runtime starts
        _require(r <= VLLM_LORA_RANKS[-1], "model.lora.r",
                 f"is {r}, but vLLM (backend=local_gpu, or skypilot's GPU) serves LoRA ranks up to "
                 f"{VLLM_LORA_RANKS[-1]}: set model.lora.r<={VLLM_LORA_RANKS[-1]}, or use backend=embedded")
        # summrl sets vLLM's max_lora_rank from r; one given in engine_args wins, and vLLM refuses it when it starts
        for at, args in (("model.engine_args", config.model.engine_args), (f"{gpu.at}.engine_args", gpu.engine_args)):
            rank = (args or {}).get("max_lora_rank")
            if rank is not None:
                _require(rank in VLLM_LORA_RANKS and rank >= r, f"{at}.max_lora_rank",
                         f"is {rank}, but vLLM serves only ranks {', '.join(map(str, VLLM_LORA_RANKS))} and this "
                         f"adapter's is model.lora.r={r}: leave it out (summrl sets it from model.lora.r), or set one "
                         f"of those at or above {r}")
        summary = config.trainer.max_summary_tokens
        for key, length in (("max_model_len", gpu.max_model_len), ("max_seq_length", gpu.max_seq_length)):
            _require(length is None or length > summary, f"{gpu.at}.{key}",
                     f"{length} tokens leave no room for the prompt beside trainer.max_summary_tokens ({summary}): "
                     f"raise {gpu.at}.{key}, or lower trainer.max_summary_tokens")
    # Only the embedded engine reads model.weights: vLLM, Unsloth and W&B load model.base_model from the hub, so a
    # GPU run would train other weights than the ones named (and data's token counts would read the named ones).
    _require(config.model.weights is None or config.backend.kind == "embedded", "model.weights",
             f"is {config.model.weights}, which only backend=embedded loads; backend={config.backend.kind} loads "
             f"model.base_model ({config.model.base_model}) from the Hugging Face hub: add model.weights=null, "
             "or use backend=embedded")
    if config.backend.kind == "serverless" and config.model.chat_template_kwargs:
        # ART 0.5.18 sends them only from LocalBackend's model (its _internal_config); W&B's trainer renders without
        raise ConfigError(f"model.chat_template_kwargs={dict(config.model.chat_template_kwargs)}: backend=serverless "
                          "can't apply them (ART 0.5.18's ServerlessBackend sends them with no rollout, and W&B's "
                          "trainer renders the prompts without them), so the model would sample and train on other "
                          "prompts than these: use backend=local_gpu or backend=skypilot for this model")
    if config.backend.kind == "serverless" and config.model.lora != LoraConfig():
        # ART 0.5.18's ServerlessBackend registers model.base_model alone: W&B trains an adapter of its own choosing,
        # so a swept model.lora.r would label identical runs as different
        given = ", ".join(f"{k}={v}" for k, v in asdict(config.model.lora).items() if v != getattr(LoraConfig(), k))
        raise ConfigError(f"model.lora: backend=serverless can't apply {given} (ART 0.5.18's ServerlessBackend sends "
                          "W&B only model.base_model, and W&B Training chooses its own adapter): leave model.lora at "
                          "its defaults, or use backend=local_gpu or backend=skypilot")
    if config.backend.kind == "serverless" and config.storage.enabled:
        raise ConfigError("backend=serverless keeps its checkpoints on W&B, so there is nothing local to back up: "
                          "add storage.enabled=false")
    _require(config.algorithm.warmup_steps < config.trainer.max_steps,
             "algorithm.warmup_steps",
             f"must be < trainer.max_steps ({config.trainer.max_steps}) so that the learning rate reaches model.lr "
             f"(at step warmup_steps), got {config.algorithm.warmup_steps}")
    check_backend_support(config.algorithm, config.backend.kind)
    a = config.algorithm  # a setting that changes nothing would still label a swept arm as different
    _require(a.lr_schedule != "constant" or a.min_lr_ratio == 0.0, "algorithm.min_lr_ratio",
             f"is {a.min_lr_ratio}, but algorithm.lr_schedule=constant never decays: set algorithm.lr_schedule=linear "
             "or cosine, or leave min_lr_ratio at 0")
    _require(a.lr_schedule == "constant" or a.min_lr_ratio < 1.0, "algorithm.min_lr_ratio",
             f"is 1, so algorithm.lr_schedule={a.lr_schedule} never decays: set algorithm.lr_schedule=constant, or "
             "min_lr_ratio below 1")
    _require(config.trainer.temperature > 0, "trainer.temperature",
             "is 0 (greedy): every summary of a group would be the same, and GRPO learns from their differences; "
             "set it > 0 (greedy val is trainer.val_temperature=0)")
    last = config.trainer.max_steps + (config.sft.kind != "none")  # the SFT checkpoint is step 1
    reference = config.algorithm.kl_penalty_reference_step
    # (dataset=inbox continues a run past its own max_steps: any checkpoint it has may be the reference)
    _require(reference is None or reference <= last or config.dataset.kind == "inbox",
             "algorithm.kl_penalty_reference_step",
             f"is {reference}, but this run's last checkpoint is {last} (trainer.max_steps"
             f"{' + the SFT step' if config.sft.kind != 'none' else ''}): name an earlier step, or null for the base model")
    if config.sft.kind != "none" and config.sft.min_reward is not None:
        low, high = reward_range(config.reward)
        _require(config.sft.min_reward <= high, "sft.min_reward",
                 f"{config.sft.min_reward} is unreachable: reward={config.reward.kind} lies in [{low:g}, {high:g}]; "
                 "lower it, or filter by rank with sft.min_reward=null sft.top_k=<k>")
    if config.dataset.kind == "inbox":
        _require(config.sft.kind == "none", "sft", "dataset=inbox continues a trained run on new documents: an SFT "
                 "warm start belongs at a run's start; use sft=none")
        _require(config.backend.kind != "skypilot", "dataset", "dataset=inbox reads this machine's run folder "
                 "(runs/<name>/inbox): train with backend=embedded or backend=local_gpu where the server records")
        # online steps come after trainer.max_steps, where a decaying schedule has reached min_lr_ratio * model.lr
        _require(a.lr_schedule == "constant" or a.min_lr_ratio > 0, "algorithm.lr_schedule",
                 f"is {a.lr_schedule}, which decays to 0 at trainer.max_steps ({config.trainer.max_steps}); "
                 "dataset=inbox trains after it, so every online step would train at learning rate 0: set "
                 "algorithm.lr_schedule=constant (model.lr), or algorithm.min_lr_ratio > 0 to train at that floor")
    else:  # read only by dataset=inbox: elsewhere they would be recorded in result.json and W&B and change nothing
        t = config.trainer
        for key, value, default in (("min_new_documents", t.min_new_documents, 1),
                                    ("wait_for_documents_s", t.wait_for_documents_s, 0.0)):
            _require(value == default, f"trainer.{key}",
                     f"is {value}, but only dataset=inbox reads it (how many newly recorded documents a run needs); "
                     f"got dataset={getattr(config.dataset, 'name', config.dataset.kind)}: remove it, or use "
                     "dataset=inbox")
    # ART 0.5.18's train_sft raises NotImplementedError in dedicated mode: refused before the teacher is paid
    dedicated = config.model.gpus == 2 and config.backend.kind in ("local_gpu", "skypilot")
    _require(config.sft.kind == "none" or not dedicated, "sft", f"sft={config.sft.kind} with model={config.model.name} (model.gpus=2, ART's dedicated mode): ART "
             "0.5.18 can't train SFT in dedicated mode; use sft=none, or a model that trains on one GPU")
    if config.sft.kind == "distill" and config.sft.confirm and config.backend.kind == "skypilot":
        raise ConfigError("sft.confirm: the remote job has no terminal to confirm the teacher's cost in: add "
                          "sft.confirm=false (the plan with its estimate is printed in the job's log)")


register_configs()
