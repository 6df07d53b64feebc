"""The litellm judge against a scripted server on loopback: answers, grading, retries, cache, cost,
the missing-reward policy, and API keys that never leak."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import art
import litellm
import pytest

from summrl.data import Document, Question
from summrl.judges.client import JudgeClient, JudgeError, ReplyShapeError
from summrl.judges.llm import LLMJudge
from summrl.backends import takes_burst_tags
from summrl.loop import MissingRewardsError, Session, sample_and_score
from summrl.prompt import SummaryPrompt
from summrl.rewards import Missing
from summrl.rewards.qa import QAReward
from summrl.rewards.ruler import RulerReward
from summrl.rollout import sample_seed
from summrl.tracking import Tracker
from tests.conftest import compose_config
from summrl.testing import FakeLLM, Reply

FACTS = SummaryPrompt("facts", 350)  # experiment=local's prompt

SECRET = "sk-test-SECRET-4242"
DOC = Document(
    id="d1", topic="Local News", text="Ruth Okafor opened the Hollis Footbridge on March 14, 2024.",
    questions=(
        Question("d1-q1", "Who opened the bridge?", "Ruth Okafor", ""),
        Question("d1-q2", "When did it open?", "March 14, 2024", ""),
        Question("d1-q3", "Who paid for lunch?", "UNANSWERABLE", "NA"),
    ),
)


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def secret_env(monkeypatch):
    monkeypatch.setenv("FAKE_JUDGE_KEY", SECRET)


def client(fake: FakeLLM, **kwargs) -> JudgeClient:
    defaults = dict(model="openai/gpt-4o-mini", api_key_env="FAKE_JUDGE_KEY", api_base=fake.base_url,
                    retry_base_s=0.01, retry_max_s=0.05, timeout_s=5.0, max_retries=3)
    return JudgeClient(**{**defaults, **kwargs})


def grade(judge: LLMJudge, summary: str = "Ruth Okafor opened it."):
    return asyncio.run(judge.grade(summary, DOC.questions))


def test_answers_then_grades_only_what_does_not_already_match(fake, secret_env):
    fake.script = [
        Reply(json.dumps({"answers": ["ruth okafor", "In March 2024", "UNANSWERABLE"]})),
        Reply(json.dumps({"correct": [False]})),
    ]
    judge = LLMJudge(client(fake))
    assert grade(judge) == [True, False, True]
    assert len(fake.requests) == 2
    grading_prompt = fake.requests[1]["messages"][-1]["content"]
    assert "In March 2024" in grading_prompt and "Ruth Okafor opened" not in grading_prompt  # no document, no summary
    assert "Candidate 2" not in grading_prompt  # only the one answer that did not match was graded
    assert fake.requests[0]["temperature"] == 0
    assert fake.headers[0]["authorization"] == f"Bearer {SECRET}"


def test_a_reply_with_a_raw_newline_inside_a_string_is_read_without_a_retry(fake, secret_env):
    """Greedy (temperature 0) retries get the same reply: one a strict parser refuses failed every attempt."""
    fake.script = [Reply('{"answers": ["Ruth Okafor", "March 14,\t2024", "UNANSWERABLE\n"]}')]
    assert grade(LLMJudge(client(fake))) == [True, True, True]
    assert len(fake.requests) == 1  # no retry


def test_a_fenced_reply_with_prose_around_it_is_read_without_a_retry(fake, secret_env):
    """A judge that ignores response_format may write a line before its fenced JSON and one after: at temperature 0
    each retry got the same reply, so the call failed every attempt, paid each time."""
    answers = json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]}, indent=1)
    fake.script = [Reply(f"Here are the answers:\n\n```json\n{answers}\n```\nLet me know if you need more.")]
    judge = LLMJudge(client(fake))
    assert grade(judge) == [True, True, True]
    assert len(fake.requests) == 1 and judge.client.usage.failures == 0


def test_bare_json_with_a_line_after_it_is_read_without_a_retry(fake, secret_env):
    """Bare JSON then "I hope this helps!" was refused as extra data: retried, paid for, and failed every attempt."""
    answers = json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]})
    fake.script = [Reply(f"{answers}\nI hope this helps! {{see above}}")]
    judge = LLMJudge(client(fake))
    assert grade(judge) == [True, True, True]
    assert len(fake.requests) == 1 and judge.client.usage.failures == 0


def test_all_matching_answers_need_one_call(fake, secret_env):
    fake.script = [Reply(json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "unanswerable"]}))]
    assert grade(LLMJudge(client(fake))) == [True, True, True]
    assert len(fake.requests) == 1


def test_superscripts_and_units_written_as_marks_are_graded_not_matched():
    """NFKC wrote 10⁸ as 108 and 10² as 102, and 5" lost its mark as punctuation: "3 x 108" matched the gold "3 x 10⁸"
    and was marked correct with no grading call (an audit). Such answers have no key: they are graded."""
    from summrl.judges.llm import normalize

    for marked, plain in (("3 x 10⁸", "3 x 108"), ("10² km", "102 km"), ("H₂O", "H2O"), ('5"', "5"), ("6′", "6")):
        assert normalize(marked) == "" and normalize(plain) != "", (marked, plain)  # either way round: graded
    assert normalize("ＲＵＴＨ OKAFOR.") == normalize("Ruth Okafor") == "ruth okafor"  # full width still matches
    assert normalize("2,100 people") == normalize("2100 people")


def test_answers_that_differ_in_a_sign_a_currency_or_another_script_are_graded_not_matched(fake, secret_env):
    """The no-call shortcut once kept only [a-z0-9]: "€5 million" matched "£5 million", "3%" matched "-3%", and any
    answer in Chinese matched any Chinese gold, all marked correct without a grading call."""
    doc = Document(id="d2", topic="Finance", text="x", questions=(
        Question("d2-q1", "How much was raised?", "£5 million", ""),
        Question("d2-q2", "How did the index move?", "-3%", ""),
        Question("d2-q3", "Which city?", "北京", ""),
        Question("d2-q4", "Which mark?", "?", ""),
        Question("d2-q5", "Who chaired it?", "Ruth Okafor", ""),
    ))
    fake.script = [Reply(json.dumps({"answers": ["€5 million", "3%", "東京", "!", "ＲＵＴＨ OKAFOR."]})),
                   Reply(json.dumps({"correct": [False, False, False, False]}))]
    assert asyncio.run(LLMJudge(client(fake)).grade("s", doc.questions)) == [False, False, False, False, True]
    assert len(fake.requests) == 2
    graded = fake.requests[1]["messages"][-1]["content"]
    for candidate in ("€5 million", "3%", "東京", "!"):
        assert f": {candidate}\n" in graded + "\n"
    assert "OKAFOR" not in graded  # full-width letters and a full stop still match with no call


def test_retries_429_and_5xx_with_backoff_honouring_retry_after(fake, secret_env):
    # 529 (Anthropic's "overloaded") and 522 (Cloudflare's, before OpenRouter) failed the call at once
    fake.script = [Reply(status=429, headers={"Retry-After": "0.3"}), Reply(status=503), Reply(status=500),
                   Reply(status=529), Reply(status=522),
                   Reply(json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]}))]
    judge = LLMJudge(client(fake, retry_max_s=1.0, max_retries=5))
    start = time.perf_counter()
    assert grade(judge) == [True, True, True]
    assert time.perf_counter() - start >= 0.3  # waited as Retry-After asked
    assert len(fake.requests) == 6 and judge.client.usage.retries == 5


def test_retry_after_waits_at_most_retry_max_s(fake, secret_env):
    fake.script = [Reply(status=429, headers={"Retry-After": "3600"}),
                   Reply(json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]}))]
    judge = LLMJudge(client(fake, retry_max_s=0.2))
    waits, wait_s = [], judge.client.wait_s
    judge.client.wait_s = lambda attempt, error: waits.append(wait_s(attempt, error)) or waits[-1]
    start = time.perf_counter()
    assert grade(judge) == [True, True, True]
    assert waits == [0.2]  # the server's hour, capped
    assert time.perf_counter() - start < 10  # and waited as such
    assert judge.client.usage.retries == 1


def test_an_error_no_retry_fixes_stops_after_the_one_attempt_it_made(fake, secret_env):
    fake.script = [Reply(status=401)] * 4
    judge = LLMJudge(client(fake, max_retries=3))
    with pytest.raises(JudgeError, match=r"failed after 1 attempt\(s\): AuthenticationError") as e:
        grade(judge)
    assert e.value.kind == "AuthenticationError" and len(fake.requests) == 1 and judge.client.usage.retries == 0
    assert SECRET not in str(e.value)
    fake.script = [Reply(status=500), Reply(status=401)]
    with pytest.raises(JudgeError, match=r"failed after 2 attempt\(s\)"):
        grade(LLMJudge(client(fake, max_retries=3)))


def test_timeouts_are_retried(fake, secret_env):
    fake.script = [Reply(delay_s=2.0), Reply(json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]}))]
    judge = LLMJudge(client(fake, timeout_s=0.5))
    assert grade(judge) == [True, True, True]
    assert judge.client.usage.retries == 1


def test_malformed_json_is_retried_then_fails_clearly(fake, secret_env):
    fake.script = [Reply("not json"), Reply(json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]}))]
    assert grade(LLMJudge(client(fake))) == [True, True, True]
    fake.script = [Reply("still not json")] * 4
    with pytest.raises(JudgeError, match="failed after 4 attempt"):
        grade(LLMJudge(client(fake)))


def test_replies_of_the_wrong_shape_are_retried_then_fail_clearly(fake, secret_env):
    good = Reply(json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]}))
    for bad in ({"answers": ["only one"]}, {"answers": "Ruth Okafor"}, {"replies": []}, ["Ruth Okafor"],
                {"answers": [None, None, None]}):
        fake.script = [Reply(json.dumps(bad)), good]
        judge = LLMJudge(client(fake))
        assert grade(judge) == [True, True, True], bad
        assert judge.client.usage.retries == 1
    fake.script = [Reply(json.dumps({"answers": ["only one"]}))] * 4
    with pytest.raises(JudgeError, match=r"failed after 4 attempt.*expected \{\"answers\": \[3 items\]\}"):
        grade(LLMJudge(client(fake)))


def test_a_json_reply_cut_off_at_max_tokens_fails_once_as_cut_not_as_bad_json(fake, secret_env):
    """A reply the server stopped at max_tokens was retried as malformed JSON (the same cut each time at temperature
    0, each paid), and the missing-reward advice blamed the judge model's reply format (found by an audit)."""
    from collections import Counter

    from summrl.missing_rewards import fixes

    cut = '{"answers": ["Ruth Okafor", "March 14'
    fake.script = [Reply(cut, finish_reason="length")] * 4
    judge = LLMJudge(client(fake))
    with pytest.raises(JudgeError, match=r"failed after 1 attempt\(s\): ReplyCutOff: the reply was cut off at "
                                         r"max_tokens=\d+ before its JSON ended") as raised:
        grade(judge)
    assert raised.value.kind == "ReplyCutOff" and len(fake.requests) == 1 and judge.client.usage.calls == 1
    (fix,) = fixes(Counter({"ReplyCutOff": 2}), judge.client)
    assert fix.startswith("the judge's replies are cut off at their max_tokens") and "reply format" not in fix
    # a whole JSON reply that ended exactly at the limit is read
    fake.script = [Reply(json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]}),
                         finish_reason="length")]
    assert grade(LLMJudge(client(fake))) == [True, True, True]


