"""A length penalty, as a term of ``reward=weighted``: 0 within ``trainer.max_words``, negative beyond it.

With ``over = (words - max_words) / max_words``: ``linear`` is ``-over``, ``quadratic`` is ``-over**2``, and
``hard`` is ``-1`` beyond the limit (with weight 1 and a base reward in [0, 1], such a summary scores <= 0).
The term's weight is the penalty's strength. ``reward=length_penalized`` is qa plus this term.
"""

from __future__ import annotations

from typing import Sequence, Union

from summrl.data import Document
from summrl.rewards import Missing, Score

SHAPES = ("hard", "linear", "quadratic")


class LengthPenalty:
    def __init__(self, *, max_words: int, shape: str) -> None:
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
        self.max_words, self.shape = max_words, shape

    def value(self, words: int) -> float:
        over = max(0, words - self.max_words) / self.max_words
        if over == 0:
            return 0.0
        return -1.0 if self.shape == "hard" else -(over if self.shape == "linear" else over**2)

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        out: list[Union[Score, Missing]] = []
        for summary in summaries:
            words = len(summary.split())
            out.append(Score(self.value(words), {"over_max_words": float(words > self.max_words)}))
        return out
