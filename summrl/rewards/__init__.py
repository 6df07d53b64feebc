"""Rewards score a whole group of summaries of one document at once (RULER ranks the group).

A :class:`Missing` score means the reward could not be computed (a judge call failed after its
retries): the loop drops that group from training and counts it. A missing reward is never a zero.
"""

from __future__ import annotations

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


class Reward(Protocol):
    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]: ...


def build_reward(config, judge, max_words: int) -> Reward:
    if config.kind == "qa":
        from summrl.rewards.qa import QAReward

        return QAReward(judge, max_chars=config.max_chars, forbid_han=config.forbid_han,
                        include_unanswerable=config.include_unanswerable)
    if config.kind == "length_penalized":
        from summrl.config import KIND_SCHEMAS
        from summrl.rewards.length import LengthPenalizedReward

        base = build_reward(KIND_SCHEMAS["reward"][config.base](), judge, max_words)  # the base with its defaults
        return LengthPenalizedReward(base, max_words=max_words, shape=config.shape, strength=config.strength)
    if config.kind == "ruler":
        from summrl.rewards.ruler import RulerReward

        return RulerReward(judge.client, rubric=config.rubric, max_words=max_words)
    raise ValueError(f"reward.kind={config.kind} is not available yet")