def test_free_text_calls_retry_like_json_ones_and_are_never_cached(fake, secret_env, tmp_path):
    """complete_text (an SFT teacher's summary): a 429 and a reply its check refuses are retried and counted;
    the same prompt asked twice is two calls, since each is a new sample."""
    def non_empty(text: str) -> str:
        if not text.strip():
            raise ReplyShapeError("an empty summary")
        return text

    fake.script = [Reply(status=429, headers={"Retry-After": "0"}), Reply("   "), Reply("A summary."), Reply("Another.")]
    teacher = client(fake, cache_dir=str(tmp_path))
    messages = [{"role": "user", "content": "Summarize the document."}]
    ask = lambda: asyncio.run(teacher.complete_text(messages, max_tokens=32, temperature=1.0, check=non_empty))  # noqa: E731
    assert ask() == ("A summary.", "stop") and teacher.usage.retries == 2
    assert ask()[0] == "Another." and len(fake.requests) == 4 and teacher.usage.cached_calls == 0
    # a reply that echoes the key (a broken endpoint): an SFT sample is stored and trained on (this stop's secrets
    # audit found the key in sft/summaries.jsonl and samples.jsonl), and a judge's reply is cached
    fake.script = [Reply(f"It says {SECRET}.")]
    assert ask()[0] == "It says ***." and SECRET not in str(teacher.usage.last_error)
    fake.script = [Reply("")] * 4
    with pytest.raises(JudgeError, match="failed after 4 attempt.*an empty summary") as failed:
        ask()
    assert failed.value.kind == "ReplyShapeError"


