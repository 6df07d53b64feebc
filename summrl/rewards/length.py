"""A length penalty, as a term of ``reward=weighted``: 0 within ``trainer.max_words``, negative beyond it.

With ``over = (words - max_words) / max_words``: ``linear`` is ``-over`` and ``quadratic`` is ``-over**2``, times
the term's weight (the penalty's strength). ``hard`` is a *factor* of the whole sum instead: 1 within the limit,
0 beyond it, so that a summary over the limit scores 0 in total (its weight is not used), as the original
``length_penalized`` reward scored it. ``reward=length_penalized`` is qa (or ruler) plus this term.
"""

from __future__ import annotations

from typing import Sequence, Union

from summrl.data import Document
from summrl.prompt import word_count
from summrl.rewards.base import Missing, Score

SHAPES = ("hard", "linear", "quadratic")


class LengthPenalty:
    def __init__(self, *, max_words: int, shape: str) -> None:
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
        self.max_words, self.shape = max_words, shape
        self.factor = shape == "hard"  # WeightedReward multiplies the sum by it

    def value(self, words: int) -> float:
        over = max(0, words - self.max_words) / self.max_words
        if self.shape == "hard":
            return 0.0 if over else 1.0
        if not over:
            return 0.0
        return -(over if self.shape == "linear" else over**2)

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        out: list[Union[Score, Missing]] = []
        for summary in summaries:
            words = word_count(summary)
            out.append(Score(self.value(words), {"over_max_words": float(words > self.max_words)}))
        return out
