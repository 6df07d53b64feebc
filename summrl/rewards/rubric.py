"""Rubric reward (DR-Tulu's refiner recipe, for summaries): per-document positive and negative rubrics, each
scored in [0, 1]; the reward is their weighted mean with negatives flipped (1 - s), so higher is always better.

Rubrics come from the document's ``positive_rubrics`` / ``negative_rubrics`` dataset columns when it has them,
otherwise a writer makes them once per document and caches them on disk, keyed by the document's hash, the
writer (judge model) and :data:`PROMPT_VERSION`, so reruns and sweeps never pay twice.

- With an LLM judge, the judge writes them (one call per document) and scores a whole group against every
  rubric in one call.
- Offline (judge=lexical or local) a deterministic writer takes positives from the document's numbers, dates and
  names ("Mentions 2021."), with the one negative :data:`INVENTS_FACTS`; the scorer checks them lexically
  (:mod:`summrl.facts`).

A rubric score that can't be had (the judge failed after its retries) leaves the reward missing, never 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from summrl.data import Document
from summrl.facts import facts, invented_facts
from summrl.judges.llm import JudgeClient, JudgeError, ReplyShapeError, list_of, list_schema
from summrl.rewards import Missing, Score

PROMPT_VERSION = "rubric-v1"  # bump when the writer's prompt changes: cached rubrics are then rewritten
# Negative rubrics name the error (scored 1 when the summary makes it) and are flipped: this one is the issue's
# "states no number, date or proper name absent from the document", stated as the error to avoid.
INVENTS_FACTS = "States a number, date or proper name that is absent from the document."
MENTIONS = "Mentions {}."

WRITE_PROMPT = """Write grading rubrics for summaries of this document.
Positive rubrics: up to {n} specific facts a good summary keeps (one short sentence each).
Negative rubrics: up to {n} specific errors a summary must avoid, e.g. a number, date or name that is not in the document, or a claim the document contradicts.

<document>
{document}
</document>

Reply in JSON: {{"positive_rubrics": [strings], "negative_rubrics": [strings]}}"""

SCORE_PROMPT = """Score each summary against each rubric: 1 when the rubric's statement is true of the summary, 0 when it is false, in between when partly true.

Rubrics:
{rubrics}

{summaries}

