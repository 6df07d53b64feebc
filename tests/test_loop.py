"""The loop's data order: seeded, reproducible, and continued exactly on resume."""

from __future__ import annotations

import json
import random

from summrl.config import TrainerConfig
from summrl.data import Document
from summrl.loop import training_batches

DOCS = [Document(id=f"d{i}", topic="t", text="x", questions=()) for i in range(10)]


def order(trainer: TrainerConfig, initial_step: int = 0, steps: int = 8, seed: int = 5) -> list[list[str]]:
    batches = training_batches(DOCS, trainer, seed, initial_step)
    return [[d.id for d in next(batches).items] for _ in range(steps)]


def test_same_seed_same_order_despite_global_random():
    trainer = TrainerConfig(groups_per_step=3)
    first = order(trainer)
    random.seed(12345)  # the global state does not matter
    assert order(trainer) == first
    assert order(trainer, seed=6) != first


def test_resume_continues_the_same_order():
    trainer = TrainerConfig(groups_per_step=3)
    full = order(trainer, steps=8)
    assert order(trainer, initial_step=5, steps=3) == full[5:8]


def test_every_document_once_per_epoch():
    trainer = TrainerConfig(groups_per_step=5)
    epoch = [d for batch in order(trainer, steps=2) for d in batch]
    assert sorted(epoch) == sorted(d.id for d in DOCS)


def test_json_schema_strings_get_a_length_bound():
    from summrl.backends.embedded.engine import bound_strings

    schema = {"type": "object", "$defs": {"S": {"type": "object", "properties": {
        "explanation": {"type": "string"}, "id": {"type": "string", "maxLength": 5}, "kind": {"type": "string", "enum": ["a"]}}}},
        "properties": {"scores": {"type": "array", "items": {"$ref": "#/$defs/S"}}}}
    bounded = bound_strings(schema, 300)
    props = bounded["$defs"]["S"]["properties"]
    assert props["explanation"]["maxLength"] == 300 and props["id"]["maxLength"] == 5 and "maxLength" not in props["kind"]
    assert "maxLength" not in schema["$defs"]["S"]["properties"]["explanation"]  # the caller's schema is untouched
    # a schema's own minLength past the bound: it was refused as "minLength 400 is greater than maxLength 300"
    assert bound_strings({"type": "string", "minLength": 400}, 300) == {"type": "string", "minLength": 400,
                                                                       "maxLength": 400}
    # a nullable string was left unbounded (JSON Schema applies maxLength to the string alone)
    assert bound_strings({"type": ["string", "null"]}, 300) == {"type": ["string", "null"], "maxLength": 300}


def group_of(n: int) -> "art.TrajectoryGroup":
    import art

    return art.TrajectoryGroup(art.Trajectory(messages_and_choices=[{"role": "assistant", "content": f"s{i}"}], reward=0.0)
                               for i in range(n))


def test_a_group_keeps_its_scored_rollouts_and_leaves_out_the_missing():
    from summrl.loop import scored_groups
    from summrl.rewards import Missing, Score

    groups = [group_of(4), group_of(4), group_of(4), group_of(4)]
    scores = [
        [Score(0.1), Score(0.5), Score(0.9), Score(0.3)],  # complete: kept as it is
        [Score(0.2), Missing("judge down", "Timeout"), Score(0.8), Missing("judge down", "Timeout")],  # 2 scored: kept
        [Score(0.7), Missing("x", "RateLimitError"), Missing("x", "RateLimitError"), Missing("x", "RateLimitError")],
        [Missing("x", "ReplyShapeError")] * 4,
    ]
    kept, dropped, missing = scored_groups(groups, scores, min_scored=2)
    assert (dropped, missing) == (2, 9)
    assert [[t.reward for t in g.trajectories] for g in kept] == [[0.1, 0.5, 0.9, 0.3], [0.2, 0.8]]
    assert [t.messages_and_choices[0]["content"] for t in kept[1].trajectories] == ["s0", "s2"]  # the graded ones
    # val counts every scored summary: the lone survivor of the third group too
    kept, dropped, missing = scored_groups([group_of(4), group_of(4)], scores[2:], min_scored=1)
    assert (dropped, missing, [t.reward for g in kept for t in g.trajectories]) == (1, 7, [0.7])


