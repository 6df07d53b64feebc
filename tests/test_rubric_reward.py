"""reward=rubric (judge-written and cached, dataset, offline) and reward=weighted, against the loopback judge server."""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading

import pandas as pd
import pytest

from summrl.config import reward_range
from summrl.data import DataError, Document, Question, group_documents
from summrl.errors import ConfigError
from summrl.judges import Rubrics, build_judge
from summrl.judges.client import JudgeClient
from summrl.judges.lexical import INVENTS_FACTS, LexicalJudge
from summrl.judges.llm import LLMJudge
from summrl.prompt import SummaryPrompt
from summrl.rewards import Missing, Score, build_reward, build_val_reward, check_documents
from summrl.rewards.rubric import RubricCache, RubricReward
from summrl.rewards.weighted import WeightedReward
from summrl.testing import FakeLLM, Reply
from tests.conftest import compose_config
from tests.test_facts import DOC, FAITHFUL  # the hand-made document and a faithful summary of it

FACTS = SummaryPrompt("facts", 350)  # experiment=local's prompt



@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


def llm_judge(fake: FakeLLM) -> LLMJudge:
    return LLMJudge(JudgeClient(model="openai/gpt-4o-mini", api_base=fake.base_url, cache_dir=None, retry_base_s=0.01,
                                retry_max_s=0.05, timeout_s=5.0, max_retries=1))


def judge_reward(fake: FakeLLM, cache_dir, judge: LLMJudge | None = None, max_rubrics: int = 8,
                 negative_weight: float = 1.0) -> RubricReward:
    return RubricReward(judge or llm_judge(fake), max_rubrics=max_rubrics, positive_weight=1.0,
                        negative_weight=negative_weight, cache_dir=cache_dir)


def prompts(fake: FakeLLM) -> list[str]:
    return [r["messages"][-1]["content"] for r in fake.requests]


def writing_calls(fake: FakeLLM) -> int:
    return sum('"positive_rubrics"' in p for p in prompts(fake))


def test_the_rubric_cache_saves_the_second_writing_call(fake, tmp_path):
    first = asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["a", "b", "c", "d"]))
    assert [p.count('"positive_rubrics"') for p in prompts(fake)] == [1, 0]  # one writing call, one scoring call
    assert all(s.reward == 0.5 for s in first)
    # A new judge and reward (a rerun, another sweep job) on the same document read the rubrics from disk.
    second = asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["e", "f", "g", "h"]))
    assert len(fake.requests) == 3 and '"rubric_scores"' in prompts(fake)[2]
    per_rubric = json.loads(second[0].metadata["rubric_scores"])
    assert len(per_rubric) == 16 and set(per_rubric.values()) == {0.5}  # the fake judge writes 8 a side, as asked
    # A changed document, another max_rubrics or another endpoint is a new key: written again.
    asyncio.run(judge_reward(fake, tmp_path).score_group(
        Document(id="d1", topic="", text=DOC.text + " Edited.", questions=DOC.questions), ["a", "b"]))
    assert writing_calls(fake) == 2
    asyncio.run(judge_reward(fake, tmp_path, max_rubrics=3).score_group(DOC, ["a", "b"]))
    assert writing_calls(fake) == 3
    assert "up to 3 specific facts" in [p for p in prompts(fake) if '"positive_rubrics"' in p][-1]
    with FakeLLM() as other:
        asyncio.run(judge_reward(other, tmp_path).score_group(DOC, ["a", "b"]))
        assert writing_calls(other) == 1
    assert len(list(tmp_path.glob("*.json"))) == 4 and not list(tmp_path.glob("*.tmp"))


def test_a_corrupt_cache_file_is_a_miss_and_is_rewritten(fake, tmp_path):
    asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["a", "b"]))
    (path,) = tmp_path.glob("*.json")
    for broken in ('{"positive_rubrics": ["Keeps the', "", '{"positive_rubrics": 3, "negative_rubrics": []}'):
        path.write_text(broken)  # a crash mid-write by an older version, a full disk, an edit
        scores = asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["a", "b"]))
        assert all(isinstance(s, Score) for s in scores)
        assert len(json.loads(path.read_text())["positive_rubrics"]) == 8  # written again
    assert writing_calls(fake) == 4


