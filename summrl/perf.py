"""Benchmarks that print JSON. `python -m summrl.perf step [--steps N]`, `python -m summrl.perf judge`,
`python -m summrl.perf faults [--rate 0.3]`, `python -m summrl.perf sft`,
`python -m summrl.perf serve --run-dir runs/<name>`, `python -m summrl.perf first-sample [--processes N] [--unsettled]`.

first-sample: ``experiment=local``'s engine loaded in N fresh processes, one after another, each sampling the first val
prompt with 8 seeds (24 tokens): how many processes drew other tokens than the most common outcome. Since the
engine's MKL warm-up (``Engine._settle_mkl``) the answer should be none; ``--unsettled`` skips the warm-up.

serve: ``python -m summrl.serve`` on a run, one server per ``--best-of-n``: one /v1/summarize request alone, then
16 at once (p50/p95 latency, wall time, documents/s, and the wall time over one request's: the batching figure).

step: the embedded GRPO step of `experiment=local` (2 sample documents x 4 rollouts, 128 new tokens),
timed with the loop's own ``train_step``, with algorithm=grpo and, alternating on the same documents,
algorithm=grpo_kl (``step_median_s_kl``, ``kl_step_ratio``); generation throughput of 8 concurrent vs the same 8
sequential requests through the loopback endpoint; and the start-up time of
``python -m summrl.train --cfg job``. Medians over repeats, since these machines are noisy.

faults: `python -m summrl.train experiment=local judge=openai_compatible` (2 steps of 2 documents x 4 rollouts,
16 new tokens, 2 val documents x 2) against the loopback judge, fault-free and then with faults at ``--rate``:
rollouts scored and missing, judge retries, the judge's calls by outcome, and wall time.

Each command imports what it measures inside its function: the summrl modules it loads pull in torch, ART or
litellm, which the others (and ``startup``'s measurement) must not pay for.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from summrl import mkl_isa
from summrl.errors import run_async
from summrl.job import peak_rss_gb

ROOT = Path(__file__).resolve().parent.parent
STEP_OVERRIDES = [
    "experiment=local",
    "trainer.groups_per_step=2",
    "trainer.rollouts_per_group=4",
    "trainer.max_summary_tokens=128",
]


def compose_local(run_dir: str, overrides: list[str]):
    from summrl.config import compose, validate

    return validate(compose("train", [*overrides, f"run.dir={run_dir}", "run.name=perf"], return_hydra_config=True))


def startup_seconds(repeats: int = 3) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "summrl.train", "--cfg", "job"], cwd=ROOT, check=True,
                       capture_output=True)
        times.append(time.perf_counter() - start)
    return times


async def throughput(session, documents, max_tokens: int, repeats: int) -> tuple[list[float], list[float]]:
    """Completion tokens per second: 2 documents x 4 requests sent at once, then the same 8 one by one."""
    from summrl.prompt import SummaryPrompt

    client = session.model.openai_client()
    prompt = SummaryPrompt("facts", 350)  # as at every earlier measurement
    requests = [prompt.messages(d) for d in documents[:2] for _ in range(4)]

    async def one(messages) -> int:
        completion = await client.chat.completions.create(
            model=session.model.get_inference_name(), messages=messages, max_tokens=max_tokens, temperature=1.0)
        return completion.usage.completion_tokens

    batched, sequential = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(m) for m in requests)))
        batched.append(tokens / (time.perf_counter() - start))
        start, tokens = time.perf_counter(), 0
        for messages in requests:
            tokens += await one(messages)
        sequential.append(tokens / (time.perf_counter() - start))
    return batched, sequential


async def bench_step(steps: int, repeats: int) -> dict:
    from summrl.data import load_splits
    from summrl.loop import open_session, seed_everything, train_step

    with tempfile.TemporaryDirectory(prefix="summrl-perf-") as run_dir:
        config = compose_local(run_dir, STEP_OVERRIDES)
        seed_everything(config.seed)
        _, train_docs = load_splits(config.dataset)
        load_start = time.perf_counter()
        session = await open_session(config)
        load_s = time.perf_counter() - load_start
        try:
            engine = session.backend.engine
            engine.decode_ms.clear()
            batched, sequential = await throughput(session, train_docs, config.trainer.max_summary_tokens, repeats)
            decode_8 = [ms for rows, ms in engine.decode_ms if rows == 8]  # the batched runs' decode steps
            # algorithm=grpo and algorithm=grpo_kl (one extra forward pass without the adapter) alternate,
            # on the same documents, so that the machine's noise hits both alike.
            grpo, grpo_kl = config.algorithm, compose_local(run_dir, [*STEP_OVERRIDES, "algorithm=grpo_kl"]).algorithm
            timings, kl_timings = [], []
            for i in range(steps):
                documents = train_docs[2 * i : 2 * i + 2]
                for algorithm, times in ((grpo, timings), (grpo_kl, kl_timings)):
                    session.config.algorithm = algorithm
                    start = time.perf_counter()
                    scored, result = await train_step(session, documents, i)
                    if session.stopping:  # Ctrl-C while it trained: its update finished, the benchmark stops
                        raise asyncio.CancelledError
                    # a group whose rollouts scored alike is skipped: train_s depends on how many the rewards left
                    skipped = result.metrics.get("train/skipped_zero_variance_groups", 0.0) if result else 0.0
                    times.append({"step_s": time.perf_counter() - start, **scored.timings,
                                  "groups_trained": len(documents) - int(skipped)})
        finally:
            await session.backend.close()
    median = lambda key, ts=timings: round(statistics.median(t[key] for t in ts), 2)  # noqa: E731
    return {
        "step_median_s": median("step_s"),
        "generate_s": median("generate_s"),
        "score_s": median("score_s"),
        "train_s": median("train_s"),
        # seconds per group trained (steps that trained none left out): comparable across runs whose rewards differ
        "train_s_per_group": round(statistics.median(
            [t["train_s"] / t["groups_trained"] for t in timings if t["groups_trained"]] or [0.0]), 2),
        "groups_trained": [t["groups_trained"] for t in timings],
        "steps": steps,
        "step_times_s": [round(t["step_s"], 2) for t in timings],
        "step_median_s_kl": median("step_s", kl_timings),
        "train_s_kl": median("train_s", kl_timings),
        "step_times_s_kl": [round(t["step_s"], 2) for t in kl_timings],
        "kl_step_ratio": round(median("step_s", kl_timings) / median("step_s"), 2),
        "kl_train_ratio": round(median("train_s", kl_timings) / median("train_s"), 2),
        "batched_tok_s": round(statistics.median(batched), 1),
        "sequential_tok_s": round(statistics.median(sequential), 1),
        "batched_speedup": round(statistics.median(batched) / statistics.median(sequential), 2),
        "model_load_s": round(load_s, 1),
        "decode_ms_per_step": round(statistics.median(decode_8), 1) if decode_8 else None,  # 8 rows, median
        "peak_rss_gb": peak_rss_gb(),  # the process's: loading, throughput runs and every step
        "mkl_isa": mkl_isa.ACTIVE,  # MKL on its AVX-512 kernels on an AMD processor (summrl/mkl_isa.py)
    }


# Summary-RL's per-question scheme (src/summarizer/rollout.py): 4 calls per question, the document in
# three of them, and the full-document baseline recomputed for every rollout.
PER_QUESTION_PROMPTS = (
    "Here is a document: {summary}\n\nAnswer this question to the best of your ability in one sentence, "
    "if the document does not contain the answer, just state so: {question}",
    "Here is a document: {document}\n\nHere is a question: {question}\n\nHere is a generated answer: {answer}\n\n"
    "Here is the golden answer: {gold}\n\nIf the answers mostly match return a 1, if they do not match return a 0. "
    "Do not return any other text.",
    "Here is a document: {document}\n\nAnswer this question to the best of your ability in one sentence, "
    "if the document does not contain the answer, just state so: {question}",
    "Here is a document: {document}\n\nHere is a question: {question}\n\nHere is a generated answer: {answer}\n\n"
    "Here is the golden answer: {gold}\n\nIf the answers mostly match return a 1, if they do not match return a 0. "
    "Do not return any other text.",
)


def fixed_summaries(document, n: int, words: int = 100) -> list[str]:
    """n different fixed 'summaries' of a document: overlapping windows of its words."""
    tokens = document.text.split()
    step = max(1, (len(tokens) - words) // max(1, n - 1))
    return [" ".join(tokens[i * step : i * step + words]) for i in range(n)]


async def bench_judge(documents: int, group_size: int, delay_s: float) -> dict:
    import litellm

    from summrl.data import load_splits
    from summrl.testing import FakeLLM, token_count
    from summrl.judges.client import JudgeClient
    from summrl.judges.llm import LLMJudge
    from summrl.rewards.qa import QAReward

    config = compose_local(tempfile.gettempdir(), ["experiment=local"])
    val, train = load_splits(config.dataset)
    docs = (val + train)[:documents]
    rollouts = documents * group_size

    def new_reward(base_url: str) -> QAReward:
        judge = LLMJudge(JudgeClient(model="openai/gpt-4o-mini", api_base=base_url, cache_dir=None))
        return QAReward(judge, max_chars=None, forbid_han=True, include_unanswerable=True)

    with FakeLLM() as server:  # reward=qa: grouped answering and grading, cached baseline
        reward = new_reward(server.base_url)
        for doc in docs:
            await reward.score_group(doc, fixed_summaries(doc, group_size))
        qa_calls, qa_tokens = len(server.requests), server.prompt_tokens

    with FakeLLM() as server:  # Summary-RL's scheme on the same documents and summaries
        async def call(prompt: str) -> str:
            response = await litellm.acompletion(model="openai/gpt-4o-mini", api_base=server.base_url, api_key="none",
                                                 messages=[{"role": "user", "content": prompt}], temperature=0)
            return response.choices[0].message.content

        async def per_question(doc, summary: str) -> None:
            for q in doc.questions:
                fields = {"summary": summary, "document": doc.text, "question": q.question, "gold": q.answer}
                answer = await call(PER_QUESTION_PROMPTS[0].format(**fields, answer=""))
                await call(PER_QUESTION_PROMPTS[1].format(**fields, answer=answer))
                full = await call(PER_QUESTION_PROMPTS[2].format(**fields, answer=""))
                await call(PER_QUESTION_PROMPTS[3].format(**fields, answer=full))

        for doc in docs:
            await asyncio.gather(*(per_question(doc, s) for s in fixed_summaries(doc, group_size)))
        pq_calls, pq_tokens = len(server.requests), server.prompt_tokens

    from summrl.rewards.rubric import RubricReward

    with FakeLLM() as server, tempfile.TemporaryDirectory() as rubric_cache:  # reward=rubric, 8 rubrics a side
        def rubric_reward() -> RubricReward:  # a new process: a new judge, the rubrics on disk only
            judge = LLMJudge(JudgeClient(model="openai/gpt-4o-mini", api_base=server.base_url, cache_dir=None))
            return RubricReward(judge, max_rubrics=8, positive_weight=1.0, negative_weight=4.0, cache_dir=rubric_cache)

        reward = rubric_reward()  # first sight of each document: the judge writes its rubrics, then scores
        for doc in docs:
            await reward.score_group(doc, fixed_summaries(doc, group_size))
        rubric_calls, rubric_tokens = len(server.requests), server.prompt_tokens
        write_tokens = sum(token_count(r["messages"]) for r in server.requests
                           if '"positive_rubrics"' in r["messages"][-1]["content"])
        reward = rubric_reward()  # a later step or a rerun: the rubrics come from the disk cache
        for doc in docs:
            await reward.score_group(doc, fixed_summaries(doc, group_size))
        cached_calls, cached_tokens = len(server.requests) - rubric_calls, server.prompt_tokens - rubric_tokens
        rubrics_per_document = statistics.mean([len((await reward.rubrics_for(doc)).listed) for doc in docs])

    walls = []
    with FakeLLM(default_delay_s=delay_s) as server:  # a judge that takes delay_s per call
        reward = new_reward(server.base_url)
        for doc in docs:
            start = time.perf_counter()
            await reward.score_group(doc, fixed_summaries(doc, group_size))
            walls.append(time.perf_counter() - start)

    qa_tok = qa_tokens / rollouts
    pq_tok = pq_tokens / rollouts
    return {
        "qa_calls_per_rollout": round(qa_calls / rollouts, 3),
        "qa_input_tokens_per_rollout": round(qa_tok, 1),
        "per_question_calls_per_rollout": round(pq_calls / rollouts, 3),
        "per_question_input_tokens_per_rollout": round(pq_tok, 1),
        "token_ratio": round(pq_tok / qa_tok, 2),
        "call_ratio": round(pq_calls / qa_calls, 2),
        # reward=rubric, a document's first group: one rubric-writing call plus one scoring call for the group
        "rubric_calls_per_rollout": round(rubric_calls / rollouts, 3),
        "rubric_input_tokens_per_rollout": round(rubric_tokens / rollouts, 1),
        # ... and its later groups (rubrics read from the cache): the scoring call only
        "rubric_cached_calls_per_rollout": round(cached_calls / rollouts, 3),
        "rubric_cached_input_tokens_per_rollout": round(cached_tokens / rollouts, 1),
        # the writing call's input (the document), paid once per document and judge, then cached
        "rubric_write_input_tokens_per_document": round(write_tokens / len(docs), 1),
        "rubrics_per_document": rubrics_per_document,
        "group_wall_s": round(statistics.median(walls), 3),
        "group_size": group_size,
        "documents": documents,
        "judge_delay_s": delay_s,
    }


# The fault runs' scale and judge settings: small timeouts and backoff, so that a fault costs little time.
FAULT_RUN_OVERRIDES = [
    "experiment=local", "judge=openai_compatible", "judge.model=openai/fake-judge", "judge.cache_dir=null",
    "judge.timeout_s=1.5", "judge.max_retries=5", "judge.retry_base_s=0.05", "judge.retry_max_s=0.2",
    "trainer.max_steps=2", "trainer.groups_per_step=2", "trainer.rollouts_per_group=4", "trainer.eval_every=2",
    "trainer.max_summary_tokens=16", "trainer.val_rollouts_per_doc=2", "dataset.val_size=2",
]


def fault_run(rate: float, seed: int, run_dir: Path, overrides: list[str] = ()) -> dict:
    """One training run against a judge that fails at ``rate``: its exit code, output, result.json, wall time
    and the judge's calls by outcome."""
    from summrl.testing import Faults, FakeLLM

    started = time.perf_counter()
    with FakeLLM(faults=Faults(rate=rate, seed=seed, hang_s=3.0)) as judge:
        process = subprocess.run(
            [sys.executable, "-m", "summrl.train", *FAULT_RUN_OVERRIDES, f"judge.api_base={judge.base_url}",
             f"hydra.run.dir={run_dir}", "run.name=faults", *overrides],
            cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        outcomes = dict(judge.outcomes)
    result_path = Path(run_dir) / "result.json"
    return {"returncode": process.returncode, "stdout": process.stdout, "stderr": process.stderr,
            "result": json.loads(result_path.read_text()) if result_path.exists() else None,
            "wall_s": round(time.perf_counter() - started, 1), "judge_outcomes": outcomes}


def bench_faults(rate: float, seed: int) -> dict:
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, r in (("fault_free", 0.0), (f"faults_{rate}", rate)):
            run = fault_run(r, seed, Path(tmp) / name)
            result = run["result"] or {}
            rollouts = result.get("rollouts", {})
            total = rollouts.get("scored", 0) + rollouts.get("missing", 0)
            figures[name] = {
                "returncode": run["returncode"],
                # a run that failed or left no result.json: its own words (its figures are null)
                **({"stderr_tail": run["stderr"][-2000:]} if run["returncode"] or not run["result"] else {}),
                "status": result.get("status"), "error": result.get("error"),
                "rollouts_scored": rollouts.get("scored"), "rollouts_missing": rollouts.get("missing"),
                "scored_share": round(rollouts.get("scored", 0) / total, 3) if total else None,
                "missing_by_error": rollouts.get("missing_by_error"),
                "judge_calls_answered": result.get("judge_calls"), "judge_retries": result.get("judge_retries"),
                "judge_calls_by_outcome": run["judge_outcomes"],
                "wall_s": run["wall_s"],
            }
    return figures


def longest_fit(fits: Callable[[int], bool], most: int, step: int = 5) -> Optional[int]:
    """The largest multiple of ``step`` up to ``most`` for which ``fits`` (true up to some length, then false) holds;
    None where ``step`` itself does not. Slices started at 60 words: a larger --max-tokens changed nothing."""
    low, high = 0, most // step
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle * step) else (low, middle - 1)
    return low * step or None