def test_the_missing_reward_message_names_the_judge_once_and_fits_its_advice_to_the_errors():
    import pytest

    from summrl.missing_rewards import MissingRewards, MissingRewardsError
    from summrl.rewards import Missing
    from tests.conftest import compose_config

    judge = compose_config(["judge=openai_compatible", "judge.model=openai/fake-judge", "judge.api_key_env=FAKE_KEY",
                            "judge.timeout_s=7"]).judge

    def message(*missing: Missing) -> str:
        window = MissingRewards(window=4, max_rate=0.0)
        window.add(missing)
        with pytest.raises(MissingRewardsError) as e:
            window.check(judge)
        return str(e.value)

    named = "judge openai/fake-judge failed after 1 attempt(s): AuthenticationError: 401"
    refused = message(Missing(named, "AuthenticationError"), Missing(named, "AuthenticationError"))
    assert refused.count("openai/fake-judge") == 1 and "last error: " + named in refused
    assert "check the key in FAKE_KEY" in refused
    assert "max_retries" not in refused and "timeout_s" not in refused and "judge.model" not in refused
    assert "check the key in FAKE_KEY" in message(Missing("judge openai/fake-judge: FAKE_KEY is not set", "MissingKey"))
    # an error that does not name the judge: the message does, once
    slow = message(Missing("Request timed out", "Timeout"))
    assert slow.count("openai/fake-judge") == 1 and "raise judge.timeout_s (now 7.0)" in slow
    assert "max_concurrency" not in slow and "FAKE_KEY" not in slow
    limited = message(Missing("429", "RateLimitError"))
    assert "lower judge.max_concurrency (now 8) or raise judge.max_retries (now 5)" in limited
    assert "timeout_s" not in limited
    for shape in ("ReplyShapeError", "JSONDecodeError", "ValueError", "ValidationError"):  # QA's and RULER's
        advice = message(Missing("wrong", shape)).split("To fix: ")[1]
        assert advice.startswith("the judge model ignores the reply format") and "try another judge.model" in advice
        assert "max_retries" not in advice and "timeout_s" not in advice
    down = message(Missing("500", "InternalServerError"))
    assert "check that the judge is up, or raise judge.max_retries (now 5)" in down
    # rubrics that weigh nothing: no judge failed, and no retry would help (it said to raise judge.max_retries)
    weightless = message(Missing("its rubrics all weigh 0", "RubricsWeighNothing")).split("To fix: ")[1]
    assert weightless.startswith("a document's rubrics all weigh 0: raise the rubric reward's reward.positive_weight "
                                 "or reward.negative_weight")
    assert "max_retries" not in weightless and "judge is up" not in weightless


