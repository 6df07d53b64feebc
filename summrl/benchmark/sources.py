"""Where summaries come from: a litellm model (hosted or on an OpenAI-compatible endpoint, including the
checkpoint server), or best-of-N over one of those, ranked by RULER.

Every source gets training's prompt (``summrl.rollout``) and sampling settings.
"""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass
from typing import Optional, Protocol

from summrl.data import Document
from summrl.judges.client import add_request_cost
from summrl.rewards import Missing
from summrl.rewards.ruler import RulerReward
from summrl.prompt import SummaryPrompt
from summrl.secrets import mask_keys


@dataclass
class Summary:
    text: str
    model_calls: int
    model_cost_usd: float  # nan: the price is unknown
    ranking_calls: int = 0  # best-of-N: RULER calls to pick this one

    @classmethod
    def of(cls, record: dict) -> "Summary":
        """One kept in generated.jsonl (rows.KeptSummaries)."""
        return cls(record["text"], record["model_calls"], record["model_cost_usd"], record.get("ranking_calls", 0))


class Candidates(Protocol):
    """Where best-of-N keeps each candidate as it comes back (rows.KeptSummaries, under the rollout's key)."""

    def get(self, index: int) -> Optional[Summary]: ...

    def add(self, index: int, summary: Summary) -> None: ...


class SummaryError(RuntimeError):
    """A model call that failed after its retries (the row stays undone; a rerun retries it). ``model_calls`` and
    ``model_cost_usd``: what it was billed for (an empty reply is paid for; a refused call is not)."""

    def __init__(self, message: str, model_calls: int = 0, model_cost_usd: float = 0.0) -> None:
        super().__init__(message)
        self.model_calls, self.model_cost_usd = model_calls, model_cost_usd


@dataclass
class LiteLLMSource:
    model: str  # litellm id, e.g. openrouter/openai/gpt-4o or openai/<served name> with api_base
    prompt: SummaryPrompt
    max_tokens: int
    temperature: float
    timeout_s: float
    max_retries: int
    api_base: Optional[str] = None
    api_key_env: Optional[str] = None
    api_key: Optional[str] = None  # in memory only (the checkpoint server's key)
    local: bool = False  # served on this machine: costs $0
    extra_body: Optional[dict] = None  # what the checkpoint server needs in every request (CheckpointServer)

    async def summarize(self, document: Document) -> Summary:
        import litellm

        key = self.api_key or (os.environ.get(self.api_key_env) if self.api_key_env else None)
        try:
            response = await litellm.acompletion(
                model=self.model, messages=self.prompt.messages(document), max_tokens=self.max_tokens,
                temperature=self.temperature, api_base=self.api_base,
                api_key=key or ("none" if self.api_base else None), timeout=self.timeout_s,
                num_retries=self.max_retries, drop_params=True,  # reasoning models reject some sampling params
                **({"extra_body": self.extra_body} if self.extra_body else {}),
            )
        except Exception as e:
            # the key, every known secret, and a key in a URL (litellm puts gemini/* keys in the request URL as ?key=)
            raise SummaryError(f"{self.model}: {mask_keys(f'{type(e).__name__}: {e}', [key])[:500]}") from None
        cost = 0.0 if self.local else call_cost(response)
        if math.isfinite(cost):  # the caller's share (benchmark.max_cost_usd counts it)
            add_request_cost(cost)
        if not response.choices:  # a 200 with nothing in it (a provider's filter): an IndexError ended the benchmark
            raise SummaryError(f"{self.model}: a reply with no choices", 1, cost)
        # a reply that echoes the key (a broken endpoint): rows, generated.jsonl and W&B keep it
        text = mask_keys(response.choices[0].message.content or "", [key])
        if not text.strip() and not self.local:
            # a reasoning model that spent max_tokens thinking, or a content filter: not a summary to score (an empty
            # one answers every unanswerable question); the row stays undone, and its cost is counted apart. A
            # checkpoint's empty summary is scored.
            raise SummaryError(f"{self.model}: an empty reply (finish_reason={response.choices[0].finish_reason}); "
                               "a reasoning model needs more of trainer.max_summary_tokens (rows are asked with "
                               "one value per folder: raise it with a new benchmark.name, or benchmark such a model "
                               "on its own)", 1, cost)
        return Summary(text=text, model_calls=1, model_cost_usd=cost)


def call_cost(response) -> float:
    import litellm

    usage = getattr(response, "usage", None)
    if not getattr(usage, "prompt_tokens", None) and not getattr(usage, "completion_tokens", None):
        return math.nan  # no usage in the reply: litellm prices it $0, but it was not free
    try:
        return float(litellm.completion_cost(completion_response=response))
    except Exception:  # not in litellm's cost map: unknown, never 0
        return math.nan


@dataclass
class BestOfN:
    """``n`` candidates from ``inner``, ranked by RULER against the rubric; the best is kept (ties: the first)."""

    inner: LiteLLMSource
    n: int
    ruler: RulerReward

    async def summarize(self, document: Document, kept: Optional[Candidates] = None) -> Summary:
        async def candidate(index: int) -> Summary:
            made = kept.get(index) if kept is not None else None
            if made is None:
                made = await self.inner.summarize(document)
                if kept is not None:  # paid for: a sibling's failure, or RULER's, must not throw it away
                    kept.add(index, made)
            return made

        results = await asyncio.gather(*(candidate(i) for i in range(self.n)), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:  # the others are kept: the rerun asks only for the failed ones
            if isinstance(failed, SummaryError):  # what every failed candidate was billed for
                spent = [r for r in results if isinstance(r, SummaryError)]
                raise SummaryError(str(failed), sum(e.model_calls for e in spent),
                                   sum(e.model_cost_usd for e in spent))
            raise failed
        candidates: list[Summary] = results  # type: ignore[assignment]
        texts = [c.text for c in candidates]
        scores = await self.ruler.score_group(document, texts)
        failed = next((s for s in scores if isinstance(s, Missing)), None)
        if failed is not None:
            raise SummaryError(failed.error)
        best = max(range(self.n), key=lambda i: (scores[i].reward, -i))
        return Summary(text=texts[best], model_calls=sum(c.model_calls for c in candidates),
                       model_cost_usd=sum(c.model_cost_usd for c in candidates), ranking_calls=1)