def test_parallel_writers_of_one_document_never_clash(tmp_path):
    # Sweep jobs that write the same document's rubrics at once: each writes its own temp file, then renames it.
    cache = RubricCache(str(tmp_path))
    path = cache.path(DOC, "writer", 8)
    errors = []

    def write(n: int) -> None:
        try:
            for i in range(40):
                cache.write(path, Rubrics((f"Keeps {n}-{i}.",), ("Invents a name.",)))
        except Exception as e:  # with one shared temp name, a writer's rename finds the file already moved
            errors.append(e)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.read(path) is not None and list(tmp_path.iterdir()) == [path]


def test_train_and_val_share_a_documents_rubrics_without_a_disk_cache(fake):
    config = compose_config(["experiment=local", "judge=openai_compatible", f"judge.api_base={fake.base_url}",
                             "judge.cache_dir=null", "reward=rubric", "reward.cache_dir=null"])
    judge = build_judge(config.judge)
    train, val = build_reward(config.reward, judge, 350), build_val_reward(config, judge)

    async def both():  # a step's two groups of one document at once, then the val pass
        await asyncio.gather(train.score_group(DOC, ["a", "b"]), train.score_group(DOC, ["c", "d"]))
        await val.reward.score_group(DOC, ["e", "f"])  # val adds QA metrics beside the rubric reward

    asyncio.run(both())
    assert writing_calls(fake) == 1 and len(fake.requests) == 4


def test_one_scoring_call_per_group_lists_every_summary_and_rubric(fake, tmp_path):
    asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["s1", "s2", "s3"]))
    scoring = prompts(fake)[-1]
    assert scoring.count("<summary id=") == 3
    assert "R1. Mentions that Ruth Okafor opened the Hollis Footbridge" in scoring and "\nR16. " in scoring


def test_negatives_are_flipped(fake, tmp_path):
    fake.script = [Reply(json.dumps({"positive_rubrics": ["Keeps the cost.", "Keeps the date."],
                                     "negative_rubrics": ["Invents a name."]})),
                   Reply(json.dumps({"rubric_scores": [[1, 1, 0], [1, 1, 1], [0, 0.5, 1]]}))]
    scores = asyncio.run(judge_reward(fake, tmp_path, negative_weight=2.0).score_group(DOC, ["a", "b", "c"]))
    # weighted mean of (1, 1, 1 - s_negative) with weights (1, 1, 2)
    assert [s.reward for s in scores] == pytest.approx([1.0, 0.5, 0.125])
    assert scores[1].metrics["rubric_negative_violated"] == 1.0


def test_a_wrong_shape_rubric_reply_is_retried_and_recovers(fake, tmp_path):
    judge = llm_judge(fake)
    fake.script = [
        Reply(json.dumps({"positive_rubrics": "Keeps the cost.", "negative_rubrics": ["Invents a name."]})),  # no list
        Reply(json.dumps({"positive_rubrics": ["Keeps the cost."], "negative_rubrics": ["Invents a name."]})),
        Reply(json.dumps({"rubric_scores": [[1, 0]]})),  # one row for a group of two
        Reply(json.dumps({"rubric_scores": [[1, 0], [0, 1.5]]})),  # a score outside [0, 1]
        Reply(json.dumps({"rubric_scores": [[1, 0], [0, 1]]})),
    ]
    judge.client.max_retries = 2
    scores = asyncio.run(judge_reward(fake, tmp_path, judge=judge).score_group(DOC, ["a", "b"]))
    assert [s.reward for s in scores] == [1.0, 0.0] and len(fake.requests) == 5
    assert (judge.client.usage.retries, judge.client.usage.failures) == (3, 0)


