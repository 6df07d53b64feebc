"""Judges answer a document's questions from a summary alone and say which answers are correct."""

from __future__ import annotations

import os
from typing import Any, Protocol, Sequence, Union

from summrl.data import Question


class Judge(Protocol):
    async def grade_group(self, texts: Sequence[str], questions: Sequence[Question]) -> list[Union[list[bool], Exception]]:
        """For each text, one verdict per question: was it answered correctly from that text alone?
        A text the judge could not grade gets the error instead (a JudgeError)."""
        ...

    def usage_metrics(self) -> dict[str, float]:
        """Calls, tokens and cost since the last call (``judge/*``); empty for offline judges."""
        ...


def missing_keys(config: Any) -> list[str]:
    """Environment variables the judge needs that are not set (checked before anything loads)."""
    name = getattr(config, "api_key_env", None)
    return [name] if name and not os.environ.get(name) else []


def build_judge(config: Any, endpoint: Any = None) -> Judge:
    """``endpoint`` = (model name, base URL, API key) of the embedded backend, for judge=embedded."""
    if config.kind == "lexical":
        from summrl.judges.lexical import LexicalJudge

        return LexicalJudge(min_recall=config.min_recall)
    if config.kind == "litellm":
        from summrl.judges.llm import JudgeClient, LLMJudge

        return LLMJudge(JudgeClient(model=config.model, api_key_env=config.api_key_env, api_base=config.api_base,
                                    **_call_settings(config)))
    if config.kind == "embedded":
        from summrl.judges.llm import LLMJudge

        return LLMJudge(_embedded_client(config, endpoint))
    if config.kind == "local":
        from summrl.judges.lexical import LexicalJudge

        return LocalJudge(LexicalJudge(min_recall=config.min_recall), _embedded_client(config, endpoint))
    raise ValueError(f"judge.kind={config.kind} is not available yet")


def _embedded_client(config: Any, endpoint: Any):
    from summrl.judges.llm import JudgeClient

    if endpoint is None:
        raise ValueError(f"judge={config.kind} needs the embedded backend's endpoint")
    name, base_url, key = endpoint
    return JudgeClient(model=f"openai/{name}", api_base=base_url, api_key=key, structured=True,
                       **_call_settings(config))


def _call_settings(config: Any) -> dict[str, Any]:
    """How every LLM judge calls: concurrency, timeout, retries with backoff, reply cache."""
    return {key: getattr(config, key) for key in
            ("max_concurrency", "timeout_s", "max_retries", "retry_base_s", "retry_max_s", "cache_dir")}


class LocalJudge:
    """judge=local: the lexical judge grades QA; ``client`` (the embedded model) is RULER's judge."""

    def __init__(self, lexical: Judge, client: Any) -> None:
        self.lexical, self.client = lexical, client

    async def grade_group(self, texts, questions):
        return await self.lexical.grade_group(texts, questions)

    def usage_metrics(self) -> dict[str, float]:
        return self.client.usage.snapshot_and_reset()  # RULER's calls; lexical grading costs nothing
