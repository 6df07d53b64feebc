"""reward=rubric (judge-written and cached, dataset, offline), reward=weighted, and the hallucination metric."""

from __future__ import annotations

import asyncio
import json

import pandas as pd
import pytest

from summrl.config import ConfigError
from summrl.data import DataError, Document, Question, group_documents
from summrl.facts import hallucinates, invented_facts
from summrl.judges.fake_server import FakeLLM, Reply
from summrl.judges.lexical import LexicalJudge
from summrl.judges.llm import JudgeClient
from summrl.rewards import Missing, Score, build_reward
from summrl.rewards.rubric import INVENTS_FACTS, JudgeRubrics, OfflineRubrics, RubricReward
from summrl.rewards.weighted import WeightedReward
from tests.conftest import ROOT, compose_config

DOC = Document(
    id="d1", topic="Local News",
    text="Ruth Okafor opened the Hollis Footbridge on March 14, 2024. It cost 2.1 million dollars and Dunmore "
         "Civil Works built it in 18 months.",
    questions=(Question("d1-q1", "Who opened the bridge?", "Ruth Okafor", ""),),
)
FAITHFUL = "Ruth Okafor opened the Hollis Footbridge in March 2024; it cost 2.1 million dollars."


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


def judge_reward(fake: FakeLLM, cache_dir, **kwargs) -> RubricReward:
    client = JudgeClient(model="openai/gpt-4o-mini", api_base=fake.base_url, cache_dir=None, retry_base_s=0.01,
                         retry_max_s=0.05, timeout_s=5.0, max_retries=1)
    return RubricReward(JudgeRubrics(client, max_rubrics=8), positive_weight=1.0,
                        negative_weight=kwargs.get("negative_weight", 1.0), cache_dir=cache_dir)


def prompts(fake: FakeLLM) -> list[str]:
    return [r["messages"][-1]["content"] for r in fake.requests]


def test_the_rubric_cache_saves_the_second_writing_call(fake, tmp_path):
    first = asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["a", "b", "c", "d"]))
    assert [p.count('"positive_rubrics"') for p in prompts(fake)] == [1, 0]  # one writing call, one scoring call
    assert all(s.reward == 0.5 for s in first)
    # A new reward (a rerun, another sweep job) on the same document and judge reads the rubrics from disk.
    second = asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["e", "f", "g", "h"]))
    assert len(fake.requests) == 3 and '"rubric_scores"' in prompts(fake)[2]
    assert json.loads(second[0].metadata["rubric_scores"]) == {"+ Names who opened it.": 0.5, "- Invents a date.": 0.5}
    # A changed document is a new key: written again.
    asyncio.run(judge_reward(fake, tmp_path).score_group(
        Document(id="d1", topic="", text=DOC.text + " Edited.", questions=DOC.questions), ["a", "b"]))
    assert sum('"positive_rubrics"' in p for p in prompts(fake)) == 2


def test_one_scoring_call_per_group_lists_every_summary_and_rubric(fake, tmp_path):
    asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["s1", "s2", "s3"]))
    scoring = prompts(fake)[-1]
    assert scoring.count("<summary id=") == 3 and "R1. Names who opened it." in scoring and "R2. Invents a date." in scoring


def test_negatives_are_flipped(fake, tmp_path):
    fake.script = [Reply(json.dumps({"positive_rubrics": ["Keeps the cost.", "Keeps the date."],
                                     "negative_rubrics": ["Invents a name."]})),
                   Reply(json.dumps({"rubric_scores": [[1, 1, 0], [1, 1, 1], [0, 0.5, 1]]}))]
    scores = asyncio.run(judge_reward(fake, tmp_path, negative_weight=2.0).score_group(DOC, ["a", "b", "c"]))
    # weighted mean of (1, 1, 1 - s_negative) with weights (1, 1, 2)
    assert [s.reward for s in scores] == pytest.approx([1.0, 0.5, 0.125])
    assert scores[1].metrics["rubric_negative_violated"] == 1.0


def test_a_failed_or_wrong_shape_scoring_call_is_missing_not_zero(fake, tmp_path):
    bad = Reply(json.dumps({"rubric_scores": [[0.5, 0.5]]}))  # one row for a group of two: retried, then given up
    fake.script = [Reply(json.dumps({"positive_rubrics": ["x"], "negative_rubrics": ["y"]})), bad, bad]
    scores = asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["a", "b"]))
    assert all(isinstance(s, Missing) and "rubric reward, document d1" in s.error for s in scores)


def rows(**rubric_columns):
    base = {"document_id": "d1", "document_topic": "t", "document_path": "p", "document_extracted": DOC.text,
            "question_id": "q1", "question": "Who?", "answer": "Ruth Okafor", "long_answer": ""}
    return [{**base, **rubric_columns}]


def test_rubrics_are_read_from_dataset_columns(tmp_path, fake):
    path = tmp_path / "docs.parquet"
    pd.DataFrame(rows(positive_rubrics=["Keeps the cost."], negative_rubrics=["Invents a name."])).to_parquet(path)
    from summrl.data.repliqa import _read_rows

    (document,) = group_documents(_read_rows(path), str(path))
    assert document.positive_rubrics == ("Keeps the cost.",) and document.negative_rubrics == ("Invents a name.",)
    fake.script = [Reply(json.dumps({"rubric_scores": [[1, 0]]}))]
    (score,) = asyncio.run(judge_reward(fake, None).score_group(document, ["a"]))
    assert score.reward == 1.0 and len(fake.requests) == 1  # no writing call: the dataset gave the rubrics


