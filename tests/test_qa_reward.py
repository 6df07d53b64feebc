"""QA reward: fraction answered, Summary-RL's rejection rules, and the unanswerable setting."""

from __future__ import annotations

import asyncio

import pytest

from summrl.data import Document, Question
from summrl.judges.lexical import LexicalJudge
from summrl.prompt import SummaryPrompt
from summrl.rewards.qa import QAReward, has_han

DOC = Document(
    id="d1", topic="Local News", text="unused by the reward",
    questions=(
        Question("d1-q1", "Who opened it?", "Ruth Okafor", ""),
        Question("d1-q2", "When?", "March 14, 2024", ""),
        Question("d1-q3", "Cost?", "2.1 million dollars", ""),
        Question("d1-q4", "Contractor?", "Dunmore Civil Works", ""),
        Question("d1-q5", "Who paid for lunch?", "UNANSWERABLE", "NA"),
    ),
)


def reward(**kwargs) -> QAReward:
    return QAReward(LexicalJudge(), **{"max_chars": 3000, "forbid_han": True, "include_unanswerable": True, **kwargs})


def score(r: QAReward, summaries):
    return asyncio.run(r.score_group(DOC, summaries))


def test_reward_is_the_fraction_answered_for_each_summary_of_the_group():
    full = "Ruth Okafor opened it on March 14, 2024; it cost 2.1 million dollars; Dunmore Civil Works built it."
    half = "Ruth Okafor opened it on March 14, 2024."
    scores = score(reward(), [full, half, "Nothing useful."])
    assert [s.reward for s in scores] == [1.0, 0.6, 0.2]
    assert scores[1].metrics["qa_accuracy_answerable"] == 0.5


def test_excluding_unanswerable_questions():
    scores = score(reward(include_unanswerable=False), ["Ruth Okafor opened it.", "Nothing useful."])
    assert [s.reward for s in scores] == [0.25, 0.0]
    assert scores[0].metrics["qa_accuracy"] == 0.4  # both figures are logged either way


def test_summary_rl_rejections_score_zero():
    long_summary = "Ruth Okafor " * 300  # 3600 characters
    scores = score(reward(), [long_summary, "Ruth Okafor 宣布 March 14, 2024"])
    assert [s.reward for s in scores] == [0.0, 0.0]
    assert scores[0].metrics["rejected_too_long"] == 1.0 and scores[1].metrics["rejected_han"] == 1.0
    relaxed = score(reward(max_chars=None, forbid_han=False), [long_summary])
    assert relaxed[0].reward > 0


def test_han_detection():
    assert has_han("summary 中文") and not has_han("café naïve résumé ありがとう")


def length_reward(shape: str, strength: float = 1.0, max_words: int = 10):
    from summrl.rewards.length import LengthPenalty
    from summrl.rewards.weighted import WeightedReward

    return WeightedReward({"qa": (1.0, reward()), "length": (strength, LengthPenalty(max_words=max_words, shape=shape))})


FULL = "Ruth Okafor opened it on March 14, 2024; it cost 2.1 million dollars; Dunmore Civil Works built it."  # 18 words
PARTIAL = "Ruth Okafor opened it on March 14, 2024, a sunny and busy day in town."  # 15 words, qa 0.6


def test_length_penalty_shapes_beyond_max_words():
    over = (15 - 10) / 10
    assert score(length_reward("linear", 0.5), [PARTIAL])[0].reward == pytest.approx(0.6 - 0.5 * over)
    assert score(length_reward("quadratic"), [PARTIAL])[0].reward == pytest.approx(0.6 - over**2)
    # hard, as reward=length_penalized scored it from the start: a summary over the limit scores 0 in total, whatever
    # its base reward and the strength (not 0.6 - 1)
    for strength in (1.0, 3.0):
        hard = score(length_reward("hard", strength), [PARTIAL])[0]
        assert hard.reward == 0.0 and hard.metrics["reward_qa"] == 0.6 and hard.metrics["reward_length"] == 0.0
    within = score(length_reward("hard", max_words=50), [PARTIAL, FULL])
    assert [s.reward for s in within] == [0.6, 1.0] and within[0].metrics["reward_length"] == 1.0