def test_missing_reward_limit_is_judged_over_a_window_and_says_what_failed():
    import pytest

    from summrl.missing_rewards import MissingRewards, MissingRewardsError
    from summrl.rewards import Missing, Score
    from tests.conftest import compose_config

    judge = compose_config(["judge=openai_compatible", "judge.api_base=http://127.0.0.1:9/v1"]).judge
    window = MissingRewards(window=16, max_rate=0.25)  # stops past 4 missing of the last 16
    window.add([Missing("e", "Timeout"), Missing("e", "Timeout"), Score(1.0), Score(0.0)])
    window.check(judge)  # 2 of 4 is 50% of one step, but not past the window's limit
    window.add([Score(1.0)] * 14)  # the two failures slide out of the window
    window.add([Missing("e", "RateLimitError")] * 3 + [Missing("e", "ReplyShapeError")])
    window.check(judge)  # 4 of the last 16: at the limit, not past it
    window.add([Missing("bad reply\nsecond line", "ReplyShapeError")])
    with pytest.raises(MissingRewardsError) as e:
        window.check(judge)
    message = str(e.value)
    assert "5 of the last 16 rollouts have no reward" in message and "\n" not in message
    assert "RateLimitError x3, ReplyShapeError x2" in message and "Timeout" not in message
    assert "last error: bad reply second line" in message
    assert f"The judge {judge.model} at http://127.0.0.1:9/v1 failed with" in message
    # what to do fits what happened, the most frequent first: rate limits, then wrong shapes; nothing about timeouts
    fixes = message.split("To fix: ")[1]
    assert fixes.index("lower judge.max_concurrency (now 8) or raise judge.max_retries (now 5)") < fixes.index(
        "try another judge.model")
    assert "timeout_s" not in fixes and "trainer.max_missing_reward_rate" in fixes
    assert window.record() == {"scored": 16, "missing": 7,
                               "missing_by_error": {"Timeout": 2, "RateLimitError": 3, "ReplyShapeError": 2}}


def test_a_run_that_trained_nothing_says_why_and_what_to_change():
    """Every step's groups scored alike (GRPO had no advantage): the end-of-run warning names the cause. With RULER
    judged by the embedded 135M model (experiment=local's judge), the judge is why; otherwise the reward."""
    from summrl.loop import nothing_learned
    from tests.conftest import compose_config

    ruler = nothing_learned(compose_config(["experiment=local", "reward=ruler"]), [17, 18])
    assert ruler.startswith("summrl: steps 17-18 trained nothing")
    assert "judge=local's embedded model gave every summary of a group the same RULER score" in ruler
    assert "judge=gemini_flash" in ruler
    qa = nothing_learned(compose_config(["experiment=local"]), [1])
    assert qa.startswith("summrl: step 1 trained nothing") and "reward=qa gave every summary" in qa
    assert "RULER" not in qa
    # the option chosen, not the weighted reward it is composed into (found by an audit)
    penalized = nothing_learned(compose_config(["experiment=local", "reward=length_penalized"]), [1], "length_penalized")
    assert "reward=length_penalized gave every summary" in penalized


def test_a_run_whose_epochs_end_before_max_steps_says_so_when_it_starts(caplog):
    """ART's iterate_dataset stops after trainer.num_epochs passes: the run ended early, "completed", silently."""
    import logging

    from summrl.loop import warn_short_run
    from tests.conftest import compose_config, said

    config = compose_config(["experiment=local", "trainer.num_epochs=1", "trainer.max_steps=40"])
    with caplog.at_level(logging.INFO, logger="summrl"):
        warn_short_run(config, 32)
        assert said(caplog, logging.WARNING) == (
            "summrl: 32 train documents at trainer.groups_per_step=2 for trainer.num_epochs=1 make 16 steps: the run "
            "ends there, before trainer.max_steps=40 (raise trainer.num_epochs or the train size)")
        caplog.clear()
        warn_short_run(compose_config(["experiment=local", "trainer.num_epochs=1", "trainer.max_steps=16"]), 32)
        assert said(caplog, logging.WARNING) == ""


def test_best_compares_the_val_scores_measured_as_the_latest_was():
    """After online learning a run's history holds two val sets: the best of both mixed RULER on 4 inbox documents
    with QA accuracy on the original split."""
    from summrl.job import comparable

    history = [{"step": 0, "val_reward": 0.3}, {"step": 3, "val_reward": 0.9},
               {"step": 3, "val_reward": 0.5, "val_set": "inbox:ruler"}, {"step": 4, "val_reward": 0.6,
                                                                         "val_set": "inbox:ruler"}]
    assert [h["step"] for h in comparable(history)] == [3, 4]
    assert [h["step"] for h in comparable(history[:2])] == [0, 3] and comparable([]) == []