Reply in JSON: {{"rubric_scores": [one list of {m} numbers in [0, 1] per summary, rubrics in order, summaries in order]}}"""


@dataclass(frozen=True)
class Rubrics:
    positive: tuple[str, ...]
    negative: tuple[str, ...]


class OfflineRubrics:
    """Deterministic rubrics and lexical scores, for judge=lexical and judge=local."""

    name = "lexical"

    def __init__(self, max_rubrics: int) -> None:
        self.max_rubrics = max_rubrics

    async def write(self, document: Document) -> Rubrics:
        # The document's most repeated facts first; a lone digit ("2 of them") is too common to be a rubric.
        found = [f for f in facts(document.text) if not (f.isdigit() and len(f) == 1)]
        ranked = sorted(found, key=lambda f: -len(re.findall(rf"(?<!\w){re.escape(f)}(?!\w)", document.text)))
        return Rubrics(tuple(MENTIONS.format(f) for f in ranked[: self.max_rubrics]), (INVENTS_FACTS,))

    async def score(self, document: Document, rubrics: Rubrics, summaries: Sequence[str]) -> list[list[float]]:
        from summrl.facts import numbers
        from summrl.judges.lexical import content_words

        def holds(rubric: str, summary: str) -> float:
            if rubric == INVENTS_FACTS:
                return float(bool(invented_facts(summary, document.text)))
            if rubric.startswith("Mentions ") and rubric.endswith("."):
                fact = rubric[len("Mentions "):-1]
                wanted = numbers(fact) | content_words(fact)
                found = numbers(summary) | content_words(summary)
                return len(wanted & found) / len(wanted) if wanted else 0.0
            return 0.0  # a dataset rubric this scorer can't read: neither kept nor made

        return [[holds(r, s) for r in (*rubrics.positive, *rubrics.negative)] for s in summaries]


class JudgeRubrics:
    """An LLM judge writes the rubrics (one call per document) and scores a group against them (one call)."""

    def __init__(self, client: JudgeClient, max_rubrics: int) -> None:
        self.client, self.max_rubrics = client, max_rubrics
        self.name = client.model

    async def write(self, document: Document) -> Rubrics:
        def check(reply) -> Rubrics:
            lists = []
            for key in ("positive_rubrics", "negative_rubrics"):
                items = reply.get(key) if isinstance(reply, dict) else None
                if not isinstance(items, list) or not items or not all(isinstance(i, str) and i.strip() for i in items):
                    raise ReplyShapeError(f"expected {key} as a non-empty list of strings, got {json.dumps(reply)[:200]}")
                lists.append(tuple(i.strip() for i in items[: self.max_rubrics]))
            return Rubrics(*lists)

        text_list = {"type": "array", "items": {"type": "string", "maxLength": 160}, "minItems": 1,
                     "maxItems": self.max_rubrics}
        schema = {"type": "object", "required": ["positive_rubrics", "negative_rubrics"], "additionalProperties": False,
                  "properties": {"positive_rubrics": text_list, "negative_rubrics": text_list}}
        prompt = WRITE_PROMPT.format(n=self.max_rubrics, document=document.text)
        return await self.client.complete_json([{"role": "user", "content": prompt}], schema=schema, check=check)

    async def score(self, document: Document, rubrics: Rubrics, summaries: Sequence[str]) -> list[list[float]]:
        listed = [*rubrics.positive, *rubrics.negative]
        m, n = len(listed), len(summaries)
        rubric_lines = "\n".join(f"R{i + 1}. {r}" for i, r in enumerate(listed))
        summary_blocks = "\n\n".join(f"<summary id=\"{i + 1}\">\n{s}\n</summary>" for i, s in enumerate(summaries))

        def check(reply) -> list[list[float]]:
            rows = list_of(reply, "rubric_scores", n, list)
            for row in rows:
                if len(row) != m or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1
                                            for x in row):
                    raise ReplyShapeError(f"expected {n} lists of {m} scores in [0, 1], got {json.dumps(reply)[:200]}")
            return [[float(x) for x in row] for row in rows]

        row_schema = {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "minItems": m,
                      "maxItems": m}
        prompt = SCORE_PROMPT.format(rubrics=rubric_lines, summaries=summary_blocks, m=m)
        return await self.client.complete_json([{"role": "user", "content": prompt}],
                                               schema=list_schema("rubric_scores", row_schema, n), check=check)


class RubricReward:
    def __init__(self, rubrics: Union[OfflineRubrics, JudgeRubrics], *, positive_weight: float,
                 negative_weight: float, cache_dir: Optional[str]) -> None:
        self.rubrics, self.positive_weight, self.negative_weight = rubrics, positive_weight, negative_weight
        self.cache = Path(cache_dir).expanduser() if cache_dir else None
        self.written: dict[str, asyncio.Task] = {}  # document id -> its rubrics, written once per process

    def cache_path(self, document: Document) -> Optional[Path]:
        if self.cache is None:
            return None
        key = json.dumps([hashlib.sha256(document.text.encode()).hexdigest(), self.rubrics.name, PROMPT_VERSION])
        return self.cache / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    async def rubrics_for(self, document: Document) -> Rubrics:
        if document.positive_rubrics is not None or document.negative_rubrics is not None:
            return Rubrics(tuple(document.positive_rubrics or ()), tuple(document.negative_rubrics or ()))
        if document.id not in self.written:  # a document's groups in one step share one writing call
            self.written[document.id] = asyncio.ensure_future(self._write_cached(document))
        return await asyncio.shield(self.written[document.id])

    async def _write_cached(self, document: Document) -> Rubrics:
        path = self.cache_path(document)
        if path is not None and path.exists():
            saved = json.loads(path.read_text())
            return Rubrics(tuple(saved["positive_rubrics"]), tuple(saved["negative_rubrics"]))
        try:
            rubrics = await self.rubrics.write(document)
        except BaseException:
            del self.written[document.id]  # a failed write is retried by the next group, never cached
            raise
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"positive_rubrics": list(rubrics.positive),
                                       "negative_rubrics": list(rubrics.negative), "document_id": document.id,
                                       "writer": self.rubrics.name, "prompt_version": PROMPT_VERSION}))
            tmp.replace(path)
        return rubrics

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        try:
            rubrics = await self.rubrics_for(document)
            if not rubrics.positive and not rubrics.negative:
                return [Missing(f"document {document.id} has no rubrics") for _ in summaries]
            table = await self.rubrics.score(document, rubrics, summaries)
        except JudgeError as e:
            return [Missing(f"rubric reward, document {document.id}: {e}") for _ in summaries]
        return [self._score(rubrics, row) for row in table]

    def _score(self, rubrics: Rubrics, row: list[float]) -> Score:
        positives, negatives = row[: len(rubrics.positive)], row[len(rubrics.positive):]
        # Negatives say what a summary must not do: flipped, so that 1 is always good.
        values = [*positives, *(1.0 - s for s in negatives)]
        weights = [self.positive_weight] * len(positives) + [self.negative_weight] * len(negatives)
        reward = sum(w * v for w, v in zip(weights, values)) / sum(weights)
        metrics = {"rubric_positive": sum(positives) / len(positives) if positives else 0.0}
        if negatives:
            metrics["rubric_negative_violated"] = sum(negatives) / len(negatives)
        per_rubric = {**{f"+ {r}": s for r, s in zip(rubrics.positive, positives)},
                      **{f"- {r}": s for r, s in zip(rubrics.negative, negatives)}}
        return Score(reward, metrics, {"rubric_scores": json.dumps(per_rubric)})