@pytest.mark.parametrize("value", ["Keeps the cost.", [1, 2], ["ok", ""]])
def test_bad_rubric_rows_are_reported_by_file_and_row(tmp_path, value):
    path = tmp_path / "docs.jsonl"
    good = rows(positive_rubrics=["Keeps the cost."])[0]
    path.write_text("\n".join(json.dumps(r) for r in [good, {**good, "question_id": "q2", "positive_rubrics": value}]))
    from summrl.data.repliqa import _read_rows

    with pytest.raises(DataError, match=rf"{path}, row 1 \(document d1\): positive_rubrics must be a list of non-empty"):
        group_documents(_read_rows(path), str(path))


def offline(max_rubrics: int = 8) -> RubricReward:
    return build_reward(compose_config(["experiment=local", "reward=rubric",
                                        f"reward.max_rubrics={max_rubrics}"]).reward, LexicalJudge(), 350)


def test_offline_rubrics_come_from_the_documents_facts():
    reward = offline()
    rubrics = asyncio.run(reward.rubrics_for(DOC))
    assert rubrics.negative == (INVENTS_FACTS,)
    assert {"Mentions Okafor.", "Mentions 2024.", "Mentions 2.1.", "Mentions March."} <= set(rubrics.positive)


def test_offline_rubric_reward_ranks_an_invented_number_below_the_same_summary():
    invented = FAITHFUL + " It carries 4500 people a day."
    faithful, worse = asyncio.run(offline().score_group(DOC, [FAITHFUL, invented]))
    assert faithful.reward > worse.reward
    assert json.loads(worse.metadata["rubric_scores"])[f"- {INVENTS_FACTS}"] == 1.0


class Fixed:
    def __init__(self, values):
        self.values = values

    async def score_group(self, document, summaries):
        return [Missing("judge down") if v is None else Score(v, {"own": v}) for v in self.values]


def test_a_weighted_sum_with_a_missing_term_is_missing():
    weighted = WeightedReward({"qa": (1.0, Fixed([0.5, 0.5])), "rubric": (0.2, Fixed([1.0, None]))})
    whole, missing = asyncio.run(weighted.score_group(DOC, ["a", "b"]))
    assert whole.reward == pytest.approx(0.7) and whole.metrics["reward_qa"] == 0.5
    assert whole.metrics["reward_rubric"] == 1.0
    assert isinstance(missing, Missing) and "term rubric: judge down" in missing.error


def test_length_penalized_is_a_weighted_preset_of_qa_and_a_length_term():
    config = compose_config(["experiment=local", "reward=length_penalized", "reward.terms.length.shape=quadratic",
                             "trainer.max_words=10"])
    reward = build_reward(config.reward, LexicalJudge(), config.trainer.max_words)
    long = FAITHFUL + " " + "word " * 4  # 18 words: 80% over
    (score,) = asyncio.run(reward.score_group(DOC, [long]))
    assert score.metrics["reward_length"] == pytest.approx(-(0.8**2))
    assert score.reward == pytest.approx(score.metrics["reward_qa"] - 0.8**2)


@pytest.mark.parametrize(
    "summary,invented",
    [
        (FAITHFUL, []),
        ("The Hollis footbridge opened in 2023.", ["2023"]),  # a wrong year
        ("Mayor Ruth Okafor and Tom Reyes opened it.", ["Tom", "Reyes"]),  # an invented name
        ("It opened on a Tuesday in June.", ["Tuesday", "June"]),  # invented date words
        ("It cost 2,100,000 dollars and took 18 months.", ["2100000"]),
        ("The bridge opened. Dunmore built it; NASA helped.", ["NASA"]),  # a sentence's first word is no name
        ("**Summary:** the footbridge opened in march.", []),  # case is ignored; markup too
        # layout is not a fact: list markers, headings, a hyphenated compound of a known name
        ("Key points:\n1. The Hollis Footbridge opened.\n2. It cost 2.1 million dollars.", []),
        ("## Overview\nOpening Ceremony\nA Hollis-based firm built it.", []),
        ("Key Points:\n1. Ruth Okafor and Tom Reyes opened it in 2023.", ["2023", "Tom", "Reyes"]),
    ],
)
def test_the_hallucination_metric_on_hand_made_summaries(summary, invented):
    assert invented_facts(summary, DOC.text) == invented
    assert hallucinates(summary, DOC.text) == bool(invented)


@pytest.mark.parametrize(
    "override,key",
    [
        ("reward.terms.rubric.weight=abc", "reward.terms.rubric.weight: must be a number"),
        ("reward.terms.rubric.kind=nope", "reward.terms.rubric.kind: must be one of qa, ruler, rubric, length"),
        ("~reward.terms.qa ~reward.terms.rubric", "reward.terms: must name at least one term"),
        ("+reward.terms.rubric.max_rubrics=0", "reward.terms.rubric.max_rubrics"),
        ("+reward.terms.rubric.max_rubrcs=3", "reward.terms.rubric.max_rubrcs is not a setting"),
    ],
)
def test_bad_weighted_config_fails_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("(", r"\(")):
        compose_config(["experiment=local", "reward=qa_rubric", *override.split()])
