"""``reward=weighted``: a weighted sum of other rewards (e.g. qa + 0.2 x rubric, or qa + a length penalty).

Every term scores the group (concurrently); a summary's reward is the sum of weight x term reward. A term that is a
*factor* (the hard length limit) multiplies the sum instead: 0 beyond the limit makes the whole reward 0; its
weight is not used. Each term's reward is logged as its own metric, ``<split>/reward_<term>`` (train/reward_qa),
beside the terms' own metrics; a metric two terms both report (two rubric terms' ``rubric_positive``) is kept
apart as ``<term>_<metric>``. A term that is missing for a summary makes its sum missing, with that term's error
kind: a partial sum would be a different reward.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Sequence, Union

from summrl.data import Document
from summrl.rewards.base import Missing, Reward, Score


def _apart(names: Sequence[str], parts: Sequence[dict]) -> dict:
    """The terms' dicts merged; a key two of them share is prefixed with each one's term name."""
    shared = Counter(key for part in parts for key in part)
    return {(f"{name}_{key}" if shared[key] > 1 else key): value
            for name, part in zip(names, parts) for key, value in part.items()}


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
                name, first = missing[0]
                out.append(Missing(f"term {name}: {first.error}", first.kind))
                continue
            total, factor = 0.0, 1.0
            for name, part in zip(names, parts):
                weight, reward = self.terms[name]
                if getattr(reward, "factor", False):
                    factor *= part.reward
                else:
                    total += weight * part.reward
            metrics = _apart(names, [p.metrics for p in parts])
            # "reward/<term>" would be ART's own "reward" section, logged without the split: train and val would mix.
            metrics.update({f"reward_{n}": p.reward for n, p in zip(names, parts)})
            out.append(Score(total * factor, metrics, _apart(names, [p.metadata for p in parts])))
        return out
