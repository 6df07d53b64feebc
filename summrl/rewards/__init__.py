"""The rewards a run can train on, built from the reward config (:func:`build_reward`), and the checks a reward
can only make against the data, before any model loads (:func:`check_documents`). What a reward is:
:mod:`summrl.rewards.base`."""

from __future__ import annotations

from typing import Sequence

from summrl.config import QARewardConfig, reward_kinds, rewards_of_kind
from summrl.data import Document
from summrl.errors import ConfigError
from summrl.judges import Rubrics, check_dataset_rubrics
from summrl.prompt import SummaryPrompt
from summrl.rewards.base import Missing, Reward, Score, WithQAMetrics
from summrl.rewards.length import LengthPenalty
from summrl.rewards.qa import QAReward
from summrl.rewards.rubric import RubricReward, weighs_something
from summrl.rewards.ruler import RulerReward
from summrl.rewards.weighted import WeightedReward

__all__ = ["Missing", "Reward", "Score", "WithQAMetrics", "build_reward", "build_val_reward", "check_documents"]


def check_documents(config, documents: Sequence[Document]) -> None:
    """What the reward can only check against the data, before any model loads: dataset rubrics the configured
    judge can't score (judge=lexical/local read only their own). Raises ConfigError naming the fix."""
    if "rubric" not in reward_kinds(config.reward):
        return
    check_dataset_rubrics(config.judge, documents)
    rewards = ([t.reward for t in config.reward.terms.values()] if config.reward.kind == "weighted"
               else [config.reward])
    for reward in (r for r in rewards if r.kind == "rubric"):
        for document in documents:
            if document.positive_rubrics is None and document.negative_rubrics is None:
                continue  # the judge writes its rubrics; a document whose written rubrics weigh 0 has no reward
            given = Rubrics(tuple(document.positive_rubrics or ()), tuple(document.negative_rubrics or ()))
            if not weighs_something(given, reward.positive_weight, reward.negative_weight):
                raise ConfigError(
                    f"reward.positive_weight={reward.positive_weight}, reward.negative_weight={reward.negative_weight}: "
                    f"document {document.id}'s dataset rubrics ({len(given.positive)} positives, "
                    f"{len(given.negative)} negatives) would all weigh 0, so it would have no reward: raise a weight")


def build_val_reward(config, judge) -> Reward:
    """The reward val runs score with (``config``: the run's): the training reward, with QA metrics beside it unless
    one of its terms (just one: two would log theirs apart, as <term>_qa_accuracy) already gives them, measured with
    trainer.val_qa_max_chars and val_qa_forbid_han (validation sets those to a single QA term's settings)."""
    prompt = SummaryPrompt.of(config.trainer)
    reward = build_reward(config.reward, judge, prompt)
    if len(rewards_of_kind(config.reward, "qa")) == 1:
        return reward
    qa = QARewardConfig(max_chars=config.trainer.val_qa_max_chars, forbid_han=config.trainer.val_qa_forbid_han)
    return WithQAMetrics(reward, build_reward(qa, judge, prompt))


def build_reward(config, judge, prompt: SummaryPrompt) -> Reward:
    """``prompt``: what the summaries were asked (RULER shows the judge the same chat; the length term reads its
    max_words)."""
    if config.kind == "qa":
        return QAReward(judge, max_chars=config.max_chars, forbid_han=config.forbid_han,
                        include_unanswerable=config.include_unanswerable)
    if config.kind == "weighted":
        return WeightedReward({name: (term.weight, build_reward(term.reward, judge, prompt))
                               for name, term in config.terms.items()})
    if config.kind == "length":
        return LengthPenalty(max_words=prompt.max_words, shape=config.shape)
    if config.kind == "rubric":
        return RubricReward(judge, max_rubrics=config.max_rubrics, positive_weight=config.positive_weight,
                            negative_weight=config.negative_weight, cache_dir=config.cache_dir)
    if config.kind == "ruler":
        return RulerReward(judge.client, rubric=config.rubric, prompt=prompt)
    raise ValueError(f"reward.kind={config.kind} is not available yet")