def test_an_online_val_set_of_other_documents_or_another_judge_is_another_val_set():
    """The key was inbox:<reward> alone: after a rotated inbox (its watermark deleted, as the refusal says), the new
    val documents' scores were ranked with the old ones' (best_val_score 0.593 was step 9's on the old documents), and
    the starting checkpoint was not scored on the new ones (scored_at found the old pass)."""
    from summrl.data import Document
    from summrl.job import comparable
    from summrl.loop import scored_at, val_set
    from tests.conftest import compose_config

    def docs(*ids):
        return [Document(id=i, topic="", text=f"document {i}", questions=()) for i in ids]

    config = compose_config(["experiment=local", "dataset=inbox", "reward=ruler"])
    key = val_set(config, docs("d0", "d1"))
    assert key.startswith("inbox:ruler:") and key == val_set(config, docs("d1", "d0"))
    rotated = val_set(config, docs("d100", "d101"))
    judged = val_set(compose_config(["experiment=local", "dataset=inbox", "reward=ruler", "judge=embedded"]),
                     docs("d0", "d1"))
    assert len({key, rotated, judged}) == 3
    # every setting a score depends on is in it (the report's "not on one scale"); an operational one is not
    other = [val_set(compose_config(["experiment=local", "dataset=inbox", *args]), docs("d0", "d1")) for args in (
        ["reward=qa"], ["reward=qa", "judge.min_recall=0.3"], ["reward=qa", "reward.max_chars=100"],
        ["reward=ruler", "trainer.val_qa_forbid_han=false"], ["reward=ruler", "trainer.max_words=100"],
        ["reward=ruler", "dataset.questions.per_document=3"])]  # other written questions: val QA on another scale
    assert len({key, *other}) == 7
    rubric = val_set(compose_config(["experiment=local", "dataset=inbox", "reward=rubric"]), docs("d0", "d1"))
    assert rubric == val_set(compose_config(["experiment=local", "dataset=inbox", "reward=rubric",
                                             "reward.cache_dir=/elsewhere", "judge.max_retries=9"]), docs("d0", "d1"))
    assert val_set(compose_config(["experiment=local"]), docs("d0")) is None  # the run's own val split
    history = [{"step": 9, "val_reward": 0.593, "val_set": "inbox:ruler"},  # recorded before the digest
               {"step": 11, "val_reward": 0.5, "val_set": key}]
    assert not scored_at(history, 11, rotated)  # the starting checkpoint is scored on the new val set
    history.append({"step": 11, "val_reward": 0.4, "val_set": rotated})
    history.append({"step": 12, "val_reward": 0.588, "val_set": rotated})
    assert [h["val_reward"] for h in comparable(history)] == [0.4, 0.588]


def test_a_history_row_a_crash_cut_short_does_not_swallow_the_resumed_runs_next_row(tmp_path):
    """ART appends to history.jsonl without looking at its end: the resumed run's first row joined the cut one on a
    line no reader parses, and step 2's val scores were missing from history.jsonl and W&B (found by an audit)."""
    from summrl.job import jsonl_rows
    from summrl.loop import end_cut_line, history_path, trainable_model
    from tests.conftest import compose_config

    config = compose_config(["experiment=local", "run.name=cut", f"run.dir={tmp_path}"])
    model = trainable_model(config)
    history = history_path(config)
    history.parent.mkdir(parents=True)
    whole = json.dumps({"training_step": 1, "val/reward": 0.4, "step": 1}) + "\n"
    history.write_text(whole + whole[:20])  # step 1's row, then one a power cut left half-written
    end_cut_line(history)
    model._log_metrics({"reward": 0.5}, "val", 2)  # what the resumed run's model.log writes
    assert [(r["step"], r["val/reward"]) for r in jsonl_rows(history.read_text())] == [(1, 0.4), (2, 0.5)]
    end_cut_line(history)  # a whole file: nothing added
    assert history.read_text().count("\n") == 3