def test_a_failed_or_wrong_shape_scoring_call_is_missing_not_zero_with_its_kind(fake, tmp_path):
    bad = Reply(json.dumps({"rubric_scores": [[0.5, 0.5]]}))  # one row for a group of two: retried, then given up
    fake.script = [Reply(json.dumps({"positive_rubrics": ["x"], "negative_rubrics": ["y"]})), bad, bad]
    scores = asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["a", "b"]))
    assert all(isinstance(s, Missing) and "rubric reward, document d1" in s.error for s in scores)
    assert {s.kind for s in scores} == {"ReplyShapeError"}  # counted by kind in the run's missing-reward limit
    fake.script = [Reply(status=500), Reply(status=500)]
    scores = asyncio.run(judge_reward(fake, tmp_path).score_group(DOC, ["a", "b"]))  # the scoring call fails
    assert {s.kind for s in scores} == {"InternalServerError"}


@pytest.mark.parametrize("reward", ["qa_rubric", "length_penalized"])
def test_weighted_presets_keep_a_missing_terms_kind(fake, reward):
    config = compose_config(["experiment=local", "judge=openai_compatible", f"judge.api_base={fake.base_url}",
                             "judge.cache_dir=null", "judge.max_retries=0", f"reward={reward}",
                             "+reward.terms.rubric.cache_dir=null" if reward == "qa_rubric" else "reward.strength=1.0"])
    fake.script = [Reply(status=429, headers={"Retry-After": "0"})] * 20  # every call is rate-limited
    scores = asyncio.run(build_reward(config.reward, build_judge(config.judge), FACTS).score_group(DOC, ["a", "b"]))
    assert all(isinstance(s, Missing) for s in scores) and {s.kind for s in scores} == {"RateLimitError"}


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


@pytest.mark.parametrize("value,message", [
    ("Keeps the cost.", "positive_rubrics must be a non-empty list of non-empty strings"),
    ([1, 2], "positive_rubrics must be a non-empty list of non-empty strings"),
    (["ok", ""], "positive_rubrics must be a non-empty list of non-empty strings"),
    ([], "positive_rubrics must be a non-empty list of non-empty strings"),
    (["Keeps the date."], r"positive_rubrics differs from line 1's for the same document"),
])
def test_bad_rubric_rows_are_reported_by_file_and_row(tmp_path, value, message):
    path = tmp_path / "docs.jsonl"
    good = rows(positive_rubrics=["Keeps the cost."])[0]
    rest = {"question_id": "q2", "positive_rubrics": value}
    path.write_text("\n".join(json.dumps(r) for r in [good, {**good, "question_id": "q3", "positive_rubrics": None},
                                                      {**good, **rest}]))
    from summrl.data.repliqa import _read_rows

    with pytest.raises(DataError, match=rf"{path}, line 3 \(document d1\): {message}"):
        group_documents(_read_rows(path), str(path))


def offline(max_rubrics: int = 8, judge=None) -> RubricReward:
    return build_reward(compose_config(["experiment=local", "reward=rubric",
                                        f"reward.max_rubrics={max_rubrics}"]).reward, judge or LexicalJudge(),
                        FACTS)


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


def test_the_lexical_judge_scores_every_rubric_it_writes_for_the_sample():
    """Offline rubrics are written from the document's facts: each must be one the lexical scorer can check (a
    capitalized stop word such as "The" in "at The Anchor" is a name but leaves nothing to check)."""
    from summrl.data import load_splits

    config = compose_config(["experiment=local", "reward=rubric"])
    val, train = load_splits(config.dataset)
    judge = LexicalJudge()
    for document in [*val, *train]:
        rubrics = asyncio.run(judge.write_rubrics(document, max_rubrics=8))
        assert len(rubrics.positive) == 8, document.id
        table = asyncio.run(judge.score_rubrics(document, rubrics, [document.text]))
        assert table[0][: len(rubrics.positive)] == [1.0] * len(rubrics.positive), document.id  # the text has them all