def test_client_errors_are_not_retried(fake, secret_env):
    fake.script = [Reply(status=400)]
    judge = LLMJudge(client(fake))
    with pytest.raises(JudgeError):
        grade(judge)
    assert len(fake.requests) == 1


def test_replies_are_cached_on_disk_across_clients(fake, secret_env, tmp_path):
    first = LLMJudge(client(fake, cache_dir=str(tmp_path / "cache")))
    grade(first)
    calls = len(fake.requests)
    second = LLMJudge(client(fake, cache_dir=str(tmp_path / "cache")))  # a rerun: a new process would look the same
    grade(second)
    assert len(fake.requests) == calls
    assert second.client.usage.cached_calls == calls and second.client.usage.calls == 0


def test_an_identical_call_in_flight_is_paid_for_once(fake, secret_env, tmp_path):
    """Two QA terms of a weighted reward (each its own client) ask the same answering call at once: both missed the
    cache, as neither reply was in it yet, and both were paid. The second now waits for the first's reply; a failed
    call fails both, and a cancelled one leaves the other to ask for itself."""
    fake.script = [Reply(json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]}))]
    judges = [LLMJudge(client(fake, cache_dir=str(tmp_path / "cache"))) for _ in range(2)]

    async def both():
        return await asyncio.gather(*(j.grade("Ruth Okafor opened it.", DOC.questions) for j in judges))

    assert asyncio.run(both()) == [[True, True, True]] * 2
    assert len(fake.requests) == 1
    assert [j.client.usage.cached_calls for j in judges] == [0, 1]

    fake.requests.clear()
    fake.script = [Reply(status=400)]  # a client error: not retried, the call fails
    results = asyncio.run(_grade_all(judges, "Other text."))
    assert len(fake.requests) == 1 and all(isinstance(r, JudgeError) for r in results)


async def _grade_all(judges, summary):
    return await asyncio.gather(*(j.grade(summary, DOC.questions) for j in judges), return_exceptions=True)


def test_a_cache_past_its_size_limit_evicts_no_paid_reply(fake, secret_env, tmp_path):
    """diskcache's default evicted the oldest replies of a cache past 1 GiB, to be paid for again. A cache that has
    reached its limit looks the same at a limit of 1 byte (stored in the cache, as an earlier opening left it)."""
    import diskcache

    diskcache.Cache(str(tmp_path / "cache"), size_limit=1).close()
    first = LLMJudge(client(fake, cache_dir=str(tmp_path / "cache")))
    summaries = [f"Ruth Okafor opened it, summary {i}." for i in range(12)]
    for summary in summaries:
        grade(first, summary)
    calls = len(fake.requests)
    assert len(first.client._cache) == calls, "paid replies were evicted"
    second = LLMJudge(client(fake, cache_dir=str(tmp_path / "cache")))
    for summary in summaries:
        grade(second, summary)
    assert len(fake.requests) == calls and second.client.usage.calls == 0
    assert second.client._cache.eviction_policy == "none"


def test_a_paid_reply_is_on_disk_before_the_rename_makes_it_the_cached_one(tmp_path, monkeypatch):
    """A power cut after the rename must not leave an empty cache file in place of a reply that was paid for."""
    import os

    from summrl.judges.cache import JsonCache

    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda src, dst: (events.append(("replace", str(src))), replace(src, dst))[1])
    cache = JsonCache(str(tmp_path))
    path = cache.path("model", "prompt")
    cache.write(path, {"reply": "paid"})
    assert [kind for kind, _ in events] == ["fsync", "replace"] and events[0][1] == events[1][1]
    assert cache.read(path) == {"reply": "paid"}

def test_tokens_and_cost_come_from_litellm(fake, secret_env):
    judge = LLMJudge(client(fake))
    grade(judge)
    usage = judge.usage_metrics()
    prices = litellm.model_cost["gpt-4o-mini"]
    expected = usage["judge/input_tokens"] * prices["input_cost_per_token"] + usage["judge/output_tokens"] * prices["output_cost_per_token"]
    assert usage["judge/calls"] == 2 and usage["judge/input_tokens"] > 0
    assert usage["judge/cost_usd"] == pytest.approx(expected)
    assert judge.usage_metrics()["judge/calls"] == 0  # reset per step


def test_a_failed_judge_call_leaves_the_reward_missing_not_zero(fake, secret_env):
    fake.script = [Reply(status=500)] * 2  # the summary's answering call and the baseline's
    reward = QAReward(LLMJudge(client(fake, max_retries=0)), max_chars=3000, forbid_han=True, include_unanswerable=True)
    scores = asyncio.run(reward.score_group(DOC, ["Ruth Okafor opened it."]))
    assert isinstance(scores[0], Missing) and "500" in scores[0].error


