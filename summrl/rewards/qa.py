"""QA reward: the fraction of the document's questions the judge answers correctly from the summary."""

from __future__ import annotations

import asyncio
import re
from typing import Optional, Sequence, Union

from summrl.data import Document
from summrl.judges import Judge
from summrl.rewards import Missing, Score

_HAN = re.compile(r"[\u2e80-\u2fdf\u3005\u3007\u3021-\u3029\u3038-\u303b\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


def has_han(text: str) -> bool:
    return _HAN.search(text) is not None


class QAReward:
    def __init__(self, judge: Judge, *, max_chars: Optional[int], forbid_han: bool, include_unanswerable: bool) -> None:
        self.judge = judge
        self.max_chars = max_chars
        self.forbid_han = forbid_han
        self.include_unanswerable = include_unanswerable
        self._baselines: dict[str, "asyncio.Task[Optional[float]]"] = {}

    async def percent_full(self, document: Document) -> Optional[float]:
        """Summary-RL's baseline: the share answered from the full document. Once per document, then cached."""
        from summrl.judges.llm import JudgeError

        async def compute() -> Optional[float]:
            try:
                verdicts = await self.judge.grade(document.text, document.questions)
            except JudgeError:
                return None  # a missing baseline leaves its metric out; it never changes the reward
            return sum(verdicts) / len(verdicts)

        if document.id not in self._baselines:
            self._baselines[document.id] = asyncio.ensure_future(compute())
        return await self._baselines[document.id]

    def rejection(self, summary: str) -> Optional[str]:
        """Summary-RL's rules: such a summary scores 0 without asking the judge."""
        if self.forbid_han and has_han(summary):
            return "han"
        if self.max_chars is not None and len(summary) > self.max_chars:
            return "too_long"
        return None

    async def _score(self, document: Document, summary: str) -> Union[Score, Missing]:
        from summrl.judges.llm import JudgeError

        answerable = [q.answerable for q in document.questions]
        rejected = self.rejection(summary)
        if rejected:
            verdicts = [False] * len(document.questions)
        else:
            try:
                verdicts = await self.judge.grade(summary, document.questions)
            except JudgeError as e:
                return Missing(str(e))
        baseline = await self.percent_full(document)
        n_answerable = sum(answerable)
        accuracy_all = sum(verdicts) / len(verdicts)
        accuracy_answerable = (
            sum(v for v, a in zip(verdicts, answerable) if a) / n_answerable if n_answerable else 0.0
        )
        metrics = {
            "qa_accuracy": accuracy_all,
            "qa_accuracy_answerable": accuracy_answerable,
            "rejected_han": float(rejected == "han"),
            "rejected_too_long": float(rejected == "too_long"),
        }
        if baseline is not None:
            metrics.update(percent_full=baseline, percent_diff=accuracy_all - baseline)
        return Score(reward=accuracy_all if self.include_unanswerable else accuracy_answerable, metrics=metrics)

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        return list(await asyncio.gather(*(self._score(document, s) for s in summaries)))