def test_the_cli_refuses_unreadable_dataset_rubrics_before_the_model_loads(repliqa_parquet, tmp_path):
    from tests.conftest import ROOT, repliqa_rows, run_cli

    data = [{**r, "positive_rubrics": ["Keeps the cost."], "negative_rubrics": [INVENTS_FACTS]} for r in repliqa_rows(4)]
    result = run_cli(["experiment=local", "reward=rubric", f"dataset.files=[{repliqa_parquet(rows=data)}]",
                      "dataset.train_size=2", "dataset.val_size=2", f"hydra.run.dir={tmp_path / 'run'}"],
                     cwd=ROOT, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "can't read the dataset's positive_rubrics 'Keeps the cost.'" in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run" / "art").exists()  # no model was loaded


@pytest.mark.parametrize("judge", ["lexical", "local"])
def test_offline_judges_refuse_dataset_rubrics_they_cannot_read(repliqa_parquet, judge):
    # Before any model loads (the loop checks the documents it loaded): the lexical scorer would score "Keeps the
    # cost." 0 for every summary, a constant reward.
    from summrl.data import load_splits
    from tests.conftest import repliqa_rows

    data = [{**r, "positive_rubrics": ["Keeps the cost."], "negative_rubrics": [INVENTS_FACTS]} for r in repliqa_rows(4)]
    overrides = ["experiment=local", f"judge={judge}", f"dataset.files=[{repliqa_parquet(rows=data)}]",
                 "dataset.train_size=2", "dataset.val_size=2"]
    for reward in ("rubric", "qa_rubric"):
        config = compose_config([*overrides, f"reward={reward}"])
        val, train = load_splits(config.dataset)
        with pytest.raises(ConfigError, match=rf"judge={judge} scores rubrics lexically and can't read the dataset's "
                                              r"positive_rubrics 'Keeps the cost.' \(document doc\d+\).*LLM judge"):
            check_documents(config, val + train)
    check_documents(compose_config([*overrides, "reward=qa"]), val + train)  # no rubric term: nothing to read
    check_documents(compose_config([*overrides, "reward=rubric", "judge=embedded"]), val + train)  # an LLM reads them
    # Rubrics in the lexical judge's own form are scored as it wrote them.
    own = Document(id="d1", topic="", text=DOC.text, questions=DOC.questions, positive_rubrics=("Mentions Okafor.",),
                   negative_rubrics=(INVENTS_FACTS,))
    check_documents(compose_config([*overrides, "reward=rubric"]), [own])
    (score,) = asyncio.run(offline().score_group(own, [FAITHFUL]))
    assert score.reward == 1.0
    # Any other caller still fails loudly rather than scoring a constant: a bug in that caller, not a config error.
    with pytest.raises(ValueError, match="the lexical judge can't score the rubric 'Keeps the cost.'"):
        asyncio.run(offline().score_group(val[0], [FAITHFUL]))


def test_prepare_prints_each_rubric_terms_own_judge_cost(fake, tmp_path, capsys):
    """Two rubric terms share one judge: the second term's line counted the first term's calls too (3, then 6)."""
    import io

    from summrl.rewards.rubric import prepare

    docs = [Document(f"d{i}", "", f"Ruth Okafor opened bridge {i} on March 14, 2024 for 1{i}0 people.", ())
            for i in range(3)]
    terms = [f"+reward.terms.r{n}={{kind: rubric, weight: 0.1, max_rubrics: {n}, cache_dir: {tmp_path / 'rubrics'}}}"
             for n in (4, 8)]
    config = compose_config(["experiment=local", "judge=openai_compatible", f"judge.api_base={fake.base_url}",
                             "judge.model=openai/gpt-4o-mini", "judge.cache_dir=null", "reward=weighted", *terms])
    asyncio.run(prepare(config, docs, stdin=io.StringIO("y\ny\n")))
    assert writing_calls(fake) == 6
    written = [line for line in capsys.readouterr().out.splitlines() if "rubrics written into" in line]
    assert [line.split("judge cost ")[1].split(" in ")[1] for line in written] == ["3 calls", "3 calls"]


def test_rubrics_that_weigh_nothing_are_refused_before_training_or_leave_that_documents_reward_missing(repliqa_parquet):
    """positive_weight=0 and a document with positive rubrics only: its weighted mean is undefined. Dataset rubrics
    are refused before any model loads; rubrics a judge writes can't be known then, so that document's reward is
    missing (counted, never trained on), and the run goes on."""
    from summrl.data import load_splits
    from summrl.rewards.rubric import RubricReward
    from tests.conftest import repliqa_rows

    data = [{**r, "positive_rubrics": ["Mentions Okafor."]} for r in repliqa_rows(4)]  # no negatives column
    config = compose_config(["experiment=local", "reward=rubric", "reward.positive_weight=0",
                             f"dataset.files=[{repliqa_parquet(rows=data)}]", "dataset.train_size=2",
                             "dataset.val_size=2"])
    val, train = load_splits(config.dataset)
    with pytest.raises(ConfigError, match=r"reward.positive_weight=0.0, reward.negative_weight=4.0: document doc\d+'s "
                                          r"dataset rubrics \(1 positives, 0 negatives\) would all weigh 0"):
        check_documents(config, val + train)

    class WritesPositivesOnly:
        rubric_writer = None

        async def write_rubrics(self, document, max_rubrics):
            return Rubrics(("Mentions Okafor.",), ())

    reward = RubricReward(WritesPositivesOnly(), max_rubrics=8, positive_weight=0.0, negative_weight=1.0, cache_dir=None)
    scores = asyncio.run(reward.score_group(DOC, [FAITHFUL, FAITHFUL]))
    assert [type(s).__name__ for s in scores] == ["Missing", "Missing"]
    assert scores[0].kind == "RubricsWeighNothing" and "raise a weight" in scores[0].error


class Fixed:
    def __init__(self, values, kind="RateLimitError", metric="own"):
        self.values, self.kind, self.metric = values, kind, metric

    async def score_group(self, document, summaries):
        return [Missing("judge down", self.kind) if v is None else Score(v, {self.metric: v, "only_mine": v},
                                                                         {"note": str(v)})
                for v in self.values]


def test_a_weighted_sum_with_a_missing_term_is_missing_with_the_terms_kind():
    weighted = WeightedReward({"qa": (1.0, Fixed([0.5, 0.5])), "rubric": (0.2, Fixed([1.0, None], kind="Timeout"))})
    whole, missing = asyncio.run(weighted.score_group(DOC, ["a", "b"]))
    assert whole.reward == pytest.approx(0.7) and whole.metrics["reward_qa"] == 0.5
    assert whole.metrics["reward_rubric"] == 1.0
    assert isinstance(missing, Missing) and "term rubric: judge down" in missing.error and missing.kind == "Timeout"


def test_weighted_terms_side_metrics_are_kept_apart():
    weighted = WeightedReward({"strict": (1.0, Fixed([0.25])), "loose": (1.0, Fixed([0.75])),
                               "other": (1.0, Fixed([1.0], metric="solo"))})
    (score,) = asyncio.run(weighted.score_group(DOC, ["a"]))
    # "own" and "only_mine" come from two or more terms: each kept under its term's name; "solo" from one: as it is
    assert {k: v for k, v in score.metrics.items() if "own" in k} == {"strict_own": 0.25, "loose_own": 0.75}
    assert score.metrics["solo"] == 1.0 and score.metrics["other_only_mine"] == 1.0
    assert (score.metrics["reward_strict"], score.metrics["reward_loose"]) == (0.25, 0.75)
    assert score.metadata == {"strict_note": "0.25", "loose_note": "0.75", "other_note": "1.0"}


def test_reward_weighted_composes_from_the_command_line():
    from summrl.rewards.qa import QAReward

    config = compose_config(["experiment=local", "reward=weighted", "+reward.terms.rubric.kind=rubric",
                             "+reward.terms.rubric.weight=0.2"])
    assert {name: (term.reward.kind, term.weight) for name, term in config.reward.terms.items()} == {
        "qa": ("qa", 1.0), "rubric": ("rubric", 0.2)}
    built = build_reward(config.reward, LexicalJudge(), SummaryPrompt.of(config.trainer))
    assert isinstance(built.terms["qa"][1], QAReward) and isinstance(built.terms["rubric"][1], RubricReward)
    (score,) = asyncio.run(built.score_group(DOC, [FAITHFUL]))
    assert score.reward == pytest.approx(score.metrics["reward_qa"] + 0.2 * score.metrics["reward_rubric"])
    assert compose_config(["experiment=local", "reward=weighted"]).reward.terms["qa"].weight == 1.0  # qa alone


def test_val_keeps_its_qa_accuracy_when_two_qa_terms_log_theirs_apart():
    from summrl.rewards import WithQAMetrics

    config = compose_config(["experiment=local", "reward=qa_rubric", "reward.terms.rubric.kind=qa",
                             "+reward.terms.rubric.include_unanswerable=false"])
    val = build_val_reward(config, LexicalJudge())
    assert isinstance(val, WithQAMetrics)
    (score,) = asyncio.run(val.score_group(DOC, [FAITHFUL]))
    assert score.metrics["qa_accuracy"] == score.metrics["qa_qa_accuracy"] == score.metrics["rubric_qa_accuracy"] == 1.0
    assert not isinstance(build_val_reward(compose_config(["experiment=local", "reward=qa_rubric"]), LexicalJudge()),
                          WithQAMetrics)  # its qa term gives them


def test_val_qa_of_a_reward_without_a_qa_term_reads_the_trainer_val_qa_settings():
    """reward=rubric's (or ruler's) val QA was built with fixed defaults: forbid_han=true rejected every Chinese
    summary, so val/qa_accuracy was 0 whatever was learned, and no setting changed it (found by an audit)."""
    zh = Document(id="zh", topic="", text="市议会周一批准了三百万元的港口预算。",
                  questions=(Question("q", "预算多少？", "三百万元", ""),))
    summary = "市议会批准了三百万元的港口预算。"

    def val_qa(*overrides: str) -> dict:
        config = compose_config(["experiment=local", "reward=rubric", "reward.cache_dir=null", *overrides])
        (score,) = asyncio.run(build_val_reward(config, LexicalJudge()).score_group(zh, [summary]))
        return score.metrics

    assert (val_qa()["qa_accuracy"], val_qa()["rejected_han"]) == (0.0, 1.0)  # Summary-RL's rules, as reward=qa's
    assert val_qa("trainer.val_qa_forbid_han=false")["qa_accuracy"] == 1.0
    assert val_qa("trainer.val_qa_forbid_han=false", "trainer.val_qa_max_chars=10")["rejected_too_long"] == 1.0
    # a reward with one QA term is measured by it: the val_qa settings say so, and another value is refused
    config = compose_config(["experiment=local", "reward=qa_rubric", "+reward.terms.qa.forbid_han=false"])
    assert (config.trainer.val_qa_forbid_han, config.trainer.val_qa_max_chars) == (False, 3000)
    with pytest.raises(ConfigError, match=r"trainer.val_qa_max_chars: is 100, but val QA is the reward's QA term, "
                                          r"with reward.max_chars=3000: set reward.max_chars"):
        compose_config(["experiment=local", "reward=qa", "trainer.val_qa_max_chars=100"])
    # a weighted reward's term holds only its YAML's keys: the fix named works whether the key is there or not
    with pytest.raises(ConfigError, match=r"set \+\+reward.terms.qa.max_chars=100 ") as refused:
        compose_config(["experiment=local", "reward=qa_rubric", "trainer.val_qa_max_chars=100"])
    fix = re.search(r"(\+\+reward\S+)", str(refused.value)).group(1)
    assert compose_config(["experiment=local", "reward=qa_rubric", fix, "trainer.val_qa_max_chars=100"])
    # reward=length_penalized has no key for its base's settings: the fix it names can be set
    with pytest.raises(ConfigError, match=r"compose reward=weighted with its QA term's "
                                          r"\+reward.terms.qa.forbid_han=False") as refused:
        compose_config(["experiment=local", "reward=length_penalized", "trainer.val_qa_forbid_han=false"])
    fix = re.search(r"(\+reward\S+)", str(refused.value)).group(1)
    assert compose_config(["experiment=local", "reward=weighted", fix]).trainer.val_qa_forbid_han is False


@pytest.mark.parametrize("overrides,expected", [
    (["reward=qa"], (0.0, 1.0)),
    (["reward=rubric"], (0.0, 1.0)),
    (["reward=qa_rubric"], (0.0, 1.2)),
    (["reward=length_penalized"], (-math.inf, 1.0)),
    (["reward=length_penalized", "reward.shape=hard", "reward.strength=5"], (0.0, 1.0)),
    (["reward=qa_rubric", "reward.terms.rubric.weight=-0.5"], (-0.5, 1.0)),
    (["reward=weighted", "+reward.terms.cap.kind=length", "+reward.terms.cap.shape=hard",
      "+reward.terms.rubric.kind=rubric", "+reward.terms.rubric.weight=-2"], (-2.0, 1.0)),
    (["reward=weighted", "+reward.terms.length.kind=length", "+reward.terms.length.weight=-1"], (0.0, math.inf)),
])
def test_reward_range(overrides, expected):
    assert reward_range(compose_config(["experiment=local", *overrides]).reward) == pytest.approx(expected)


@pytest.mark.parametrize(
    "override,key",
    [
        ("reward.terms.rubric.weight=abc", "reward.terms.rubric.weight: must be a number"),
        ("reward.terms.rubric.kind=nope", "reward.terms.rubric.kind: must be one of qa, ruler, rubric, length"),
        ("~reward.terms.qa ~reward.terms.rubric", "reward.terms: must name at least one term"),
        ("+reward.terms.rubric.max_rubrics=0", "reward.terms.rubric.max_rubrics"),
        ("+reward.terms.rubric.max_rubrcs=3", "reward.terms.rubric.max_rubrcs is not a setting"),
        ("+reward.terms.rubric.negative_weight=-1", "reward.terms.rubric.negative_weight: must be >= 0"),
        ("~reward.terms.qa ~reward.terms.rubric +reward.terms.cap.kind=length +reward.terms.cap.shape=hard",
         "reward.terms.cap.shape: hard multiplies the other terms' sum"),
    ],
)
def test_bad_weighted_config_fails_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("(", r"\(")):
        compose_config(["experiment=local", "reward=qa_rubric", *override.split()])