def test_api_key_never_reaches_errors_or_logs(fake, secret_env, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    fake.script = [Reply(status=401)]  # the server echoes the Authorization header in its body
    with pytest.raises(JudgeError) as e:
        grade(LLMJudge(client(fake)))
    assert "401" in str(e.value) or "Authentication" in str(e.value)
    captured = capsys.readouterr()
    for text in (str(e.value), repr(e.value), caplog.text, captured.out, captured.err):
        assert SECRET not in text


def test_a_key_litellm_reads_itself_never_reaches_errors_or_logs(fake, monkeypatch, caplog):
    """judge.api_key_env=null: litellm reads OPENAI_API_KEY itself; its value was not masked in the judge's error, the
    Missing reward's and usage.last_error (found by an audit)."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)  # stands in for api.openai.com
    fake.script = [Reply(status=401)] * 2  # the server echoes the Authorization header in its body
    judge_client = client(fake, api_key_env=None, api_base=None, max_retries=0)
    reward = QAReward(LLMJudge(judge_client), max_chars=None, forbid_han=False, include_unanswerable=True)
    (score,) = asyncio.run(reward.score_group(DOC, ["Ruth Okafor opened it."]))
    assert isinstance(score, Missing) and "401 for Bearer ***" in score.error
    for text in (score.error, judge_client.usage.last_error, caplog.text):
        assert SECRET not in text


def test_the_judges_mask_leaves_placeholder_keys_and_endpoints_readable(fake, monkeypatch):
    """Masking every variable litellm reads for the model garbled errors: with OPENAI_API_KEY=x (a local server behind
    OPENAI_BASE_URL) "exceeded" became "e***ceeded", and for ollama/llama3 OLLAMA_API_BASE's URL became ***."""
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    text = "Connection error: max retries exceeded (context exceeded)"
    assert client(fake, api_key_env=None, api_base=None).redact(text) == text
    monkeypatch.setenv("OLLAMA_API_BASE", "http://gpu-box:11434")
    ollama = client(fake, model="ollama/llama3", api_key_env=None, api_base=None)
    assert ollama.redact("Cannot connect to host http://gpu-box:11434/api/generate").endswith("gpu-box:11434/api/generate")


def test_missing_key_is_reported_by_name(fake, monkeypatch):
    monkeypatch.delenv("FAKE_JUDGE_KEY", raising=False)
    with pytest.raises(JudgeError, match="FAKE_JUDGE_KEY is not set"):
        grade(LLMJudge(client(fake)))


def policy_session(fake: FakeLLM, max_missing: float, window: int = 64, overrides: tuple[str, ...] = ()) -> Session:
    """The loop's scoring stage with a fake policy and a fake judge on the same loopback server."""
    config = compose_config(["experiment=local", f"trainer.max_missing_reward_rate={max_missing}",
                             f"trainer.missing_reward_window={window}", "judge=openai_compatible",
                             "judge.model=openai/gpt-4o-mini", *overrides])
    model = art.Model(name="fake-policy", project="tests", inference_base_url=fake.base_url, inference_api_key="x")
    judge = LLMJudge(client(fake, max_retries=0))
    reward = QAReward(judge, max_chars=3000, forbid_han=True, include_unanswerable=True)
    return Session(config=config, backend=None, model=model, judge=judge, reward=reward,  # type: ignore[arg-type]
                   val_reward=reward, tracker=Tracker(), tag_bursts=takes_burst_tags(config))


def test_groups_with_a_missing_reward_are_dropped_and_counted(fake, secret_env):
    docs = [DOC, Document(id="d2", topic="t", text="x", questions=DOC.questions)]
    session = policy_session(fake, max_missing=0.5)
    # 4 policy calls, then the judge: d1's first answering call fails, every other call answers.
    fake.script = [Reply(f"summary {k}") for k in range(4)] + [Reply(status=500)]  # (identical ones share a call)
    scored = asyncio.run(sample_and_score(session, docs, rollouts_per_doc=2, reward=session.reward))
    assert scored.missing_rewards == 1 and scored.dropped_groups == 1
    assert len(scored.groups) == 1 and all(t.reward > 0 for t in scored.groups[0].trajectories)
    assert scored.metrics()["judge/failed_rollouts"] == 1.0


def test_a_groups_summaries_keep_the_order_they_were_asked_for_whatever_order_they_finish(fake, secret_env):
    # ART gathers a group with asyncio.as_completed: the first reply here finishes last. The packed training row and
    # the judge's prompt follow the group's order, so a finishing order that varied from run to run made two runs of
    # one seed train differently.
    session = policy_session(fake, max_missing=1.0)
    fake.script = [Reply(f"reply {k}", delay_s=0.1 * (3 - k)) for k in range(4)]  # then the judge
    scored = asyncio.run(sample_and_score(session, [DOC], rollouts_per_doc=4, reward=session.reward, seed_key=(7,)))
    trajectories = scored.groups[0].trajectories
    # reply k went to the k-th request to arrive; each request's seed says which summary it was
    reply_for_seed = {fake.requests[k]["seed"]: f"reply {k}" for k in range(4)}
    assert [t.messages_and_choices[-1].message.content for t in trajectories] == \
        [reply_for_seed[sample_seed(7, DOC.id, i)] for i in range(4)]
    assert [t.metadata["sample"] for t in trajectories] == [0, 1, 2, 3]


def test_a_pass_is_sent_to_the_embedded_server_as_one_burst_and_to_other_servers_untagged(fake, secret_env):
    # The embedded batcher waits for a whole burst (a row's logits depend on the rows beside it); vLLM and W&B's
    # servers are not sent the extension. (A session per pass: a client's connections belong to one event loop.)
    docs = [DOC, Document(id="d2", topic="t", text="x", questions=DOC.questions)]
    for _ in range(2):
        session = policy_session(fake, max_missing=1.0)
        assert session.config.backend.kind == "embedded" and session.tag_bursts
        fake.script = [Reply("summary")] * 6
        asyncio.run(sample_and_score(session, docs, rollouts_per_doc=3, reward=session.reward))
    tags = [r["summrl_burst"] for r in fake.requests if r.get("model") == "fake-policy"]
    assert len(tags) == 12 and all(t["size"] == 6 for t in tags)
    assert len({t["id"] for t in tags[:6]}) == len({t["id"] for t in tags[6:]}) == 1 and tags[0]["id"] != tags[6]["id"]
    fake.requests.clear()
    session = policy_session(fake, max_missing=1.0)
    session.tag_bursts = takes_burst_tags(compose_config(["backend=local_gpu"]))
    fake.script = [Reply("summary")] * 2
    asyncio.run(sample_and_score(session, [DOC], rollouts_per_doc=2, reward=session.reward))
    assert [r for r in fake.requests if "summrl_burst" in r] == [] and len(fake.requests) >= 2


def test_too_many_missing_rewards_stop_the_run_naming_the_judge(fake, secret_env):
    session = policy_session(fake, max_missing=0.2, window=5)  # past 1 missing of the last 5
    fake.script = [Reply("summary")] * 2 + [Reply(status=503)] * 2
    with pytest.raises(MissingRewardsError) as e:
        asyncio.run(sample_and_score(session, [DOC], rollouts_per_doc=2, reward=session.reward))
    assert "openai/gpt-4o-mini" in str(e.value) and "503" in str(e.value) and SECRET not in str(e.value)
    assert "ServiceUnavailableError x2" in str(e.value)


def test_one_step_of_failures_does_not_stop_a_run_with_a_long_window(fake, secret_env):
    session = policy_session(fake, max_missing=0.2, window=64)  # past 12 missing of the last 64
    fake.script = [Reply("summary")] * 2 + [Reply(status=503)] * 2
    scored = asyncio.run(sample_and_score(session, [DOC], rollouts_per_doc=2, reward=session.reward))
    assert scored.missing_rewards == 2 and scored.groups == []
    assert session.missing.record() == {"scored": 0, "missing": 2, "missing_by_error": {"ServiceUnavailableError": 2}}


def test_a_failed_grading_call_fails_only_the_summaries_it_grades(fake, secret_env):
    exact = json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]})  # needs no grading call
    fake.script = [Reply(exact), Reply(json.dumps({"answers": ["Ruth", "March 14, 2024", "UNANSWERABLE"]})),
                   Reply(status=500)]
    results = asyncio.run(LLMJudge(client(fake, max_retries=0)).grade_group(["a", "b"], DOC.questions))
    assert results[0] == [True, True, True]
    assert isinstance(results[1], JudgeError) and results[1].kind == "InternalServerError"


