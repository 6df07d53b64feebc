"""Rubric reward (DR-Tulu's refiner recipe, for summaries): per-document positive and negative rubrics, each
scored in [0, 1]; the reward is their weighted mean with negatives flipped (1 - s), so higher is always better.

Rubrics come from the document's ``positive_rubrics`` / ``negative_rubrics`` dataset columns when it has them,
otherwise the judge writes them (:meth:`Judge.write_rubrics`: an LLM judge once per document and process, the
lexical judge offline). Rubrics a judge paid for are cached on disk, keyed by the document's hash, the writer
(judge model, endpoint, prompt version) and ``max_rubrics``, so reruns and sweeps never pay twice. The judge
scores a whole group against every rubric in one call (:meth:`Judge.score_rubrics`).

A rubric score that can't be had (the judge failed after its retries) leaves the reward missing, never 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence, Union

from summrl.data import Document
from summrl.judges.base import Judge, Rubrics
from summrl.judges.cache import JsonCache, document_hash
from summrl.judges.client import JudgeError
from summrl.rewards.base import Missing, Score


class RubricCache:
    """Written rubrics on disk (:class:`summrl.judges.cache.JsonCache`), keyed by the document's hash, the writer and
    ``max_rubrics``."""

    def __init__(self, directory: str) -> None:
        self.cache = JsonCache(directory)

    def path(self, document: Document, writer: str, max_rubrics: int) -> Path:
        return self.cache.path(document_hash(document.text), writer, max_rubrics)

    def read(self, path: Path) -> Optional[Rubrics]:
        saved = self.cache.read(path) or {}
        lists = [saved.get("positive_rubrics"), saved.get("negative_rubrics")]
        if not all(isinstance(items, list) and all(isinstance(i, str) for i in items) for items in lists):
            return None
        return Rubrics(tuple(lists[0]), tuple(lists[1]))

    def write(self, path: Path, rubrics: Rubrics, **about: object) -> None:
        self.cache.write(path, {"positive_rubrics": list(rubrics.positive), "negative_rubrics": list(rubrics.negative),
                                **about})


def weighs_something(rubrics: Rubrics, positive_weight: float, negative_weight: float) -> bool:
    """Whether some rubric has a weight: otherwise the weighted mean is undefined and the document has no reward."""
    return bool(positive_weight and rubrics.positive) or bool(negative_weight and rubrics.negative)


class RubricReward:
    def __init__(self, judge: Judge, *, max_rubrics: int, positive_weight: float, negative_weight: float,
                 cache_dir: Optional[str]) -> None:
        self.judge, self.max_rubrics = judge, max_rubrics
        self.positive_weight, self.negative_weight = positive_weight, negative_weight
        self.cache = RubricCache(cache_dir) if cache_dir else None

    async def rubrics_for(self, document: Document) -> Rubrics:
        if document.positive_rubrics is not None or document.negative_rubrics is not None:
            return Rubrics(document.positive_rubrics or (), document.negative_rubrics or ())
        writer = self.judge.rubric_writer
        path = self.cache.path(document, writer, self.max_rubrics) if self.cache and writer else None
        saved = self.cache.read(path) if path else None
        if saved is not None:
            return saved
        rubrics = await self.judge.write_rubrics(document, self.max_rubrics)
        if path:
            self.cache.write(path, rubrics, document_id=document.id, writer=writer, max_rubrics=self.max_rubrics)
        return rubrics

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        try:
            rubrics = await self.rubrics_for(document)
            if not weighs_something(rubrics, self.positive_weight, self.negative_weight):
                # written rubrics (a dataset's are checked before training): this document has no reward
                why = (f"rubric reward, document {document.id}: its rubrics all weigh 0 (reward.positive_weight="
                       f"{self.positive_weight}, {len(rubrics.positive)} positives; reward.negative_weight="
                       f"{self.negative_weight}, {len(rubrics.negative)} negatives): raise a weight")
                return [Missing(why, "RubricsWeighNothing") for _ in summaries]
            table = await self.judge.score_rubrics(document, rubrics, summaries)
        except JudgeError as e:
            return [Missing(f"rubric reward, document {document.id}: {e}", e.kind) for _ in summaries]
        return [self._score(rubrics, row) for row in table]

    def _score(self, rubrics: Rubrics, row: list[float]) -> Score:
        positives, negatives = row[: len(rubrics.positive)], row[len(rubrics.positive):]
        # Negatives say what a summary must not do: flipped, so that 1 is always good.
        values = [*positives, *(1.0 - s for s in negatives)]
        weights = [self.positive_weight] * len(positives) + [self.negative_weight] * len(negatives)
        reward = sum(w * v for w, v in zip(weights, values)) / sum(weights)
        metrics = {}
        if positives:
            metrics["rubric_positive"] = sum(positives) / len(positives)
        if negatives:
            metrics["rubric_negative_violated"] = sum(negatives) / len(negatives)
        per_rubric = {**{f"+ {r}": s for r, s in zip(rubrics.positive, positives)},
                      **{f"- {r}": s for r, s in zip(rubrics.negative, negatives)}}
        return Score(reward, metrics, {"rubric_scores": json.dumps(per_rubric)})