@pytest.mark.parametrize("override,key", [
    ("reward.negative_weight=-1", "reward.negative_weight: must be >= 0, got -1"),
    ("reward.positive_weight=-0.5", "reward.positive_weight: must be >= 0, got -0.5"),
    ("reward.positive_weight=0 reward.negative_weight=0", "reward.positive_weight: must be > 0 when reward.negative"),
])
def test_bad_rubric_weights_name_their_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_config(["experiment=local", "reward=rubric", *override.split()])


def test_no_negative_rubric_is_an_answer_and_a_large_group_gets_room_for_its_scores(fake, tmp_path):
    """Found by an audit: the prompt asks for "up to n" negatives, but none was refused as the wrong shape (asked
    again, paid each time, the document's reward missing for the run); and a group's scores were asked for in at most
    1024 tokens, which 16 summaries x 16 rubrics overran (1286 tokens): every reply cut off, every group missing."""
    fake.script = [Reply(json.dumps({"positive_rubrics": ["Keeps the cost."], "negative_rubrics": []})),
                   Reply(json.dumps({"rubric_scores": [[1], [0]]}))]
    judge = llm_judge(fake)
    scores = asyncio.run(judge_reward(fake, tmp_path, judge=judge).score_group(DOC, ["a", "b"]))
    assert [s.reward for s in scores] == [1.0, 0.0] and writing_calls(fake) == 1 and judge.client.usage.retries == 0
    assert fake.requests[-1]["max_tokens"] == 1024  # a small group: as before (its cached replies stay keyed so)
    asyncio.run(judge_reward(fake, tmp_path / "other").score_group(DOC, [f"summary {i}" for i in range(16)]))
    assert "\nR16. " in prompts(fake)[-1] and fake.requests[-1]["max_tokens"] >= 8 * 16 * 16