async def bench_sft(samples: int, max_tokens: int, repeats: int) -> dict:
    """The embedded ``model.train_sft`` on ``samples`` chats of at most ``max_tokens`` tokens each (the sft
    group's default batch size), checkpoint included: the SFT stage's training time per pass over them."""
    import art

    from summrl.backends.embedded.backend import chat_messages
    from summrl.data import load_splits
    from summrl.loop import open_session, seed_everything

    with tempfile.TemporaryDirectory(prefix="summrl-perf-") as run_dir:
        config = compose_local(run_dir, ["experiment=local", "sft=best_of_n"])
        seed_everything(config.seed)
        _, docs = load_splits(config.dataset)
        session = await open_session(config)
        try:
            engine = session.backend.engine
            trajectories, lengths = [], []
            for doc in docs[:samples]:
                words = doc.text.split()

                def chat(cut: int) -> list[dict]:  # the document's first ``cut`` words, then the next ``cut``
                    return [{"role": "user", "content": "Summarize: " + " ".join(words[:cut])},
                            {"role": "assistant", "content": " ".join(words[cut : 2 * cut])}]

                cut = longest_fit(lambda c: len(engine.chat_sample(chat(c))[0]) <= max_tokens, len(words) // 2)
                if cut is None:
                    raise SystemExit(f"summrl.perf sft: --max-tokens {max_tokens}: not even a chat of 5 + 5 words of "
                                     f"document {doc.id} fits; raise it")
                trajectories.append(art.Trajectory(messages_and_choices=chat(cut), reward=1.0))
                lengths.append(len(engine.chat_sample(chat_messages(trajectories[-1]))[0]))
            sft = art.TrainSFTConfig(learning_rate=config.sft.lr, batch_size=config.sft.batch_size)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                await session.model.train_sft(trajectories, config=sft)
                times.append(time.perf_counter() - start)
        finally:
            await session.backend.close()
    return {"sft_step_s": round(statistics.median(times), 2), "sft_times_s": [round(t, 2) for t in times],
            "samples": len(trajectories), "max_sample_tokens": max(lengths),
            "mean_sample_tokens": round(statistics.mean(lengths), 1), "batch_size": config.sft.batch_size}


def bench_serve(run_dir: str, concurrency: int, best_of_n: tuple[int, ...], selector: str, step: str,
                overrides: tuple[str, ...] = ()) -> dict:
    """``python -m summrl.serve`` as a user starts it, one server per best_of_n: a lone /v1/summarize request (3
    times, median), then ``concurrency`` at once: their latency (p50, p95), the wall time, documents/s, and the
    wall time over one request's (batching's figure: 1 means free, ``concurrency`` means none). With the first
    server, a lone streamed chat (a document to summarize, 128 tokens, greedy; 3 times, median): the time to its first
    piece of text and to its end."""
    from summrl.serve.process import ServeProcess

    documents = [line for line in (ROOT / "summrl" / "data" / "repliqa_sample.jsonl").read_text().splitlines()]
    texts = list(dict.fromkeys(json.loads(line)["document_extracted"] for line in documents))[:concurrency]
    out: dict = {"run_dir": run_dir, "step": step, "concurrency": concurrency, "selector": selector,
                 "overrides": list(overrides)}
    for n in best_of_n:
        with tempfile.TemporaryDirectory(prefix="summrl-perf-serve-") as folder:  # the server's log, while it runs
            server = ServeProcess(run_dir, [f"step={step}", f"serve.best_of_n={n}", f"serve.selector={selector}",
                                            *overrides], Path(folder) / "serve.log")
            out.update(_serve_figures(server, n, best_of_n[0], texts, concurrency))
    return out


def _serve_figures(server: Any, n: int, first_n: int, texts: list[str], concurrency: int) -> dict:
    """One server's figures (``bench_serve``); the server is stopped at the end."""
    import httpx

    out: dict = {}
    url, load_s = server.url, server.load_s
    try:
        async def post(client, text: str) -> float:
            start = time.perf_counter()
            response = await client.post(f"{url}/v1/summarize", json={"document": text, "seed": 1})
            response.raise_for_status()
            return time.perf_counter() - start

        async def stream(client, model: str, text: str) -> tuple[float, float]:
            body = {"model": model, "stream": True, "max_tokens": 128, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Summarize this document:\n\n{text}"}]}
            start, first = time.perf_counter(), None
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if first is None and line.startswith("data: {") and any(
                            (choice.get("delta") or {}).get("content")
                            for choice in json.loads(line[len("data: "):]).get("choices") or ()):
                        first = time.perf_counter() - start
            return first or math.nan, time.perf_counter() - start

        async def measure() -> tuple[list[float], list[float], float, list[tuple[float, float]]]:
            async with httpx.AsyncClient(timeout=600) as client:
                await post(client, texts[0])  # warm-up
                alone = [await post(client, texts[i % len(texts)]) for i in range(3)]
                start = time.perf_counter()
                latencies = await asyncio.gather(*(post(client, texts[i % len(texts)]) for i in range(concurrency)))
                wall = time.perf_counter() - start
                streamed = []
                if n == first_n:
                    model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
                    streamed = [await stream(client, model, texts[i % len(texts)]) for i in range(3)]
                return alone, list(latencies), wall, streamed

        alone, latencies, wall, streamed = run_async(measure())
    finally:
        server.stop()
    ordered = sorted(latencies)
    single = statistics.median(alone)
    out[f"best_of_{n}"] = {
        "load_s": round(load_s, 1), "single_s": round(single, 2),
        "p50_s": round(statistics.median(ordered), 2),
        "p95_s": round(ordered[math.ceil(0.95 * len(ordered)) - 1], 2),  # nearest rank: 16 requests, the slowest
        "wall_s": round(wall, 2), "documents_per_s": round(concurrency / wall, 3),
        "wall_over_single": round(wall / single, 2)}
    if streamed:
        out["stream_first_piece_s"] = round(statistics.median(first for first, _ in streamed), 2)
        out["stream_total_s"] = round(statistics.median(total for _, total in streamed), 2)
    return out


# ---------------------------------------------------------------- the first sample of a fresh process


async def first_sample(unsettled: bool) -> dict:
    """In this process: load ``experiment=local``'s engine as a run does and sample the first val prompt (by id) with
    8 seeds, 24 tokens: a digest of each row's tokens. ``unsettled`` skips the engine's MKL warm-up."""
    from summrl.backends.embedded.compute import compute
    from summrl.backends.embedded.engine import Engine, SamplingParams
    from summrl.data import load_splits
    from summrl.loop import open_session, seed_everything
    from summrl.prompt import SummaryPrompt

    if unsettled:
        Engine._settle_mkl = lambda self: None
    with tempfile.TemporaryDirectory(prefix="summrl-perf-") as run_dir:
        config = compose_local(run_dir, ["experiment=local"])
        seed_everything(config.seed)
        val, _ = load_splits(config.dataset)
        session = await open_session(config)
        try:
            engine = await compute(lambda: session.backend.engine)
            document = min(val, key=lambda d: d.id)
            prompt = engine.encode_chat(SummaryPrompt.of(config.trainer).messages(document))
            params = SamplingParams(max_tokens=24, temperature=config.trainer.val_temperature or 1.0)
            rows = await compute(engine.generate, [prompt] * 8, params, seeds=list(range(8)))
        finally:
            await session.backend.close()
    return {"document": document.id, "rows": [hashlib.sha256(str(r.token_ids).encode()).hexdigest()[:12] for r in rows],
            "mkl_isa": mkl_isa.ACTIVE}


def bench_first_sample(processes: int, unsettled: bool) -> dict:
    """``processes`` fresh processes (``python -m summrl.perf first-sample --child``), one after another: how many
    sampled other tokens for the same seeds than the most common outcome."""
    outcomes, seconds = [], []
    for _ in range(processes):
        start = time.perf_counter()
        child = subprocess.run([sys.executable, "-m", "summrl.perf", "first-sample", "--child",
                                *(["--unsettled"] if unsettled else [])],
                               cwd=ROOT, capture_output=True, text=True)
        if child.returncode != 0:
            sys.exit(f"summrl.perf first-sample: a process ended with exit code {child.returncode}:\n"
                     f"{child.stderr[-3000:]}")
        seconds.append(time.perf_counter() - start)
        outcomes.append(json.loads(child.stdout))
    kinds = Counter(json.dumps(o["rows"]) for o in outcomes)
    usual, count = kinds.most_common(1)[0]
    return {
        "processes": processes,
        "unsettled": unsettled,
        "document": outcomes[0]["document"],
        "differing_processes": processes - count,  # sampled other tokens than the most common outcome
        "outcomes": len(kinds),
        "usual_outcome": hashlib.sha256(usual.encode()).hexdigest()[:12],  # the same with and without --unsettled
        "rows_differing": [sum(a != b for a, b in zip(json.loads(k), json.loads(usual))) for k in kinds if k != usual],
        "process_median_s": round(statistics.median(seconds), 1),
        "mkl_isa": outcomes[0]["mkl_isa"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m summrl.perf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="benchmark", required=True)

    def positive(text: str) -> int:  # a count of 0 failed with a traceback, after minutes of loading and measuring
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
        return value

    def number(low: float, high: float, what: str) -> Callable[[str], float]:
        def parse(text: str) -> float:  # faults at a rate of -1 or 5 ran two full training runs for nothing
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not low < value < high:
                raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
            return value
        return parse

    step = sub.add_parser("step", help="embedded GRPO step time, batched generation, start-up time")
    step.add_argument("--steps", type=positive, default=3, help="GRPO steps to time (median reported)")
    step.add_argument("--repeats", type=positive, default=2, help="throughput measurements (median reported)")
    judge = sub.add_parser("judge", help="judge calls and input tokens per rollout: reward=qa vs Summary-RL's "
                                                 "scheme, and reward=rubric")
    judge.add_argument("--documents", type=positive, default=8, help="sample documents, one group each")
    judge.add_argument("--group-size", type=positive, default=8, help="rollouts per group")
    seconds = number(-1e-9, math.inf, "a number of seconds, 0 or more")
    judge.add_argument("--delay", type=seconds, default=0.2, help="seconds the judge takes per call, for group_wall_s")
    faults = sub.add_parser("faults", help="a training run against a faulty judge vs a fault-free one")
    share = number(0.0, 1.0, "a share between 0 and 1 (both excluded)")
    faults.add_argument("--rate", type=share, default=0.3, help="the share of judge calls that fail")
    faults.add_argument("--seed", type=int, default=1)
    sft = sub.add_parser("sft", help="embedded SFT time for 16 samples of up to 128 tokens")
    sft.add_argument("--samples", type=positive, default=16)
    sft.add_argument("--max-tokens", type=positive, default=128)
    sft.add_argument("--repeats", type=positive, default=3, help="train_sft calls to time (median reported)")
    serve = sub.add_parser("serve", help="summrl.serve: latency and throughput of concurrent /v1/summarize requests")
    serve.add_argument("--run-dir", required=True, help="a training run folder (runs/<name>)")
    serve.add_argument("--step", default="latest")
    serve.add_argument("--concurrency", type=positive, default=16)
    serve.add_argument("--best-of-n", type=positive, nargs="+", default=[1, 4])
    serve.add_argument("--selector", default="length", help="length needs no judge; ruler measures the judge too")
    serve.add_argument("overrides", nargs="*", help="more summrl.serve overrides, e.g. backend=embedded "
                                                    "backend.dtype=bfloat16")
    first = sub.add_parser("first-sample", help="how often a fresh process samples other tokens for the same seeds")
    first.add_argument("--processes", type=positive, default=20, help="fresh processes, one after another")
    first.add_argument("--unsettled", action="store_true", help="skip the engine's MKL warm-up at load (to compare)")
    first.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one process's sample, as JSON
    args = parser.parse_args(argv)

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if args.benchmark == "faults":
        figures = bench_faults(args.rate, args.seed)
        print(json.dumps(figures, indent=2))
        # a run that left no record, or a fault-free run that failed: no figures (the faulty one may stop by design)
        if any(not run["status"] for run in figures.values()) or figures["fault_free"]["returncode"]:
            print("summrl.perf faults: a training run failed (see its returncode and stderr_tail above)",
                  file=sys.stderr)
            sys.exit(1)
        return
    if args.benchmark == "serve":
        from summrl.config import compose
        from summrl.errors import ConfigError, Failure
        from summrl.serve.config import validate_serve

        # the server runs in the project's folder: a relative --run-dir is the user's, from where they typed it
        args.run_dir = str(Path(args.run_dir).expanduser().absolute())
        try:  # what a server would refuse, refused before one starts
            for n in args.best_of_n:
                validate_serve(compose("serve", [f"run_dir={args.run_dir}", f"step={args.step}", f"serve.best_of_n={n}",
                                                 f"serve.selector={args.selector}", *args.overrides]))
        except ConfigError as e:
            failure = Failure("config", str(e))
            print(failure.line, file=sys.stderr)
            sys.exit(failure.exit_code)
        result = bench_serve(args.run_dir, args.concurrency, tuple(args.best_of_n), args.selector, args.step,
                             tuple(args.overrides))
        result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
        print(json.dumps(result, indent=2))
        return
    if args.benchmark == "first-sample":
        if args.child:
            print(json.dumps(run_async(first_sample(args.unsettled))))
            return
        result = bench_first_sample(args.processes, args.unsettled)
        result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
        print(json.dumps(result, indent=2))
        return
    if args.benchmark == "judge":
        print(json.dumps(run_async(bench_judge(args.documents, args.group_size, args.delay)), indent=2))
        return
    if args.benchmark == "sft":
        result = run_async(bench_sft(args.samples, args.max_tokens, args.repeats))
        result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
        print(json.dumps(result, indent=2))
        return
    startup = startup_seconds()
    result = run_async(bench_step(args.steps, args.repeats))
    result["startup_s"] = round(statistics.median(startup), 2)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