def test_fault_mode_is_seeded_counts_every_outcome_and_is_survived_with_retries(secret_env):
    from collections import Counter

    from summrl.testing import OUTCOMES, Faults

    def run(seed: int) -> tuple[Counter, list]:
        with FakeLLM(faults=Faults(rate=0.3, seed=seed, hang_s=1.5, retry_after_s="0")) as server:
            judge = LLMJudge(client(server, max_retries=4, timeout_s=1.0))
            results = asyncio.run(judge.grade_group([f"summary {i}" for i in range(80)], DOC.questions))
            stats = litellm.module_level_client.get(server.base_url.removesuffix("/v1") + "/stats").json()
            assert stats == {"requests": len(server.requests), "outcomes": dict(server.outcomes)}
            # every fault was retried, or was a failed call's last attempt (a slow answer on this shared
            # machine may also time out and be retried)
            usage = judge.client.usage
            assert usage.retries + usage.failures >= sum(n for k, n in server.outcomes.items() if k != "ok")
            # seeded: each request's outcome is the seed's draw for its prompt and attempt, whatever order the
            # concurrent calls came in (how many attempts there are depends on timing: an answer slower than
            # timeout_s on a loaded machine is asked again, and draws again, so two runs' totals may differ)
            attempts, replayed = Counter(), Counter()
            for request in server.requests:
                key = json.dumps(request["messages"], sort_keys=True)
                attempts[key] += 1
                replayed[server.faults.draw(f"{key}:{attempts[key]}") or "ok"] += 1
            assert replayed == server.outcomes
            return server.outcomes, results

    outcomes, results = run(seed=1)
    assert set(outcomes) == set(OUTCOMES)  # every kind of fault and every wrong shape, at about the rate asked
    assert 0.2 < sum(n for k, n in outcomes.items() if k != "ok") / sum(outcomes.values()) < 0.4
    assert sum(isinstance(r, list) for r in results) >= 76  # 5 attempts: a call fails with p = 0.3^5
    assert run(seed=2)[0] != outcomes


@pytest.mark.slow
def test_training_run_with_an_llm_judge_keeps_the_key_out_of_every_file(shared_run):
    """The shared run (conftest.shared_run) was judged by the loopback judge with a planted key, LITELLM_LOG=DEBUG."""
    from tests.conftest import SHARED_SECRET

    for invocation in (shared_run.first, shared_run.second):
        assert SHARED_SECRET not in invocation.stdout + invocation.stderr
    judge = shared_run.judge
    assert judge.headers and all(h["authorization"] == f"Bearer {SHARED_SECRET}" for h in judge.headers)
    files = {**shared_run.after_first["files"],  # the first invocation's folder, then the resumed one's
             **{p.relative_to(shared_run.run_dir).as_posix(): p.read_bytes()
                for p in shared_run.run_dir.rglob("*") if p.is_file()}}
    assert any(name.endswith("config.yaml") for name in files)
    for name, data in files.items():
        assert SHARED_SECRET.encode() not in data, name
    from tests.conftest import keys, s3

    for key in keys(shared_run.endpoint, "shared"):  # nor anything backed up
        body = s3(shared_run.endpoint).get_object(Bucket="shared", Key=key)["Body"].read()
        assert SHARED_SECRET.encode() not in body, key
    rows = shared_run.history()
    # ART files the judge's counts under the split they were spent on
    assert sum(r.get("train/judge/calls", 0) for r in rows) > 0 and sum(r.get("val/judge/calls", 0) for r in rows) > 0
    assert any("train/judge/cost_usd" in r for r in rows)


def ruler_reward(fake: FakeLLM, rubric: str = "Prefer dense, faithful summaries."):
    from summrl.rewards.ruler import RulerReward

    return RulerReward(client(fake, max_retries=0), rubric=rubric, prompt=FACTS)


def test_ruler_ranks_the_group_in_one_call(fake, secret_env):
    reward = ruler_reward(fake)
    summaries = ["short", "a somewhat longer summary " * 5, "the longest summary of them all " * 10]
    scores = asyncio.run(reward.score_group(DOC, summaries))
    assert len(fake.requests) == 1
    assert scores[0].reward < scores[1].reward < scores[2].reward  # the fake scores by length: order is kept
    assert scores[2].metrics["ruler_score"] == scores[2].reward
    prompt = json.dumps(fake.requests[0]["messages"])
    assert "Prefer dense, faithful summaries." in prompt and "Who opened the bridge?" not in prompt  # no questions
    assert fake.headers[0]["authorization"] == f"Bearer {SECRET}"


