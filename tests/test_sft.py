"""The SFT warm start (sft=best_of_n, sft=distill): config errors, collection and its resume, the embedded
``_train_sft``, the teacher path against the loopback OpenAI-compatible server, and a real run of both stages."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, compose_config, run_cli


# --------------------------------------------------------------------------- config (fast)


@pytest.mark.parametrize(
    "args,key",
    [
        (["sft=distill"], "sft.teacher.model"),
        (["sft=best_of_n", "sft.samples_per_doc=0"], "sft.samples_per_doc"),
        (["sft=best_of_n", "sft.min_reward=1.5"], "sft.min_reward"),
        (["sft=best_of_n", "sft.top_k=5", "sft.samples_per_doc=4"], "sft.top_k"),
    ],
)
def test_bad_sft_config_fails_fast_naming_the_key(args, key, tmp_path):
    started = time.monotonic()
    result = run_cli(["experiment=local", f"hydra.run.dir={tmp_path}/run", *args], cwd=ROOT, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert f"config error: {key}:" in result.stderr + result.stdout
    assert not (tmp_path / "run" / "art").exists()  # nothing loaded
    assert elapsed < 10  # the process as a whole, interpreter start included (validation itself is well under 2 s)


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


# --------------------------------------------------------------------------- teacher path (loopback server)


def test_distill_collects_teacher_summaries_in_art_chat_format_and_never_calls_twice(tmp_path):
    from summrl.data import load_splits
    from summrl.judges import build_judge
    from summrl.judges.fake_server import FakeLLM
    from summrl.rewards import build_reward
    from summrl.sft import COLLECTED, SAMPLES, collect, training_samples

    with FakeLLM() as server:
        config = compose_config(["experiment=local", "judge=lexical", "sft=distill", "sft.teacher.model=openai/teacher",
                                 f"sft.teacher.api_base={server.base_url}", "sft.confirm=false",
                                 "sft.samples_per_doc=2", "sft.max_docs=3", f"run.dir={tmp_path}"])
        _, train = load_splits(config.dataset)
        reward = build_reward(config.reward, build_judge(config.judge), config.trainer.max_words)
        record = asyncio.run(collect(config, None, reward, train))
        assert len(server.requests) == 6 and record["teacher_calls"] == 6
        assert {r["model"] for r in server.requests} == {"teacher"}
        assert "Write a summary of this document" in server.requests[0]["messages"][-1]["content"]
        rows = [json.loads(line) for line in (tmp_path / "sft" / SAMPLES).read_text().splitlines()]
        assert len(rows) == 3  # top_k=1 of 2 per document
        for row in rows:
            assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
            assert row["messages"][-1]["content"] == "A summary written by the fake policy."
        assert len(training_samples(config)) == 3
        # a rerun finds every document done: no teacher call is repeated
        asyncio.run(collect(config, None, reward, train))
        assert len(server.requests) == 6
        assert len((tmp_path / "sft" / COLLECTED).read_text().splitlines()) == 3


# --------------------------------------------------------------------------- embedded _train_sft


@pytest.mark.slow
def test_embedded_train_sft_lowers_the_loss_and_raises_the_chosen_summaries_logprob(tmp_path):
    import art
    import torch

    from summrl.backends.embedded import EmbeddedBackend
    from summrl.backends.embedded.backend import _chat_messages
    from summrl.data import load_splits
    from summrl.rollout import summary_messages

    config = compose_config(["experiment=local"])
    _, train = load_splits(config.dataset)
    chosen = [" ".join(doc.text.split()[:40]) for doc in train[:4]]  # summaries the base model would not write
    trajectories = [art.Trajectory(messages_and_choices=[*summary_messages(doc, 50),
                                                         {"role": "assistant", "content": text}], reward=1.0)
                    for doc, text in zip(train, chosen)]

    async def main():
        backend = EmbeddedBackend(config.backend, model=config.model, path=str(tmp_path / "art"))
        model = art.TrainableModel(name="sft-test", project="summrl-tests", base_model=config.model.base_model,
                                   report_metrics=[])
        await model.register(backend)
        engine = backend.engine
        samples = [engine.chat_sample(_chat_messages(t)) for t in trajectories]
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


# --------------------------------------------------------------------------- end to end, killed during collection


@pytest.mark.slow
def test_best_of_n_run_killed_during_collection_resumes_it_then_sft_then_grpo(tmp_path):
    """A real SIGKILL once the first documents are on disk; the rerun skips them and runs both stages."""
    run_dir = tmp_path / "run"
    args = ["experiment=local", "sft=best_of_n", "sft.samples_per_doc=2", "sft.max_docs=6", "trainer.groups_per_step=1",
            "trainer.max_steps=1", "trainer.max_summary_tokens=24", "trainer.rollouts_per_group=2",
            "trainer.val_rollouts_per_doc=2", "dataset.val_size=2", "run.name=sft-e2e", f"hydra.run.dir={run_dir}"]
    collected = run_dir / "sft" / "collected.jsonl"
    first = subprocess.Popen([sys.executable, "-m", "summrl.train", *args], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             start_new_session=True)
    deadline = time.monotonic() + 600
    while not (collected.exists() and collected.read_text().count("\n") >= 2):
        assert first.poll() is None, first.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
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
