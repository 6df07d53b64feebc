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
        import asyncio

        scores, qa_scores = await asyncio.gather(self.reward.score_group(document, summaries),
                                                 self.qa.score_group(document, summaries))
        for score, qa in zip(scores, qa_scores):
            if isinstance(score, Score) and isinstance(qa, Score):
                score.metrics = {**qa.metrics, **score.metrics}
                score.metadata = {**qa.metadata, **score.metadata}
        return scores


def check_documents(config, documents: Sequence[Document]) -> None:
    """What the reward can only check against the data, before any model loads: dataset rubrics the configured
    judge can't score (judge=lexical/local read only their own). Raises ConfigError naming the fix."""
    from summrl.config import reward_kinds
    from summrl.judges import check_dataset_rubrics

    if "rubric" in reward_kinds(config.reward):
        check_dataset_rubrics(config.judge, documents)


def build_val_reward(config, judge, max_words: int) -> Reward:
    """The reward val runs score with: the training reward, with QA metrics beside it unless one of its terms (just
    one: two would log theirs apart, as <term>_qa_accuracy) already gives them."""
    from summrl.config import QARewardConfig

    reward = build_reward(config, judge, max_words)
    terms = [term.reward for term in config.terms.values()] if config.kind == "weighted" else [config]
    if sum(term.kind == "qa" for term in terms) == 1:
        return reward
    return WithQAMetrics(reward, build_reward(QARewardConfig(), judge, max_words))


def build_reward(config, judge, max_words: int) -> Reward:
    if config.kind == "qa":
        from summrl.rewards.qa import QAReward

        return QAReward(judge, max_chars=config.max_chars, forbid_han=config.forbid_han,
                        include_unanswerable=config.include_unanswerable)
    if config.kind == "weighted":
        from summrl.rewards.weighted import WeightedReward

        return WeightedReward({name: (term.weight, build_reward(term.reward, judge, max_words))
                               for name, term in config.terms.items()})
    if config.kind == "length":
        from summrl.rewards.length import LengthPenalty

        return LengthPenalty(max_words=max_words, shape=config.shape)
    if config.kind == "rubric":
        from summrl.rewards.rubric import RubricReward

        return RubricReward(judge, max_rubrics=config.max_rubrics, positive_weight=config.positive_weight,
                            negative_weight=config.negative_weight, cache_dir=config.cache_dir)
    if config.kind == "ruler":
        from summrl.rewards.ruler import RulerReward

        return RulerReward(judge.client, rubric=config.rubric, max_words=max_words)
    raise ValueError(f"reward.kind={config.kind} is not available yet")