def test_words_of_a_script_without_spaces_count_one_a_character_and_english_counts_as_before():
    """A Chinese summary is one run without spaces: str.split() counted it 1 word, never over trainer.max_words
    (found by an audit). Latin-script text counts exactly as before, so recorded English runs are unchanged."""
    import json

    from summrl.prompt import word_count
    from summrl.rewards.length import LengthPenalty
    from tests.conftest import SAMPLE

    texts = [v for line in SAMPLE.read_text().splitlines()
             for v in json.loads(line).values() if isinstance(v, str)]
    assert texts and all(word_count(t) == len(t.split()) for t in texts)
    assert word_count("市议会批准了三百万元的预算。") == 13 and word_count("東京タワーは333メートル, Tokyo") == 12
    zh = "市议会周一批准了三百万元的港口预算" * 2  # 34 characters, no space
    (scored,) = asyncio.run(LengthPenalty(max_words=17, shape="linear").score_group(DOC, [zh]))
    assert scored.reward == pytest.approx(-1.0) and scored.metrics["over_max_words"] == 1.0


@pytest.mark.parametrize("overrides,shape,strength", [
    ([], "linear", 1.0),
    (["reward.shape=quadratic", "reward.strength=0.5"], "quadratic", 0.5),  # the original keys still work
    (["reward.shape=hard"], "hard", 1.0),
])
def test_length_penalized_config_builds_on_qa(overrides, shape, strength):
    from summrl.rewards import build_reward
    from summrl.rewards.length import LengthPenalty
    from summrl.rewards.weighted import WeightedReward
    from tests.conftest import compose_config

    config = compose_config(["experiment=local", "reward=length_penalized", "trainer.max_words=10", *overrides])
    built = build_reward(config.reward, LexicalJudge(), SummaryPrompt.of(config.trainer))
    assert isinstance(built, WeightedReward) and isinstance(built.terms["qa"][1], QAReward)
    weight, penalty = built.terms["length"]
    assert isinstance(penalty, LengthPenalty) and (penalty.shape, weight, penalty.max_words) == (shape, strength, 10)
    (scored,) = score(built, [PARTIAL])
    assert scored.reward == pytest.approx({"linear": 0.6 - 0.5, "quadratic": 0.6 - 0.5 * 0.25, "hard": 0.0}[shape])


def test_length_penalized_on_ruler_and_bad_original_keys_name_the_key():
    from summrl.errors import ConfigError
    from tests.conftest import compose_config

    config = compose_config(["experiment=local", "reward=length_penalized", "reward.base=ruler"])
    assert {name: term.reward.kind for name, term in config.reward.terms.items()} == {"ruler": "ruler", "length": "length"}
    for override, key in (("reward.shape=cubic", "reward.shape: must be one of hard, linear, quadratic"),
                          ("reward.strength=-1", "reward.strength: must be >= 0"),
                          ("reward.base=rubric", "reward.base: must be qa or ruler")):
        with pytest.raises(ConfigError, match=key):
            compose_config(["experiment=local", "reward=length_penalized", override])


def test_percent_full_is_logged_beside_the_reward():
    """Summary-RL's baseline: the same questions answered from the whole document (here one that answers them all)."""
    from dataclasses import replace

    scores = asyncio.run(reward().score_group(replace(DOC, text=FULL), ["Ruth Okafor opened it."]))
    metrics = scores[0].metrics
    assert metrics["percent_full"] == 1.0 and metrics["qa_accuracy"] == pytest.approx(0.4)  # Okafor + unanswerable
    assert metrics["percent_diff"] == pytest.approx(-0.6) and scores[0].reward == pytest.approx(0.4)


def test_the_qa_settings_reach_the_reward_the_config_builds():
    """The rules above were tested on QAReward built by hand: reward.max_chars, forbid_han and include_unanswerable
    could have been dropped on the way from the config and no test would say so."""
    from summrl.rewards import build_reward
    from tests.conftest import compose_config

    def built(*overrides):
        config = compose_config(["experiment=local", *overrides])
        return build_reward(config.reward, LexicalJudge(), SummaryPrompt.of(config.trainer))

    long_summary, han = "Ruth Okafor " * 300, "Ruth Okafor 宣布 March 14, 2024"  # 3600 characters; Han characters
    strict = score(built(), [long_summary, han, "Ruth Okafor opened it."])
    assert [s.reward for s in strict] == [0.0, 0.0, 0.4]  # Summary-RL's rejections, unanswerable counted
    assert strict[0].metrics["rejected_too_long"] == 1.0 and strict[1].metrics["rejected_han"] == 1.0
    relaxed = score(built("reward.max_chars=null", "reward.forbid_han=false", "reward.include_unanswerable=false"),
                    [long_summary, han, "Ruth Okafor opened it."])
    assert all(s.reward > 0 for s in relaxed[:2]) and relaxed[2].reward == 0.25
    assert score(built("reward.max_chars=100"), ["Ruth Okafor opened it. " * 5])[0].reward == 0.0  # 115 characters