def test_ruler_shows_the_judge_non_latin_summaries_as_written(fake, secret_env):
    """ART's RULER prompt escaped every non-ASCII character: Chinese summaries reached the judge as \\uXXXX runs."""
    summaries = ["市议会周一开会。", "港口预算获得批准，金额为三百万。"]
    asyncio.run(ruler_reward(fake).score_group(DOC, summaries))
    prompt = "".join(m["content"] for m in fake.requests[0]["messages"])
    assert all(s in prompt for s in summaries) and "\\u" not in prompt


def test_ruler_reads_a_reply_fenced_as_markdown(fake, secret_env):
    """A judge that ignores response_format wraps its JSON in ```json ... ```: ART parsed it as bare JSON, so every
    call was refused, retried, paid for, and the group left missing."""
    scores = {"scores": [{"trajectory_id": "1", "explanation": "", "score": 0.25},
                         {"trajectory_id": "2", "explanation": "", "score": 0.75}]}
    fake.script = [Reply(f"```json\n{json.dumps(scores, indent=1)}\n```")]
    reward = ruler_reward(fake)
    rewards = asyncio.run(reward.score_group(DOC, ["one", "two"]))
    assert [s.reward for s in rewards] == [0.25, 0.75] and len(fake.requests) == 1
    assert (reward.client.usage.calls, reward.client.usage.failures) == (1, 0)


def test_ruler_parse_failure_leaves_the_group_missing(fake, secret_env):
    fake.script = [Reply(json.dumps({"scores": [{"trajectory_id": "1", "explanation": "", "score": 0.5}]}))]
    reward = ruler_reward(fake)
    scores = asyncio.run(reward.score_group(DOC, ["one", "two", "three"]))
    assert all(isinstance(s, Missing) for s in scores)
    assert reward.client.usage.failures == 1 and scores[0].kind == "ValueError" and "3 scores" in scores[0].error


def test_ruler_replies_of_the_wrong_shape_are_retried(fake, secret_env):
    one_score = json.dumps({"scores": [{"trajectory_id": "1", "explanation": "", "score": 0.5}]})
    fake.script = [Reply(one_score), Reply("Sure, here you go")]  # then the server answers like a judge
    reward = RulerReward(client(fake, max_retries=2), rubric="r", prompt=FACTS)
    scores = asyncio.run(reward.score_group(DOC, ["one", "two", "three"]))
    assert [type(s).__name__ for s in scores] == ["Score"] * 3 and len(fake.requests) == 3
    assert (reward.client.usage.retries, reward.client.usage.failures) == (2, 0)


def test_ruler_scores_out_of_range_or_nan_are_retried_not_taken_as_rewards(fake, secret_env):
    """ART checks the count only: 7.5, -1 or NaN became the reward (a NaN poisoned the group's advantages)."""
    def reply(*values):
        return Reply(json.dumps({"scores": [{"trajectory_id": str(i + 1), "explanation": "", "score": v}
                                            for i, v in enumerate(values)]}).replace('"NaN"', "NaN"))

    fake.script = [reply(7.5, 0.2), reply("NaN", 0.4), reply(0.9, 0.1)]
    reward = RulerReward(client(fake, max_retries=2), rubric="r", prompt=FACTS)
    scores = asyncio.run(reward.score_group(DOC, ["one", "two"]))
    assert [s.reward for s in scores] == [0.9, 0.1] and len(fake.requests) == 3
    fake.script = [reply(-1, 0.5)]
    (first, _) = asyncio.run(ruler_reward(fake).score_group(DOC, ["one", "two"]))
    assert isinstance(first, Missing) and "RULER scores must lie in [0, 1], got [-1.0]" in first.error


def test_ruler_scores_that_are_not_numbers_are_retried_and_a_cut_off_reply_is_not(fake, secret_env):
    """ART's model read true as 1.0 and "0" as 0.0; and a reply cut off at max_tokens was asked again and paid for
    at every attempt (at temperature 0 it is cut at the same place), ending as a ValidationError."""
    def reply(*values, **kwargs):
        return Reply(json.dumps({"scores": [{"trajectory_id": str(i + 1), "explanation": "", "score": v}
                                            for i, v in enumerate(values)]}), **kwargs)

    fake.script = [reply(True, "0"), reply(0.9, 0.1)]
    reward = RulerReward(client(fake, max_retries=2), rubric="r", prompt=FACTS)
    assert [s.reward for s in asyncio.run(reward.score_group(DOC, ["one", "two"]))] == [0.9, 0.1]
    assert len(fake.requests) == 2 and reward.client.usage.retries == 1
    cut = Reply('{"scores": [{"trajectory_id": "1", "explanation": "goo', finish_reason="length")
    fake.script = [cut, cut, cut]
    reward = RulerReward(client(fake, max_retries=2), rubric="r", prompt=FACTS)
    scores = asyncio.run(reward.score_group(DOC, ["one", "two"]))
    assert all(isinstance(s, Missing) and s.kind == "ReplyCutOff" for s in scores), scores
    assert "cut off at max_tokens" in scores[0].error and len(fake.requests) == 3  # 2 before, 1 here
    assert (reward.client.usage.calls, reward.client.usage.retries) == (1, 0)


def test_ruler_gives_each_score_to_the_summary_its_id_names(fake, secret_env):
    """ART's ruler_score_group paired scores with summaries in the reply's order: a judge that listed the best summary
    first gave its score to the first one. Ids other than 1..n once each are a wrong shape: retried, then missing."""
    def reply(*scores):
        return Reply(json.dumps({"scores": [{"trajectory_id": i, "explanation": "", "score": v} for i, v in scores]}))

    fake.script = [reply(("2", 0.9), ("1", 0.1))]  # the best first, named by its id
    scores = asyncio.run(ruler_reward(fake).score_group(DOC, ["bad summary", "桥梁在三月重新开放"]))
    assert [s.reward for s in scores] == [0.1, 0.9]
    # words as the length term counts them: a character each in a script written without spaces
    assert [s.metrics["word_count"] for s in scores] == [2.0, 9.0]
    fake.script = [reply(("1", 0.9), ("1", 0.2), ("7", 0.4)), reply(("3", 0.3), ("1", 0.5), ("2", 0.7))]
    reward = RulerReward(client(fake, max_retries=1), rubric="r", prompt=FACTS)
    assert [s.reward for s in asyncio.run(reward.score_group(DOC, ["a", "b b", "c c c"]))] == [0.5, 0.7, 0.3]
    assert reward.client.usage.retries == 1
    fake.script = [reply(("1", 0.9), ("1", 0.2), ("7", 0.4))]
    scores = asyncio.run(ruler_reward(fake).score_group(DOC, ["a", "b b", "c c c"]))
    assert all(isinstance(s, Missing) and s.kind == "ReplyShapeError" for s in scores)
    assert "once each, got ids ['1', '1', '7']" in scores[0].error


