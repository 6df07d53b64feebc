"""A base reward minus a penalty for words beyond ``trainer.max_words``.

With ``over = (words - max_words) / max_words`` (0 within the limit):
``hard`` scores 0 beyond the limit, ``linear`` subtracts ``strength * over``, ``quadratic`` subtracts
``strength * over**2``. A missing base reward stays missing.
"""

from __future__ import annotations

from typing import Sequence, Union

from summrl.data import Document
from summrl.rewards import Missing, Reward, Score

SHAPES = ("hard", "linear", "quadratic")


class LengthPenalizedReward:
    def __init__(self, base: Reward, *, max_words: int, shape: str, strength: float) -> None:
        if shape not in SHAPES:
            raise ValueError(f"reward.shape must be one of {', '.join(SHAPES)}, got {shape!r}")
        self.base, self.max_words, self.shape, self.strength = base, max_words, shape, strength

    def penalty(self, words: int, base_reward: float) -> float:
        over = max(0, words - self.max_words) / self.max_words
        if over == 0:
            return 0.0
        if self.shape == "hard":
            return base_reward
        return self.strength * (over if self.shape == "linear" else over**2)

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        scored = await self.base.score_group(document, summaries)
        out: list[Union[Score, Missing]] = []
        for summary, score in zip(summaries, scored):
            if isinstance(score, Missing):
                out.append(score)
                continue
            words = len(summary.split())
            penalty = self.penalty(words, score.reward)
            out.append(Score(score.reward - penalty,
                             {**score.metrics, "base_reward": score.reward, "length_penalty": penalty,
                              "over_max_words": float(words > self.max_words)}, score.metadata))
        return out
