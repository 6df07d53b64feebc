"""What every reward is: a :class:`Reward` scores a whole group of summaries of one document at once (RULER ranks
the group), each summary getting a :class:`Score` or, when the reward could not be computed (a judge call failed
after its retries), a :class:`Missing`: the loop drops that group from training and counts it. A missing reward is
never a zero.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol, Sequence, Union

from summrl.data import Document


@dataclass
class Score:
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)  # e.g. per-question correctness, for val samples


@dataclass
class Missing:
    error: str  # why; never contains an API key
    kind: str = "error"  # the error's kind, counted by the run's missing-reward limit (JudgeError.kind)


class Reward(Protocol):
    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]: ...


class WithQAMetrics:
    """A reward that is not QA-based, plus the QA metrics (``qa_accuracy``, ``percent_full``) as side metrics.

    Used for val, so that a reward ablation compares every run on the same axis: the share of the
    document's questions the judge answers from the summary. The reward itself is unchanged; a QA
    grading that fails leaves its metrics out, never the reward.
    """

    def __init__(self, reward: Reward, qa: Reward) -> None:
        self.reward, self.qa = reward, qa

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        scores, qa_scores = await asyncio.gather(self.reward.score_group(document, summaries),
                                                 self.qa.score_group(document, summaries))
        for score, qa in zip(scores, qa_scores):
            if isinstance(score, Score) and isinstance(qa, Score):
                score.metrics = {**qa.metrics, **score.metrics}
                score.metadata = {**qa.metadata, **score.metadata}
        return scores
