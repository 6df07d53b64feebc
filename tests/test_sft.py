"""The SFT warm start (sft=best_of_n, sft=distill): config errors, collection and its resume, the embedded
``_train_sft``, the teacher path against the loopback OpenAI-compatible server, and a real run of both stages."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from summrl.prompt import SummaryPrompt
from tests.conftest import ROOT, compose_config, heavy_imports, run_cli


# --------------------------------------------------------------------------- config (fast)


@pytest.mark.parametrize(
    "args,key",
    [
        (["sft=distill"], "sft.teacher.model"),
        (["sft=best_of_n", "sft.samples_per_doc=0"], "sft.samples_per_doc"),
        (["sft=best_of_n", "sft.min_reward=1.5"], "sft.min_reward"),
        (["sft=best_of_n", "reward=qa_rubric", "sft.min_reward=1.25"], "sft.min_reward"),
        (["sft=best_of_n", "sft.top_k=5", "sft.samples_per_doc=4"], "sft.top_k"),
        (["sft=distill", "sft.teacher.model=openai/t", "sft.teacher.max_retries=-1"], "sft.teacher.max_retries"),
        (["sft.kind=best_of_n"], "sft.kind"),  # ran the stage, tagged sft=none on W&B
    ],
)
def test_bad_sft_config_fails_fast_naming_the_key(args, key, tmp_path):
    result = run_cli(["experiment=local", f"hydra.run.dir={tmp_path}/run", *args], cwd=ROOT, timeout=60,
                     env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"config error: {key}:" in result.stderr + result.stdout
    assert not (tmp_path / "run" / "art").exists()  # nothing loaded
    assert heavy_imports(result.stderr) == []  # refused before the model, or torch, loads


def test_min_reward_is_checked_against_the_rewards_own_range():
    """A weighted reward reaches above 1 (qa + 0.2 x rubric: 1.2): a threshold in (1, 1.2] is reachable, one above
    is refused with the range named."""
    from summrl.config import reward_range
    from summrl.errors import ConfigError

    assert reward_range(compose_config(["experiment=local"]).reward) == (0.0, 1.0)
    assert reward_range(compose_config(["experiment=local", "reward=qa_rubric"]).reward) == pytest.approx((0.0, 1.2))
    low, high = reward_range(compose_config(["experiment=local", "reward=length_penalized"]).reward)
    assert low == float("-inf") and high == 1.0  # a linear length penalty is unbounded below
    assert compose_config(["experiment=local", "sft=best_of_n", "reward=qa_rubric", "sft.min_reward=1.1"]).sft.min_reward == 1.1
    with pytest.raises(ConfigError, match=r"sft.min_reward: 1.3 is unreachable: reward=weighted lies in \[0, 1.2\]"):
        compose_config(["experiment=local", "sft=best_of_n", "reward=qa_rubric", "sft.min_reward=1.3"])


def test_sft_none_is_the_default_and_distill_takes_any_teacher():
    assert compose_config(["experiment=local"]).sft.kind == "none"
    config = compose_config(["experiment=local", "sft=distill", "sft.teacher.model=openai/teacher",
                             "sft.teacher.api_base=http://127.0.0.1:1/v1"])
    assert (config.sft.kind, config.sft.teacher.model) == ("distill", "openai/teacher")


def test_keep_filters_by_min_reward_or_top_k_and_never_keeps_a_missing_reward():
    from summrl.sft import keep

    rewards = [0.2, None, 0.8, 0.5]
    assert keep(rewards, min_reward=0.5, top_k=None) == [2, 3]
    assert keep(rewards, min_reward=None, top_k=2) == [2, 3]
    assert keep([None, None], min_reward=None, top_k=1) == []


# --------------------------------------------------------------------------- the teacher's key (preflight)


def test_a_hosted_teachers_missing_key_stops_the_run_in_the_preflight(tmp_path):
    """sft.teacher.api_key_env=null (distill.yaml's default) with a hosted teacher: litellm's own variable for it
    is checked before anything loads (a subprocess run of the CLI)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    result = subprocess.run([sys.executable, "-m", "summrl.train", "experiment=local", "sft=distill",
                             "sft.teacher.model=gpt-4.1", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "sft.teacher.model=gpt-4.1 needs OPENAI_API_KEY" in result.stderr
    assert not (tmp_path / "run" / "art").exists()


def test_teacher_key_problems_and_the_secrets_a_remote_job_gets(monkeypatch):
    from summrl.cloud.launch import secrets
    from summrl.preflight import teacher_key_problems

    for name in ("ANTHROPIC_API_KEY", "MY_TEACHER_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    hosted = compose_config(["experiment=local", "sft=distill", "sft.teacher.model=anthropic/claude-sonnet-4-20250514"])
    assert teacher_key_problems(hosted) == [
        "sft.teacher.model=anthropic/claude-sonnet-4-20250514 needs ANTHROPIC_API_KEY: export it or put it in .env "
        "(or name another with sft.teacher.api_key_env)"]
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-planted")
    assert teacher_key_problems(hosted) == []
    assert secrets(hosted)["ANTHROPIC_API_KEY"] == "sk-ant-planted"  # forwarded: not one of the usual names
    named = compose_config(["experiment=local", "sft=distill", "sft.teacher.model=openai/t",
                            "sft.teacher.api_base=https://example.invalid/v1", "sft.teacher.api_key_env=MY_TEACHER_KEY"])
    assert "MY_TEACHER_KEY" in teacher_key_problems(named)[0]
    monkeypatch.setenv("MY_TEACHER_KEY", "planted-teacher-key")
    assert teacher_key_problems(named) == [] and secrets(named)["MY_TEACHER_KEY"] == "planted-teacher-key"
    local = compose_config(["experiment=local", "sft=distill", "sft.teacher.model=openai/t",
                            "sft.teacher.api_base=http://127.0.0.1:8000/v1"])
    assert teacher_key_problems(local) == []  # an endpoint of one's own needs no key
    assert "ANTHROPIC_API_KEY" not in secrets(compose_config(["experiment=local"]))


# --------------------------------------------------------------------------- teacher path (loopback server)


def distill_config(tmp_path, server, *extra):
    return compose_config(["experiment=local", "judge=lexical", "sft=distill", "sft.teacher.model=openai/teacher",
                           f"sft.teacher.api_base={server.base_url}", "sft.confirm=false", "sft.samples_per_doc=2",
                           "sft.max_docs=3", "sft.teacher.retry_base_s=0.01", "sft.teacher.retry_max_s=0.05",
                           *extra, f"run.dir={tmp_path}"])


def lexical_reward(config):
    from summrl.judges import build_judge
    from summrl.rewards import build_reward

    return build_reward(config.reward, build_judge(config.judge), SummaryPrompt.of(config.trainer))


def train_split(config):
    from summrl.data import load_splits

    return load_splits(config.dataset)[1]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_distill_collects_teacher_summaries_in_art_chat_format_and_never_calls_twice(tmp_path):
    from summrl.testing import FakeLLM
    from summrl.sft import COLLECTED, SAMPLES, SUMMARIES, collect, training_samples

    with FakeLLM() as server:
        config = distill_config(tmp_path, server, "sft.max_docs=2")
        train = train_split(config)
        record = asyncio.run(collect(config, None, lexical_reward(config), train))
        assert len(server.requests) == 4 and record["teacher_calls"] == 4
        assert {r["model"] for r in server.requests} == {"teacher"}
        assert "Write a summary of this document" in server.requests[0]["messages"][-1]["content"]
        assert len(lines(tmp_path / "sft" / SUMMARIES)) == 4  # every reply, kept or not
        rows = lines(tmp_path / "sft" / SAMPLES)
        assert len(rows) == 2  # top_k=1 of 2 per document
        for row in rows:
            assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
            assert row["messages"][-1]["content"] == "A summary written by the fake policy."
        assert len(training_samples(config)) == 2
        # a rerun with one more document asks only for that one's summaries, and counts the run's calls so far
        config = distill_config(tmp_path, server)
        record = asyncio.run(collect(config, None, lexical_reward(config), train))
        assert len(server.requests) == 6 and record["teacher_calls"] == 6
        assert record["teacher_cost_usd"] == 0.0  # openai/teacher is not in litellm's cost map
        assert len(lines(tmp_path / "sft" / COLLECTED)) == 3


@pytest.mark.parametrize("good_first", [True, False], ids=["good-first", "good-last"])
def test_top_k_keeps_the_summary_the_reward_scores_highest(tmp_path, good_first):
    """Every other test's teacher said one thing each time, so none could tell which summary was kept: rewards paired
    with the wrong summaries fine-tuned on the worst one, and they stayed green (an audit)."""
    from summrl.sft import collect, training_samples
    from summrl.testing import FakeLLM, Reply

    with FakeLLM() as server:
        config = distill_config(tmp_path, server, "sft.max_docs=1", "sft.teacher.max_concurrency=1")
        train = train_split(config)
        # the answers to every document's questions: the one collected scores its best on it
        good = "Summary. " + " ".join(q.answer for d in train for q in d.questions if q.answerable)
        bad = "Nothing of note happened."
        server.script = [Reply(good), Reply(bad)] if good_first else [Reply(bad), Reply(good)]
        asyncio.run(collect(config, None, lexical_reward(config), train))
    assert [t.messages_and_choices[-1]["content"] for t in training_samples(config)] == [good]


def test_a_summary_cut_off_at_max_tokens_is_not_kept_unless_sft_keep_cut_off(tmp_path):
    """A cut-off summary was kept as a finished turn, its end-of-turn token trained: at experiment=sft_ablation_local's
    64 tokens 31 of 32 summaries were cut, and every kept one ended mid-sentence (found by this stop's SFT audit)."""
    from summrl.sft import COLLECTED, SUMMARIES, SFTError, collect, training_samples, warm_start
    from summrl.testing import FakeLLM, Reply

    cut, whole = Reply("The council met and approved", finish_reason="length"), Reply("The council met.")
    with FakeLLM() as server:
        server.script = [cut, whole]
        config = distill_config(tmp_path / "one", server, "sft.max_docs=1", "sft.teacher.max_concurrency=1")
        asyncio.run(collect(config, None, lexical_reward(config), train_split(config)))
        folder = tmp_path / "one" / "sft"
        assert sorted(row["finish_reason"] for row in lines(folder / SUMMARIES)) == ["length", "stop"]
        assert [t.messages_and_choices[-1]["content"] for t in training_samples(config)] == ["The council met."]
        assert [len(row["cut_off"]) for row in lines(folder / COLLECTED)] == [1]

        server.script = [cut, cut]
        config = distill_config(tmp_path / "all", server, "sft.max_docs=1")
        with pytest.raises(SFTError, match=r"out of 2 scored \(best .*; 2 cut off at trainer.max_summary_tokens=\d+ "
                                           r"and not kept: raise it, or set sft.keep_cut_off=true"):
            asyncio.run(warm_start(config, None, lexical_reward(config), train_split(config)))

        server.script = [cut, cut]
        config = distill_config(tmp_path / "kept", server, "sft.max_docs=1", "sft.keep_cut_off=true")
        asyncio.run(collect(config, None, lexical_reward(config), train_split(config)))
        assert [t.messages_and_choices[-1]["content"] for t in training_samples(config)] == [
            "The council met and approved"]


def test_best_of_n_sends_each_wave_of_documents_as_one_burst_to_the_embedded_server(tmp_path):
    """The embedded batcher makes the same generate calls from a burst however its rows arrive (README "What a seed
    fixes"): the policy's SFT samples go out groups_per_step documents at a time, their rows tagged as one burst.
    Sent as slots freed, what was batched with them, and so their tokens, could differ from run to run."""
    import art

    from summrl.sft import COLLECTED, SUMMARIES, collect, collection_documents
    from summrl.testing import FakeLLM

    with FakeLLM() as server:
        config = compose_config(["experiment=local", "judge=lexical", "sft=best_of_n", "sft.samples_per_doc=3",
                                 "sft.max_docs=5", "trainer.groups_per_step=2", f"run.dir={tmp_path}"])
        policy = art.Model(name="policy", project="p", inference_api_key="k", inference_base_url=server.base_url)
        (tmp_path / "sft").mkdir()  # one document's first summary already written: the rerun asks for 2 of its 3
        first = collection_documents(config, train_split(config))[0]
        (tmp_path / "sft" / SUMMARIES).write_text(json.dumps({"document_id": first.id, "index": 0, "summary": "S."}) + "\n")
        asyncio.run(collect(config, policy, lexical_reward(config), train_split(config)))
        bursts = [r.get("summrl_burst") for r in server.requests]
    assert len(lines(tmp_path / "sft" / COLLECTED)) == 5 and len(bursts) == 14
    rows: dict[str, list] = {}
    for burst in bursts:
        rows.setdefault(burst["id"], []).append(burst["size"])
    assert sorted((len(sizes), sizes[0]) for sizes in rows.values()) == [(3, 3), (5, 5), (6, 6)]
    assert all(len(set(sizes)) == 1 for sizes in rows.values())
    # a backend whose server does not read the tag is not sent it
    with FakeLLM() as server:
        config = compose_config(["experiment=local", "judge=lexical", "sft=best_of_n", "sft.samples_per_doc=2",
                                 "sft.max_docs=2", "backend=local_gpu", "model.weights=null",
                                 f"run.dir={tmp_path / 'gpu'}"])
        policy = art.Model(name="policy", project="p", inference_api_key="k", inference_base_url=server.base_url)
        asyncio.run(collect(config, policy, lexical_reward(config), train_split(config)))
        assert len(server.requests) == 4 and not any("summrl_burst" in r for r in server.requests)


def test_an_empty_teacher_reply_is_refused_and_asked_again_once_never_trained_on(tmp_path):
    """A thinking model can spend its tokens and return nothing: such a reply is asked again once, and counted. It
    was asked again up to sft.teacher.max_retries times, each a paid call spending the same tokens (6 calls for one
    summary; found by an audit): a second empty reply is the teacher's failure, with the fix."""
    from summrl.testing import FakeLLM, Reply
    from summrl.sft import SUMMARIES, SFTError, collect, teacher_usage

    with FakeLLM() as server:
        server.script = [Reply("   \n")]
        config = distill_config(tmp_path / "once", server, "sft.max_docs=1", "sft.samples_per_doc=1")
        record = asyncio.run(collect(config, None, lexical_reward(config), train_split(config)))
    assert [row["summary"] for row in lines(tmp_path / "once" / "sft" / SUMMARIES)] == [
        "A summary written by the fake policy."]
    assert (record["teacher_calls"], record["teacher_retries"]) == (2, 1)
    assert teacher_usage(tmp_path / "once" / "sft")["calls"] == 2  # on disk with the samples

    with FakeLLM() as server:
        server.script = [Reply("") for _ in range(6)]
        config = distill_config(tmp_path / "twice", server, "sft.max_docs=1", "sft.samples_per_doc=1")
        with pytest.raises(SFTError, match=r"the teacher's reply was empty twice \(raise trainer.max_summary_tokens"):
            asyncio.run(collect(config, None, lexical_reward(config), train_split(config)))
        assert len(server.requests) == 2


def test_teacher_faults_are_retried_and_a_document_that_still_fails_stays_pending(tmp_path):
    from summrl.testing import FakeLLM, Faults, Reply
    from summrl.sft import COLLECTED, SUMMARIES, SFTError, collect

    # 1. A faulty teacher (429 with Retry-After, 500, hangs past the timeout): retried until every document is done.
    # (seed 15 draws each of the three among the first six calls; the fault draws are a function of the seed. A 2 s
    # timeout: a loaded 2-core machine once answered a good call past 0.5 s, a retry no fault had asked for)
    with FakeLLM(faults=Faults(rate=0.4, seed=15, hang_s=3.0, retry_after_s="0")) as server:
        config = distill_config(tmp_path / "faulty", server, "sft.teacher.timeout_s=2.0", "sft.teacher.max_retries=8")
        record = asyncio.run(collect(config, None, lexical_reward(config), train_split(config)))
        retried = sum(server.outcomes[kind] for kind in ("rate_limited", "server_error", "hang"))
    assert min(server.outcomes[kind] for kind in ("rate_limited", "server_error", "hang")) >= 1
    assert record["teacher_retries"] == retried and record["teacher_calls"] == 6
    assert len(lines(tmp_path / "faulty" / "sft" / COLLECTED)) == 3

    # 2. Three 500s against two retries per call: one of the first document's two summaries fails, the other arrives.
    with FakeLLM() as server:
        server.script = [Reply(status=500)] * 3
        config = distill_config(tmp_path / "failing", server, "sft.max_docs=2", "sft.teacher.max_retries=1",
                                "sft.teacher.max_concurrency=1")
        train = train_split(config)
        with pytest.raises(SFTError) as failure:
            asyncio.run(collect(config, None, lexical_reward(config), train))
        message = str(failure.value)
        assert "1 of 2 documents failed after their retries (teacher InternalServerError x1" in message
        assert "rerun the same command" in message and "min_reward" not in message and "\n" not in message
        folder = tmp_path / "failing" / "sft"
        (done,) = [row["document_id"] for row in lines(folder / COLLECTED)]  # the other document went on
        written = [row["document_id"] for row in lines(folder / SUMMARIES)]
        (pending,) = set(written) - {done}
        assert written.count(pending) == 1 and written.count(done) == 2  # the reply that did arrive is kept
        asked = len(server.requests)
        asyncio.run(collect(config, None, lexical_reward(config), train))
        assert len(server.requests) == asked + 1  # only the missing summary is asked for again
        assert {row["document_id"] for row in lines(folder / COLLECTED)} == {done, pending}


def test_a_document_whose_judge_failed_stays_pending_and_is_scored_again_without_the_teacher(tmp_path, caplog):
    """...and the rerun's plan prices its judge calls: summaries written by the failed run were left out of it."""
    import logging
    import re

    from summrl.judges import build_judge
    from summrl.testing import FakeLLM, Faults
    from summrl.rewards import build_reward
    from summrl.sft import COLLECTED, SFTError, collect, confirm_cost

    with FakeLLM() as teacher, FakeLLM(faults=Faults(rate=1.0, seed=0, hang_s=0.5, retry_after_s="0")) as judge:
        config = distill_config(tmp_path, teacher, "sft.max_docs=2", "judge=openai_compatible",
                                "judge.model=openai/judge", f"judge.api_base={judge.base_url}", "judge.cache_dir=null",
                                "judge.max_retries=0", "judge.timeout_s=0.3", "sft.min_reward=0.0", "sft.top_k=null")
        reward = build_reward(config.reward, build_judge(config.judge), SummaryPrompt.of(config.trainer))
        with pytest.raises(SFTError) as failure:
            asyncio.run(collect(config, None, reward, train_split(config)))
        assert "2 of 2 documents failed after their retries (judge " in str(failure.value)
        assert "lower sft.min_reward" not in str(failure.value)
        assert lines(tmp_path / "sft" / COLLECTED) == [] and len(teacher.requests) == 4
        judge.faults = None  # the judge recovers: the rerun scores the summaries on disk, the teacher is not asked
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="summrl"):
            confirm_cost(config, train_split(config))
        assert "sft plan: 0 teacher summaries for 0 documents (4 already written), 2 documents to score" in caplog.text
        (planned,) = re.findall(r"judge openai/judge: (\d+) calls", caplog.text)
        asked = len(judge.requests)
        asyncio.run(collect(config, None, reward, train_split(config)))
        assert len(teacher.requests) == 4 and len(lines(tmp_path / "sft" / COLLECTED)) == 2
        assert int(planned) >= len(judge.requests) - asked > 0  # an upper bound: grading calls only where needed


def test_declining_the_teachers_cost_calls_nothing_and_loads_nothing(tmp_path):
    """The plan and the question come right after the documents load: before the model, the val pass, any call."""
    from summrl.testing import FakeLLM

    with FakeLLM() as server:
        result = subprocess.run(
            [sys.executable, "-m", "summrl.train", "experiment=local", "sft=distill", "sft.teacher.model=openai/teacher",
             f"sft.teacher.api_base={server.base_url}", "sft.max_docs=3", f"hydra.run.dir={tmp_path / 'run'}"],
            cwd=ROOT, input="n\n", capture_output=True, text=True, timeout=180,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert len(server.requests) == 0
    assert result.returncode == 3 and "Traceback" not in result.stderr  # the benchmark's cost guard's code
    assert "summrl: sft plan: 3 teacher summaries for 3 documents (0 already written)" in result.stdout
    assert "teacher openai/teacher: 3 calls" in result.stdout and "Proceed? [y/N]" in result.stdout
    assert "the teacher's cost was not confirmed; nothing was called" in result.stderr
    assert not (tmp_path / "run" / "art").exists()  # no model was loaded


def test_the_teachers_plan_prices_the_judge_calls_the_reward_makes(tmp_path, caplog):
    """The plan the user confirms left rubric calls out (reward=qa_rubric: 9 judge calls priced, 15 made, 34% over
    the "upper bound") and priced QA calls for a reward with no QA term (found by an audit). Each reward's judge
    calls, counted by the loopback judge, are the plan's."""
    import logging
    import re

    from summrl.sft import collect, confirm_cost
    from summrl.testing import FakeLLM

    for reward in ("qa", "rubric", "qa_rubric", "ruler"):
        with FakeLLM() as teacher, FakeLLM() as judge:
            config = distill_config(tmp_path / reward, teacher, "sft.max_docs=2", f"reward={reward}",
                                    "judge=openai_compatible", "judge.model=gpt-4o-mini", "judge.cache_dir=null",
                                    f"judge.api_base={judge.base_url}")
            train = train_split(config)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="summrl"):
                confirm_cost(config, train)
            (planned,) = re.findall(r"judge gpt-4o-mini: (\d+) calls", caplog.text)
            asyncio.run(collect(config, None, lexical_reward(config), train))
            assert (reward, int(planned)) == (reward, len(judge.requests))


# --------------------------------------------------------------------------- S3: a fresh machine never pays again


def test_collection_is_backed_up_to_s3_and_a_fresh_machine_continues_it(tmp_path, s3_endpoint, aws_env):
    from summrl.testing import FakeLLM
    from summrl.sft import COLLECTED, RECORD, SAMPLES, SUMMARIES, USAGE, collect
    from summrl.storage import COMPLETE, CheckpointBackup
    from tests.conftest import keys, s3

    with FakeLLM() as server:
        storage = ["run.name=sft-s3", "storage.enabled=true", "storage.bucket=sft", f"storage.endpoint_url={s3_endpoint}"]
        config = distill_config(tmp_path / "run", server, "sft.max_docs=2", *storage)
        train = train_split(config)
        asyncio.run(collect(config, None, lexical_reward(config), train, CheckpointBackup.open(config)))
        assert {f"summrl/summrl/sft-s3/sft/{n}" for n in (SUMMARIES, SAMPLES, COLLECTED, USAGE)} <= set(keys(s3_endpoint, "sft"))

        shutil.rmtree(tmp_path / "run")  # a fresh machine: the run folder is gone
        config = distill_config(tmp_path / "run", server, *storage)
        fresh = CheckpointBackup.open(config)
        assert fresh.restore() is None  # no checkpoint yet, but sft/ is back
        assert len(lines(tmp_path / "run" / "sft" / COLLECTED)) == 2
        record = asyncio.run(collect(config, None, lexical_reward(config), train, fresh))
        assert len(server.requests) == 6  # 4 before, then only the third document's 2
        assert record["teacher_calls"] == 6  # the count survived the machine too

    # record.json (SFT has trained) comes back only with its step's complete checkpoint
    folder = tmp_path / "run" / "sft"
    (folder / RECORD).write_text(json.dumps({"step": 1}))
    checkpoint = fresh.local / "checkpoints" / "0001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"sft weights")
    fresh._upload_sft(sorted(folder.iterdir()))  # the upload got as far as sft/, not the checkpoint
    shutil.rmtree(tmp_path / "run")
    assert CheckpointBackup.open(config).restore() is None
    assert not (folder / RECORD).exists() and (folder / SAMPLES).exists()  # SFT trains again, from the samples
    shutil.rmtree(tmp_path / "run")
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"sft weights")
    asyncio.run(fresh.after_step(1))
    assert f"summrl/summrl/sft-s3/checkpoints/0001{COMPLETE}" in keys(s3_endpoint, "sft")
    shutil.rmtree(tmp_path / "run")
    assert CheckpointBackup.open(config).restore() == 1
    assert json.loads((folder / RECORD).read_text()) == {"step": 1}
    stored = s3(s3_endpoint).get_object(Bucket="sft", Key=f"summrl/summrl/sft-s3/sft/{SAMPLES}")["Body"].read()
    assert stored == (folder / SAMPLES).read_bytes()


# --------------------------------------------------------------------------- benchmark: base, SFT, GRPO side by side


def test_benchmark_of_a_run_with_an_sft_stage_includes_its_sft_step_and_names_each_stage(tmp_path):
    from hydra import compose, initialize_config_dir

    from summrl.benchmark.config import validate_benchmark
    from summrl.benchmark.rows import Row, RowStore
    from summrl.benchmark.runner import plan, write_outputs
    from summrl.data import load_splits
    from tests.conftest import CONF

    run = tmp_path / "run"
    for step in range(1, 6):  # step 1 is the SFT checkpoint, 2..5 are GRPO steps
        folder = run / "art" / "summrl" / "models" / "sftrun" / "checkpoints" / f"{step:04d}"
        folder.mkdir(parents=True)
        (folder / "adapter_model.safetensors").write_bytes(b"")
    (run / "sft").mkdir()
    (run / "sft" / "record.json").write_text(json.dumps({"kind": "best_of_n", "step": 1}))
    out = tmp_path / "out"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("benchmark", overrides=["experiment=local", f"benchmark.run_dir={run}", "benchmark.every=4",
                                              "benchmark.models=[]", "dataset.val_size=2",
                                              f"benchmark.output_dir={out}"])
    config = validate_benchmark(cfg)
    assert config.benchmark.run.steps == [0, 1, 4, 5]  # base, SFT, every 4th, last
    assert [config.benchmark.run.stage(s) for s in (0, 1, 4, 5)] == ["base", "sft", "grpo", "grpo"]

    val = load_splits(config.dataset)[0]
    out.mkdir()
    store = RowStore(out / "rows.csv")
    jobs = plan(config, val, store)
    store.append([Row(model="sftrun", step=job.step, document_id=doc.id, rollout=r, score=0.1 * job.step,
                      reward=0.1 * job.step, correct="[1, 0, 0, 0, 0]", questions=5, words=10, hallucinated=0,
                      chars=60, model_calls=1, model_cost_usd=0.0, judge_calls=0.0, judge_cost_usd=0.0,
                      ranking_calls=0, summary="s") for job in jobs for doc in val for r in range(2)])
    table = write_outputs(config, jobs, out)
    assert list(zip(table.step, table.stage)) == [(0, "base"), (1, "sft"), (4, "grpo"), (5, "grpo")]
    saved = pd.read_csv(out / "summary.csv")
    assert list(saved.stage) == ["base", "sft", "grpo", "grpo"]
    assert "| sftrun | 1 | sft | 2 | 4 |" in (out / "summary.md").read_text()
    from tests.test_benchmark import assert_png

    assert_png(out / "models.png")  # drawn, not a blank canvas
    assert_png(out / "steps.png")


# --------------------------------------------------------------------------- embedded _train_sft


@pytest.mark.slow
def test_embedded_train_sft_lowers_the_loss_and_raises_the_chosen_summaries_logprob(tmp_path, tiny_weights):
    """On the tiny model (conftest.tiny_weights): the behaviour is train_sft's update, which any weights show."""
    import art
    import torch

    from summrl.backends.embedded import EmbeddedBackend
    from summrl.backends.embedded.backend import chat_messages
    from summrl.data import load_splits

    config = compose_config(["experiment=local", tiny_weights])
    _, train = load_splits(config.dataset)
    # Short documents keep the forward passes small; the test is about which tokens SFT trains on, not length.
    train = [dataclasses.replace(doc, text=" ".join(doc.text.split()[:80])) for doc in train[:4]]
    chosen = [" ".join(doc.text.split()[:30]) for doc in train]  # summaries the base model would not write
    trajectories = [art.Trajectory(messages_and_choices=[*SummaryPrompt("facts", 50).messages(doc),
                                                         {"role": "assistant", "content": text}], reward=1.0)
                    for doc, text in zip(train, chosen)]

    async def main():
        backend = EmbeddedBackend(config.backend, model=config.model, path=str(tmp_path / "art"))
        model = art.TrainableModel(name="sft-test", project="summrl-tests", base_model=config.model.base_model,
                                   report_metrics=[])
        await model.register(backend)
        engine = backend.engine
        samples = [engine.chat_sample(chat_messages(t)) for t in trajectories]
        with torch.no_grad():
            before = float(engine.completion_nll(samples))
        await model.train_sft(trajectories * 3, config=art.TrainSFTConfig(learning_rate=1e-3, batch_size=4))
        with torch.no_grad():
            after = float(engine.completion_nll(samples))
        step = await model.get_step()
        await backend.close()
        return before, after, step

    before, after, step = asyncio.run(main())
    # mean log-probability per chosen summary token = -nll: it rises as the loss falls
    assert after < before - 0.1, (before, after)
    assert step == 1
    assert (tmp_path / "art" / "summrl-tests" / "models" / "sft-test" / "checkpoints" / "0001"
            / "adapter_model.safetensors").exists()
    history = [json.loads(line) for line in
               (tmp_path / "art" / "summrl-tests" / "models" / "sft-test" / "history.jsonl").read_text().splitlines()]
    assert any("train/loss/train" in row or "loss/train" in row for row in history)


@pytest.mark.slow
def test_embedded_sft_loss_is_the_cross_entropy_of_the_assistant_tokens_only(tmp_path):
    """The first batch's reported loss, computed before its update (lr 0), equals the mean negative log-probability
    of the replies' tokens from a plain forward pass, and not the mean over the whole chat: the prompt's tokens
    (system, document, instruction) are not trained on."""
    import torch

    from summrl.backends.embedded import EmbeddedBackend
    from summrl.data import load_splits

    config = compose_config(["experiment=local"])
    _, train = load_splits(config.dataset)
    replies = ["The festival drew 120 visitors.", "A short summary of the second document, with two sentences. Done."]
    chats = [[*SummaryPrompt("facts", 50).messages(doc), {"role": "assistant", "content": text}] for doc, text in zip(train, replies)]
    backend = EmbeddedBackend(config.backend, model=config.model, path=str(tmp_path / "art"))
    engine = backend.engine
    samples = [engine.chat_sample(chat) for chat in chats]
    for (ids, prompt_len), text in zip(samples, replies):
        assert engine.tokenizer.decode(ids[prompt_len:]).startswith(text)  # the split is at the reply
        assert text not in engine.tokenizer.decode(ids[:prompt_len])

    reply_nll, all_nll = [], []
    with torch.no_grad():
        for ids, prompt_len in samples:
            logits = engine.model(input_ids=torch.tensor([ids])).logits[0].float()
            nll = -torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
            reply_nll.append(nll[prompt_len - 1:])  # the prediction of token t+1 from position t
            all_nll.append(nll)
    expected_reply, expected_all = float(torch.cat(reply_nll).mean()), float(torch.cat(all_nll).mean())
    (metrics,) = engine.train_sft([samples], [0.0])
    assert metrics["loss/train"] == pytest.approx(expected_reply, abs=2e-3)
    assert abs(expected_all - expected_reply) > 0.1  # the test could tell the two apart


# --------------------------------------------------------------------------- end to end, killed during collection



def kill_train_once_written(args: list[str], path, lines: int) -> None:
    """Run `python -m summrl.train` and SIGKILL its process group once `path` holds `lines` lines (within 600 s)."""
    run = subprocess.Popen([sys.executable, "-m", "summrl.train", *args], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                           start_new_session=True)
    deadline = time.monotonic() + 600
    while not (path.exists() and path.read_text().count("\n") >= lines):
        assert run.poll() is None, run.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()


@pytest.mark.slow
def test_best_of_n_run_killed_during_collection_resumes_it_then_sft_then_grpo(tmp_path, tiny_weights):
    """A real SIGKILL once the first documents are on disk; the rerun skips them and runs both stages."""
    run_dir = tmp_path / "run"
    # (8 tokens cut every summary off: kept, as this test is of the collection's resume)
    args = ["experiment=local", tiny_weights, "sft=best_of_n", "sft.samples_per_doc=2", "sft.max_docs=6",
            "sft.keep_cut_off=true", "trainer.groups_per_step=1",
            "trainer.max_steps=1", "trainer.max_summary_tokens=8", "trainer.rollouts_per_group=2",
            "trainer.val_rollouts_per_doc=1", "dataset.val_size=1", "run.name=sft-e2e", f"hydra.run.dir={run_dir}"]
    collected = run_dir / "sft" / "collected.jsonl"
    kill_train_once_written(args, collected, lines=2)
    done_before = collected.read_text().count("\n")
    assert 2 <= done_before < 6

    second = run_cli(args, cwd=ROOT)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{done_before} of 6 documents already collected" in second.stdout
    ids = [json.loads(line)["document_id"] for line in collected.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 6  # each document collected once
    samples = [json.loads(line) for line in (run_dir / "sft" / "samples.jsonl").read_text().splitlines()]
    assert all(s["messages"][-1]["role"] == "assistant" for s in samples)

    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed"
    sft = result["sft"]
    assert (sft["kind"], sft["documents"], sft["samples_collected"], sft["step"]) == ("best_of_n", 6, 12, 1)
    assert sft["samples_kept"] == 6 and sft["mean_reward_kept"] >= sft["mean_reward_collected"] - 1e-9
    # val before SFT (step 0), after SFT (step 1, the SFT checkpoint), then one GRPO step (step 2)
    assert [(h["step"], h.get("stage")) for h in result["val_history"]] == [(0, "before_sft"), (1, "after_sft"),
                                                                            (2, None)]
    assert sft["val_before"]["step"] == 0 and sft["val_after"]["step"] == 1
    assert result["steps"] == 2
    checkpoints = run_dir / "art" / "summrl" / "models" / "sft-e2e" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0001", "0002"]

    # resuming after SFT never redoes it
    third = run_cli([a.replace("trainer.max_steps=1", "trainer.max_steps=2") for a in args], cwd=ROOT)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "sft collection" not in third.stdout and "resuming at step 2" in third.stdout
    assert json.loads((run_dir / "result.json").read_text())["sft"]["samples_kept"] == 6

    # stopped once SFT had saved its checkpoint, before its record was written: SFT is not trained a second time
    for later in ("0002", "0003"):
        shutil.rmtree(checkpoints / later)
    (run_dir / "sft" / "record.json").unlink()
    record = json.loads((run_dir / "result.json").read_text())
    record["val_history"] = record["val_history"][:1]  # only the pass before SFT had been scored then
    (run_dir / "result.json").write_text(json.dumps(record))
    fourth = run_cli(args, cwd=ROOT)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert "epoch(s) in" not in fourth.stdout  # no SFT training
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0001", "0002"]
    rebuilt = json.loads((run_dir / "result.json").read_text())["sft"]
    assert "before this record was written" in rebuilt["note"]
    # every figure the record has, not the counts alone (found by this stop's SFT audit)
    assert {k: rebuilt[k] for k in ("samples_collected", "samples_kept", "teacher_calls", "teacher_cost_usd")} == {
        "samples_collected": 12, "samples_kept": 6, "teacher_calls": 0, "teacher_cost_usd": 0.0}
    assert rebuilt["mean_reward_kept"] >= rebuilt["mean_reward_collected"] - 1e-9


@pytest.mark.slow
def test_distill_run_killed_during_collection_pays_the_teacher_only_for_what_is_not_on_disk(tmp_path, tiny_weights):
    """A real SIGKILL of `python -m summrl.train sft=distill` while the loopback teacher writes; the rerun asks it only
    for the summaries that are not on disk, trains both stages, and its record and W&B run count every call."""
    from summrl.testing import FakeLLM
    from summrl.sft import SUMMARIES, teacher_usage
    from tests.conftest import wandb_records

    run_dir = tmp_path / "run"
    with FakeLLM(default_delay_s=1.0) as server:  # one summary a second: the kill lands mid-collection
        args = ["experiment=local", tiny_weights, "sft=distill", "sft.teacher.model=openai/teacher",
                f"sft.teacher.api_base={server.base_url}", "sft.confirm=false", "sft.samples_per_doc=2",
                "sft.max_docs=4", "sft.teacher.max_concurrency=1", "trainer.max_steps=1", "trainer.groups_per_step=1",
                "trainer.rollouts_per_group=2", "trainer.max_summary_tokens=8", "trainer.val_rollouts_per_doc=1",
                "dataset.val_size=1", "run.name=distill-kill", f"hydra.run.dir={run_dir}"]
        summaries = run_dir / "sft" / SUMMARIES
        kill_train_once_written(args, summaries, lines=3)
        on_disk = summaries.read_text().count("\n")
        assert 3 <= on_disk < 8
        asked, counted = len(server.requests), teacher_usage(run_dir / "sft")["calls"]
        assert on_disk <= counted <= asked <= on_disk + 1  # at most the one call in flight is lost

        second = run_cli([*args, "logger=wandb"], cwd=ROOT, env={"WANDB_MODE": "offline"})
        assert second.returncode == 0, second.stderr[-3000:]
        assert len(server.requests) - asked == 8 - on_disk  # only what was not on disk
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["steps"] == 2
    sft = result["sft"]
    assert (sft["kind"], sft["documents"], sft["samples_collected"], sft["samples_kept"]) == ("distill", 4, 8, 4)
    assert sft["teacher_calls"] == counted + 8 - on_disk  # both invocations' calls
    run = wandb_records(run_dir)
    assert "sft=distill" in run["tags"] and run["config"]["sft"] == "distill"
    assert run["config"]["sft.teacher.model"] == "openai/teacher"
    (row,) = [r for r in run["history"] if "train/sft/teacher_calls" in r]
    assert row["train/sft/teacher_calls"] == sft["teacher_calls"] and row["train/sft/samples_kept"] == 4
    # the W&B run, first opened by the second invocation, holds every val pass: the first invocation's too
    val_rows = [r["training_step"] for r in run["history"] if "val/reward" in r]
    assert val_rows == [h["step"] for h in result["val_history"]]


def test_only_the_last_attempt_of_a_document_is_trained_on(tmp_path):
    """A crash after a document's samples but before its collected line: the rerun's samples replace them."""
    from summrl.sft import COLLECTED, SAMPLES, append_jsonl, training_samples

    config = compose_config(["experiment=local", "sft=best_of_n", f"run.dir={tmp_path}"])
    folder = tmp_path / "sft"
    folder.mkdir()

    def sample(doc: str, text: str) -> dict:
        return {"messages": [{"role": "user", "content": doc}, {"role": "assistant", "content": text}],
                "metadata": {"document_id": doc, "reward": 0.5}}

    append_jsonl(folder / SAMPLES, [sample("a", "crashed attempt")])  # no collected line: the run died here
    append_jsonl(folder / SAMPLES, [sample("a", "rerun")])
    append_jsonl(folder / COLLECTED, [{"document_id": "a", "rewards": [0.5, 0.1], "kept": [0]}])
    append_jsonl(folder / SAMPLES, [sample("b", "unfinished")])
    with (folder / COLLECTED).open("a") as f:
        f.write('{"document_id": "b", "rew')  # a line cut off mid-write
    assert [t.messages_and_choices[-1]["content"] for t in training_samples(config)] == ["rerun"]
    # the rerun's lines after the cut one still count
    append_jsonl(folder / SAMPLES, [sample("b", "b rerun")])
    append_jsonl(folder / COLLECTED, [{"document_id": "b", "rewards": [0.5], "kept": [0]}])
    assert [t.messages_and_choices[-1]["content"] for t in training_samples(config)] == ["rerun", "b rerun"]


def test_the_samples_train_in_one_order_whatever_order_their_documents_finished_in(tmp_path):
    """collected.jsonl is in the order documents finished (a teacher's or judge's latency, a resumed collection), and
    the samples went to the seeded shuffle in that order: one seed trained other batches from run to run (found by
    this stop's SFT audit)."""
    from summrl.sft import COLLECTED, SAMPLES, append_jsonl, training_samples

    config = compose_config(["experiment=local", "sft=best_of_n", f"run.dir={tmp_path}"])
    contents = []
    for order in (["b", "a", "c"], ["c", "b", "a"]):
        folder = tmp_path / "sft"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        for doc in order:
            append_jsonl(folder / SAMPLES, [{"messages": [{"role": "user", "content": doc},
                                                          {"role": "assistant", "content": f"{doc} summary"}],
                                             "metadata": {"document_id": doc, "reward": 0.5}}])
            append_jsonl(folder / COLLECTED, [{"document_id": doc, "rewards": [0.5], "kept": [0]}])
        contents.append([t.messages_and_choices[-1]["content"] for t in training_samples(config)])
    assert contents == [["a summary", "b summary", "c summary"]] * 2


def test_a_rerun_with_another_filter_filters_the_collected_documents_again_calling_nothing(tmp_path, caplog):
    """The filter was applied once, as each document was collected: after "no sample passed the filter ... lower
    sft.min_reward", a rerun with a lower one met the same empty choice, and only a new run.name, paying for every
    summary again, got past it (found by this stop's SFT audit)."""
    import logging

    from summrl.sft import COLLECTED, SUMMARIES, append_jsonl, collect, collected_rows, collection_documents
    from summrl.sft import training_samples

    caplog.set_level(logging.INFO, logger="summrl")
    args = ["experiment=local", "judge=lexical", "sft=best_of_n", "sft.samples_per_doc=2", "sft.max_docs=1",
            f"run.dir={tmp_path}"]
    config = compose_config([*args, "sft.min_reward=0.95", "sft.top_k=null"])
    doc = collection_documents(config, train_split(config))[0]
    folder = tmp_path / "sft"
    folder.mkdir()
    append_jsonl(folder / SUMMARIES, [{"document_id": doc.id, "index": i, "summary": text, "finish_reason": "stop"}
                                      for i, text in enumerate(["First.", "Second."])])
    append_jsonl(folder / COLLECTED, [{"document_id": doc.id, "rewards": [0.5, 0.8], "kept": []}])  # min_reward=0.95
    assert training_samples(config) == []
    lower = compose_config([*args, "sft.min_reward=0.6", "sft.top_k=null"])
    for _ in range(2):  # the second rerun, with the same filter, filters nothing again
        asyncio.run(collect(lower, None, lexical_reward(lower), train_split(lower)))
    assert [t.messages_and_choices[-1]["content"] for t in training_samples(lower)] == ["Second."]
    assert len(lines(folder / COLLECTED)) == 2 and len(collected_rows(folder)) == 1
    assert caplog.text.count("1 collected document(s) filtered again with sft.min_reward=0.6") == 1


def test_a_distill_run_whose_judge_failed_records_the_teachers_spend(tmp_path, tiny_weights):
    """Found by an audit: result.json's sft record (teacher calls and $) was written only once SFT had trained, so a
    run whose collection failed (exit 2) said nothing of the teacher it had paid."""
    from summrl.testing import FakeLLM, Faults

    run_dir = tmp_path / "run"
    with FakeLLM() as teacher, FakeLLM(faults=Faults(rate=1.0, seed=0, retry_after_s="0")) as judge:
        result = run_cli(["experiment=local", tiny_weights, "sft=distill", "sft.teacher.model=openai/teacher",
                          f"sft.teacher.api_base={teacher.base_url}", "sft.confirm=false", "sft.samples_per_doc=2",
                          "sft.max_docs=2", "judge=openai_compatible", "judge.model=openai/judge",
                          f"judge.api_base={judge.base_url}", "judge.cache_dir=null", "judge.max_retries=0",
                          "trainer.max_summary_tokens=8", "trainer.val_rollouts_per_doc=1", "dataset.val_size=1",
                          "trainer.max_missing_reward_rate=1.0", f"hydra.run.dir={run_dir}"], cwd=ROOT)
        paid = len(teacher.requests)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "documents failed after their retries (judge" in result.stderr
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and paid == 4
    assert (record["sft"]["teacher_calls"], record["sft"]["incomplete"]) == (paid, True)


def test_the_teachers_budget_refuses_an_estimate_over_it_and_stops_the_collection_within_it(tmp_path):
    """sft.teacher.max_cost_usd: an estimate over it calls nothing; a teacher whose replies run far past the estimate's
    max_summary_tokens is stopped once another call would pass it, and what it wrote is kept (no budget held the
    teacher: only the question writer had one)."""
    from summrl.sft import SUMMARIES, USAGE, CostNotConfirmed, SFTError, collect, confirm_cost
    from summrl.testing import FakeLLM, Reply

    with FakeLLM() as teacher:
        teacher.script.extend(Reply("word " * 400) for _ in range(20))  # 400 tokens a reply; 8 were estimated
        paid = ["sft.teacher.model=gpt-4o-mini", "sft.max_docs=4", "trainer.max_summary_tokens=8"]
        over = distill_config(tmp_path, teacher, *paid, "sft.teacher.max_cost_usd=0.00001")
        with pytest.raises(CostNotConfirmed, match=r"sft.teacher.max_cost_usd=1e-05: the teacher's estimate is \$0\.0"):
            confirm_cost(over, train_split(over))
        config = distill_config(tmp_path, teacher, *paid, "sft.teacher.max_cost_usd=0.001")
        confirm_cost(config, train_split(config))  # the estimate fits
        with pytest.raises(SFTError, match=r"sft.teacher.max_cost_usd=0.001 reached \(\$0\.000.*a rerun pays only"):
            asyncio.run(collect(config, None, lexical_reward(config), train_split(config)))
        calls = len(teacher.requests)
    usage = json.loads((tmp_path / "sft" / USAGE).read_text())
    assert 1 <= usage["calls"] == calls < 8 and 0 < usage["cost_usd"] <= 0.001
    assert len(lines(tmp_path / "sft" / SUMMARIES)) == calls  # each paid summary is kept


def test_grpo_after_sft_starts_from_fresh_adam_moments_as_arts_trainer_does(tmp_path, tiny_weights):
    """Found by an audit: SFT and GRPO shared one AdamW state, so GRPO's first update went on with SFT's moments and
    bias correction (optimizer step 4 after 3 SFT batches; ART clears the state at the switch, step 1): its update
    norm was 0.65 where ART's is 1.11. A run resumed from SFT's checkpoint clears it too, as one that went on."""
    import types

    import torch

    from summrl.backends.embedded.engine import Engine

    config = compose_config(["experiment=local", tiny_weights])
    engine = Engine(base_model=config.model.base_model, weights=config.model.weights, lora=config.model.lora)
    ids = engine.encode_chat([{"role": "user", "content": "Summarize: the bridge reopened on Monday."}])
    engine.train_sft([[(ids + [1000, 1001, 1002], len(ids))]] * 3, [1e-4] * 3)
    steps = lambda: {int(state["step"]) for state in engine.optimizer.state.values()}  # noqa: E731
    assert steps() == {3}
    engine.save_checkpoint(tmp_path / "0001")  # SFT's checkpoint

    prompt, completion = 16, 4
    group = torch.cat([torch.zeros(prompt, dtype=torch.long)] + [torch.full((completion,), i) for i in (1, 2)])[None]
    packed = {"tokens": torch.randint(100, 20000, group.shape), "group_ids": group,
              "parent_ids": torch.zeros_like(group),
              "input_pos": torch.cat([torch.arange(prompt)] + [torch.arange(prompt, prompt + completion)] * 2)[None],
              "assistant_mask": group > 0, "logprobs": torch.where(group > 0, -2.0, float("nan")),
              "advantages": (group.float() - 1.5) * (group > 0), "weights": torch.ones(group.shape)}
    engine.train_packed(packed, types.SimpleNamespace(learning_rate=1e-4), {})
    assert steps() == {1}  # fresh moments, as ART's trainer starts GRPO
    engine.train_packed(packed, types.SimpleNamespace(learning_rate=1e-4), {})
    assert steps() == {2}  # and kept from GRPO step to step

    resumed = Engine(base_model=config.model.base_model, weights=config.model.weights, lora=config.model.lora)
    resumed.load_checkpoint(tmp_path / "0001")  # a fresh process, resumed from SFT's checkpoint
    assert {int(state["step"]) for state in resumed.optimizer.state.values()} == {3}
    resumed.train_packed(packed, types.SimpleNamespace(learning_rate=1e-4), {})
    assert {int(state["step"]) for state in resumed.optimizer.state.values()} == {1}


def test_the_teachers_plan_counts_the_summaries_missing_not_those_past_a_lower_samples_per_doc(tmp_path, caplog):
    """Found by a review: the plan subtracted every summary on disk, so a resume with a lower sft.samples_per_doc
    planned -2 teacher calls ($ < 0), or 0, and the cost question was skipped while 2 paid calls were still to make."""
    import logging

    from summrl.sft import SUMMARIES, collection_documents, confirm_cost
    from summrl.testing import FakeLLM

    with FakeLLM() as teacher:
        config = distill_config(tmp_path, teacher, "sft.max_docs=2")
        train = train_split(config)
        first = collection_documents(config, train)[0]  # written by a run with sft.samples_per_doc=4
        folder = tmp_path / "sft"
        folder.mkdir()
        (folder / SUMMARIES).write_text("".join(json.dumps({"document_id": first.id, "index": i, "summary": "s",
                                                            "finish_reason": "stop"}) + "\n" for i in range(4)))
        with caplog.at_level(logging.INFO, logger="summrl"):
            confirm_cost(config, train)
    assert "sft plan: 2 teacher summaries for 1 documents (4 already written), 2 documents to score" in caplog.text
    assert "teacher openai/teacher: 2 calls" in caplog.text
