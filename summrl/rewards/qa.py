"""QA reward: the fraction of the document's questions the judge answers correctly from the summary.

A group is graded together: the judge answers from each summary, then grades all answers in one
call. Summary-RL's full-document baseline (``percent_full``) rides along in the first group of each
document and is cached, so it costs one answering call per document, not one per rollout.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence, Union

from summrl.data import Document
from summrl.judges.base import Judge
from summrl.rewards.base import Missing, Score

_HAN = re.compile(r"[\u2e80-\u2fdf\u3005\u3007\u3021-\u3029\u3038-\u303b\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


def has_han(text: str) -> bool:
    return _HAN.search(text) is not None


class QAReward:
    def __init__(self, judge: Judge, *, max_chars: Optional[int], forbid_han: bool, include_unanswerable: bool) -> None:
        self.judge = judge
        self.max_chars = max_chars
        self.forbid_han = forbid_han
        self.include_unanswerable = include_unanswerable
        self.baselines: dict[str, Optional[float]] = {}  # document id -> percent_full (None: the judge failed)

    def rejection(self, summary: str) -> Optional[str]:
        """Summary-RL's rules: such a summary scores 0 without asking the judge."""
        if self.forbid_han and has_han(summary):
            return "han"
        if self.max_chars is not None and len(summary) > self.max_chars:
            return "too_long"
        return None

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        questions = document.questions
        rejections = [self.rejection(s) for s in summaries]
        texts = [s for s, r in zip(summaries, rejections) if not r]
        with_baseline = document.id not in self.baselines
        graded = list(await self.judge.grade_group(texts + [document.text] if with_baseline else texts, questions))
        if with_baseline:
            full = graded.pop()
            self.baselines[document.id] = None if isinstance(full, Exception) else sum(full) / len(full)
        baseline = self.baselines[document.id]
        judged = iter(graded)
        scores: list[Union[Score, Missing]] = []
        for rejected in rejections:
            verdicts = [False] * len(questions) if rejected else next(judged)
            if isinstance(verdicts, Exception):
                scores.append(Missing(str(verdicts), getattr(verdicts, "kind", type(verdicts).__name__)))
                continue
            scores.append(self._score(document, verdicts, rejected, baseline))
        return scores

    def _score(self, document: Document, verdicts: list[bool], rejected: Optional[str], baseline: Optional[float]) -> Score:
        answerable = [q.answerable for q in document.questions]
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
        if baseline is not None:  # a failed baseline leaves its metric out; it never changes the reward
            metrics.update(percent_full=baseline, percent_diff=accuracy_all - baseline)
        return Score(reward=accuracy_all if self.include_unanswerable else accuracy_answerable, metrics=metrics,
                     metadata={"correct": ",".join("1" if v else "0" for v in verdicts)})
