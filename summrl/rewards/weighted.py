"""``reward=weighted``: a weighted sum of other rewards (e.g. qa + 0.2 x rubric, or qa + a length penalty).

Every term scores the group (concurrently); a summary's reward is the sum of weight x term reward. Each term's
reward is logged as its own metric, ``<split>/reward_<term>`` (train/reward_qa), beside the terms' own metrics. A term that is missing
for a summary makes its sum missing: a partial sum would be a different reward.
"""

from __future__ import annotations

import asyncio
from typing import Sequence, Union

from summrl.data import Document
from summrl.rewards import Missing, Reward, Score


class WeightedReward:
    def __init__(self, terms: dict[str, tuple[float, Reward]]) -> None:
        if not terms:
            raise ValueError("a weighted reward needs at least one term")
        self.terms = terms

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        names = list(self.terms)
        scored = await asyncio.gather(*(self.terms[n][1].score_group(document, summaries) for n in names))
        out: list[Union[Score, Missing]] = []
        for i in range(len(summaries)):
            parts = [term_scores[i] for term_scores in scored]
            missing = [(n, p) for n, p in zip(names, parts) if isinstance(p, Missing)]
            if missing:
                out.append(Missing(f"term {missing[0][0]}: {missing[0][1].error}"))
                continue
            total, metrics, metadata = 0.0, {}, {}
            for name, part in zip(names, parts):
                total += self.terms[name][0] * part.reward
                metrics.update(part.metrics)
                metadata.update(part.metadata)
            # "reward/<term>" would be ART's own "reward" section, logged without the split: train and val would mix.
            metrics.update({f"reward_{n}": p.reward for n, p in zip(names, parts)})
            out.append(Score(total, metrics, metadata))
        return out