def test_ruler_retries_http_errors_on_the_clients_own_loop_and_counts_them(fake, secret_env):
    """One budget of attempts for RULER too: litellm retries nothing itself (the server sees each attempt once),
    Retry-After is waited for, and every retry is counted, like a QA judge call's."""
    fake.script = [Reply(status=429, headers={"Retry-After": "0.5"}), Reply(status=500)]  # then it answers
    reward = RulerReward(client(fake, max_retries=2, retry_max_s=1.0), rubric="r", prompt=FACTS)
    start = time.perf_counter()
    scores = asyncio.run(reward.score_group(DOC, ["one", "two", "three"]))
    assert time.perf_counter() - start >= 0.5  # waited as Retry-After asked
    assert [type(s).__name__ for s in scores] == ["Score"] * 3 and len(fake.requests) == 3
    usage = reward.client.usage
    assert (usage.calls, usage.retries, usage.failures) == (1, 2, 0)  # calls: answered ones, as for QA
    fake.script = [Reply(status=500)] * 3
    scores = asyncio.run(RulerReward(client(fake, max_retries=1), rubric="r", prompt=FACTS)
                         .score_group(DOC, ["one", "two", "three"]))
    assert len(fake.requests) == 3 + 2  # 2 attempts, no more
    assert all(isinstance(s, Missing) and s.kind == "InternalServerError" for s in scores)
    assert "failed after 2 attempt(s)" in scores[0].error and SECRET not in scores[0].error


def test_every_wrong_shape_the_fault_mode_injects_is_refused_for_every_judge_prompt(secret_env):
    """A wrong-shape fault is a real fault whatever the prompt: QA answering and grading, RULER, rubric writing
    and rubric scoring each refuse it (and would retry it)."""
    from summrl.testing import SHAPE_FAULTS, Faults
    from summrl.judges import Rubrics

    rubrics = Rubrics(("Names who opened it.", "Gives the date."), ("Invents a cost.",))
    mismatch = Reply(json.dumps({"answers": ["Ruth", "March 14, 2024", "UNANSWERABLE"]}))  # needs a grading call
    for fault in SHAPE_FAULTS:
        with FakeLLM(faults=Faults(rate=1.0, seed=3, only=(fault,))) as server:
            judge = client(server, max_retries=0)
            with pytest.raises(JudgeError) as answering:
                asyncio.run(LLMJudge(judge).answer("a summary", DOC.questions))
            server.script = [mismatch]  # answered; the grading call meets the fault
            (grading,) = asyncio.run(LLMJudge(judge).grade_group(["a summary"], DOC.questions))
            ruler = asyncio.run(RulerReward(judge, rubric="r", prompt=FACTS).score_group(DOC, ["one", "two"]))
            with pytest.raises(JudgeError) as writing:
                asyncio.run(LLMJudge(judge).write_rubrics(DOC, max_rubrics=4))
            with pytest.raises(JudgeError) as scoring:
                asyncio.run(LLMJudge(judge).score_rubrics(DOC, rubrics, ["one", "two"]))
            assert server.outcomes == {fault: 5}, fault
        for error in (answering.value, grading, writing.value, scoring.value):
            assert isinstance(error, JudgeError) and error.kind == "ReplyShapeError", (fault, error)
        assert all(isinstance(s, Missing) and s.kind in ("ValueError", "ValidationError") for s in ruler), fault


def test_full_document_baseline_is_computed_once_per_document(fake, secret_env):
    reward = QAReward(LLMJudge(client(fake)), max_chars=3000, forbid_han=True, include_unanswerable=True)
    asyncio.run(reward.score_group(DOC, ["one summary", "another summary", "a third"]))
    asyncio.run(reward.score_group(DOC, ["a later step's summary"]))
    full_document_calls = [r for r in fake.requests if DOC.text in r["messages"][-1]["content"]]
    assert len(full_document_calls) == 1  # one answering call; the grading calls hold no document
    # first group: 3 summaries + the document answered, 1 grading call; second group: 1 + 1
    assert len(fake.requests) == (3 + 1 + 1) + (1 + 1)


def test_a_group_is_graded_in_one_call(fake, secret_env):
    judge = LLMJudge(client(fake))
    results = asyncio.run(judge.grade_group(["a", "b", "c", "d"], DOC.questions))
    assert len(results) == 4 and all(r == [False, False, True] for r in results)
    grading = [r for r in fake.requests if '"correct"' in r["messages"][-1]["content"]]
    assert len(grading) == 1 and len(fake.requests) == 5
    prompt = grading[0]["messages"][-1]["content"]
    assert prompt.count("Candidate ") == 8  # 4 texts x 2 mismatched answers
    assert prompt.count("Who opened the bridge?") == 1  # each question once per group


def test_structured_ruler_requests_exactly_one_score_per_summary(fake, secret_env):
    from summrl.rewards.ruler import RulerReward

    reward = RulerReward(client(fake, max_retries=0, structured=True), rubric="r", prompt=FACTS)
    asyncio.run(reward.score_group(DOC, ["one", "two", "three"]))
    schema = fake.requests[0]["response_format"]["json_schema"]["schema"]["properties"]["scores"]
    assert (schema["minItems"], schema["maxItems"]) == (3, 3)
    assert [item["properties"]["trajectory_id"]["const"] for item in schema["prefixItems"]] == ["1", "2", "3"]


def test_answers_given_as_booleans_are_a_wrong_shape_not_the_answer_true():
    from summrl.judges.client import ReplyShapeError, list_of

    assert list_of({"answers": ["a", 3, 2.5]}, "answers", 3, (str, int, float)) == ["a", 3, 2.5]
    with pytest.raises(ReplyShapeError):
        list_of({"answers": [True, "b", "c"]}, "answers", 3, (str, int, float))
    assert list_of({"correct": [True, False]}, "correct", 2, bool) == [True, False]  # verdicts are booleans


