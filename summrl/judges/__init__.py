"""Judges answer a document's questions from a summary alone and say which answers are correct, and write and
score a document's rubrics (reward=rubric). An LLM judge asks its model (:mod:`summrl.judges.rubrics`); the
lexical judge (judge=lexical, and judge=local's rubric half) writes and scores them offline."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence

from summrl.data import Document
from summrl.errors import ConfigError
from summrl.judges.base import Judge, Rubrics
from summrl.judges.client import JudgeClient
from summrl.judges.lexical import LexicalJudge, readable_rubric
from summrl.judges.llm import LLMJudge
from summrl.keys import missing_model_keys

__all__ = ["Judge", "Rubrics", "build_judge", "check_dataset_rubrics", "missing_keys", "LocalJudge"]


# Judges that write and score rubrics lexically (LexicalJudge): they read only rubrics of their own form.
OFFLINE_RUBRIC_JUDGES = ("lexical", "local")


def check_dataset_rubrics(config: Any, documents: Iterable[Document]) -> None:
    """Refuse, before any model loads, dataset rubrics the configured judge can't score: the offline scorer would
    score each of them 0 for every summary (1 for a flipped negative), a constant reward. Raises ConfigError."""
    if config.kind not in OFFLINE_RUBRIC_JUDGES:
        return
    for document in documents:
        for column, rubrics in (("positive_rubrics", document.positive_rubrics),
                                ("negative_rubrics", document.negative_rubrics)):
            unreadable = [r for r in rubrics or () if not readable_rubric(r)]
            if unreadable:
                raise ConfigError(
                    f"judge={config.kind} scores rubrics lexically and can't read the dataset's {column} "
                    f"{unreadable[0]!r} (document {document.id}): every summary would score the same on it. Use an "
                    "LLM judge for dataset rubrics (judge=embedded offline, judge=openai_compatible or "
                    "judge=gemini_flash), or leave the rubric columns out so that the lexical judge writes its own.")


def missing_keys(config: Any) -> list[str]:
    """The judge's key, where it is not set (checked before anything loads): its api_key_env, or for a hosted litellm
    judge with none named, litellm's variables for its provider ("GEMINI_API_KEY or GOOGLE_API_KEY": one will do)."""
    if config.kind == "litellm":
        missing = missing_model_keys(config)
        return [" or ".join(missing)] if missing else []
    name = getattr(config, "api_key_env", None)
    return [name] if name and not os.environ.get(name) else []


def build_judge(config: Any, endpoint: Any = None) -> Judge:
    """``endpoint`` = (model name, base URL, API key) of the embedded backend, for judge=embedded."""
    if config.kind == "lexical":
        return LexicalJudge(min_recall=config.min_recall)
    if config.kind == "litellm":
        return LLMJudge(JudgeClient(model=config.model, api_key_env=config.api_key_env, api_base=config.api_base,
                                    **_call_settings(config)))
    if config.kind == "embedded":
        return LLMJudge(_embedded_client(config, endpoint))
    if config.kind == "local":
        return LocalJudge(LexicalJudge(min_recall=config.min_recall), _embedded_client(config, endpoint))
    raise ValueError(f"judge.kind={config.kind} is not available yet")


def embedded_endpoint(config: Any, base_url: str, api_key: str) -> tuple[str, str, str, str]:
    """judge=embedded or local's endpoint: the served base model (its name selects no LoRA), and what its replies are
    cached by: the model, its weights and dtype, not the port it is served on this time."""
    model = config.model
    identity = json.dumps({"embedded": model.base_model, "weights": model.weights,
                           "dtype": getattr(config.backend, "dtype", None)}, sort_keys=True)
    return model.base_model, base_url, api_key, identity


def _embedded_client(config: Any, endpoint: Any):
    if endpoint is None:
        raise ValueError(f"judge={config.kind} needs the embedded backend's endpoint")
    name, base_url, key, *identity = endpoint
    return JudgeClient(model=f"openai/{name}", api_base=base_url, api_key=key, structured=True,
                       cache_identity=identity[0] if identity else None, **_call_settings(config))


def _call_settings(config: Any) -> dict[str, Any]:
    """How every LLM judge calls: concurrency, timeout, retries with backoff, reply cache."""
    return {key: getattr(config, key) for key in
            ("max_concurrency", "timeout_s", "max_retries", "retry_base_s", "retry_max_s", "cache_dir")}


class LocalJudge:
    """judge=local: the lexical judge grades QA and writes and scores rubrics; ``client`` (the embedded model) is
    RULER's judge."""

    def __init__(self, lexical: Any, client: Any) -> None:
        self.lexical, self.client = lexical, client
        self.rubric_writer = lexical.rubric_writer

    async def grade_group(self, texts, questions):
        return await self.lexical.grade_group(texts, questions)

    async def write_rubrics(self, document: Document, max_rubrics: int) -> Rubrics:
        return await self.lexical.write_rubrics(document, max_rubrics)

    async def score_rubrics(self, document: Document, rubrics: Rubrics, summaries: Sequence[str]) -> list[list[float]]:
        return await self.lexical.score_rubrics(document, rubrics, summaries)

    def usage_metrics(self) -> dict[str, float]:
        return self.client.usage.snapshot_and_reset()  # RULER's calls; lexical grading costs nothing