def test_the_embedded_judges_replies_are_cached_by_its_model_weights_and_dtype_not_its_port():
    """The loopback URL has a new port each run: the caches never hit across runs, and a reused port with other
    weights under the same model name would have read their verdicts. The same holds for the written rubrics' and
    questions' caches, which key by the writer."""
    from summrl.judges import build_judge, embedded_endpoint
    from summrl.judges.questions import LLMQuestionWriter

    def keys(port, *overrides):
        config = compose_config(["experiment=local", "judge=embedded", *overrides])
        judge = build_judge(config.judge, embedded_endpoint(config, f"http://127.0.0.1:{port}/v1", "k"))
        reply = judge.client._cache_key([{"role": "user", "content": "Q"}], {"temperature": 0})
        return reply, judge.rubric_writer, LLMQuestionWriter(judge).writer

    assert keys(4001) == keys(4999)
    for other in (keys(4001, "model.weights=/tmp/other.gguf"), keys(4001, "backend.dtype=bfloat16")):
        assert all(a != b for a, b in zip(keys(4001), other))


def test_a_callers_own_judge_cost_is_its_calls_not_what_concurrent_callers_spent(fake, secret_env):
    """summrl.serve read one request's judge $ off the client's shared counter: concurrent requests' spending too."""
    from summrl.judges.client import REQUEST_COST

    shared = client(fake)

    async def request(calls: int) -> float:
        spent = [0.0]
        REQUEST_COST.set(spent)  # this task's context only
        for i in range(calls):
            await shared._call([{"role": "user", "content": f"call {calls}-{i}"}], {"temperature": 0})
        return spent[0]

    async def both():
        return await asyncio.gather(request(1), request(3))

    one, three = asyncio.run(both())
    assert one > 0 and three == pytest.approx(3 * one, rel=0.2)
    assert one + three == pytest.approx(shared.usage.cost_usd)


def test_identical_summaries_in_a_group_are_answered_with_one_call(fake, secret_env):
    """Each was paid for: their calls were in flight at once, before either reply reached the cache."""
    exact = json.dumps({"answers": ["Ruth Okafor", "March 14, 2024", "UNANSWERABLE"]})  # needs no grading call
    fake.script = [Reply(exact), Reply(exact)]
    results = asyncio.run(LLMJudge(client(fake, max_retries=0, cache_dir=None)).grade_group(
        ["same", "other", "same"], DOC.questions))
    assert len(fake.requests) == 2 and results == [[True, True, True]] * 3


def test_rulers_calls_are_priced_into_the_judges_usage(fake, secret_env):
    """RULER's calls go through ART: they were counted but never priced (train's judge/cost_usd and result.json's
    judge_cost_usd left them out, while the estimate before a run included them)."""
    from summrl.rewards.ruler import RulerReward

    reward = ruler_reward(fake)
    asyncio.run(reward.score_group(DOC, ["short", "a longer summary " * 5]))
    usage = reward.client.usage
    assert usage.calls == 1 and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.cost_usd > 0  # gpt-4o-mini is in litellm's cost map
    # an id without its provider (gpt-4o-mini, which litellm routes to openai): ART skipped pricing it, $0 and 0 tokens
    bare = RulerReward(client(fake, model="gpt-4o-mini", max_retries=0), rubric="Prefer dense summaries.", prompt=FACTS)
    asyncio.run(bare.score_group(DOC, ["short", "a longer summary " * 5]))
    assert bare.client.usage.input_tokens > 0 and bare.client.usage.cost_usd > 0


def test_val_samples_at_val_temperature_and_training_at_temperature(fake, secret_env, monkeypatch):
    """trainer.val_temperature (greedy val) was checked only as the config composed: nothing read the temperature
    the policy was asked for."""
    from summrl.loop import evaluate

    session = policy_session(fake, max_missing=1.0, overrides=("trainer.temperature=0.7", "trainer.val_temperature=0",
                                                               "trainer.val_rollouts_per_doc=1"))

    async def no_log(*args, **kwargs) -> None:  # the fake policy has no backend to log to
        return None

    monkeypatch.setattr(type(session.model), "log", no_log)
    monkeypatch.setattr(session.tracker, "log_history", lambda: None)
    monkeypatch.setattr(session.tracker, "log_samples", lambda *args: None)
    asyncio.run(evaluate(session, [DOC], 0))
    asyncio.run(sample_and_score(session, [DOC], rollouts_per_doc=2, reward=session.reward))  # as a train step does
    asked = [r["temperature"] for r in fake.requests if r.get("model") == "fake-policy"]
    assert asked[0] == 0.0 and len(asked) > 2 and set(asked[1:]) == {0.7}, asked  # val's one greedy draw, then train's


def test_ruler_replies_are_cached_like_every_other_judge_reply(fake, secret_env, tmp_path):
    """The README promises reruns and sweeps don't pay twice; RULER's calls went through ART around the reply cache,
    so every rerun or resumed step paid for them again (found by an audit)."""
    from summrl.rewards.ruler import RulerReward

    def reward(rubric="Prefer dense, faithful summaries.", **kwargs):
        judge = client(fake, max_retries=0, cache_dir=str(tmp_path / "cache"), **kwargs)
        return RulerReward(judge, rubric=rubric, prompt=FACTS)

    summaries = ["short", "a somewhat longer summary " * 5]
    first = asyncio.run(reward().score_group(DOC, summaries))
    rerun = reward(timeout_s=9.0)  # a new process: another timeout (or key, or port) decides nothing
    again = asyncio.run(rerun.score_group(DOC, summaries))
    assert len(fake.requests) == 1 and [s.reward for s in again] == [s.reward for s in first]
    assert rerun.client.usage.cached_calls == 1 and rerun.client.usage.calls == 0
    asyncio.run(reward().score_group(DOC, list(reversed(summaries))))  # another group: asked
    asyncio.run(reward(rubric="Prefer short summaries.").score_group(DOC, summaries))  # another rubric: asked
    assert len(fake.requests) == 3
