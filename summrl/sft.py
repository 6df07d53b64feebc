"""The SFT warm start (``sft=distill|best_of_n``): collect summaries, keep the best by the run's reward, fine-tune.

A stage beside the GRPO loop: ``loop.train`` calls :func:`warm_start` once, at step 0. Collection writes
``<run dir>/sft/samples.jsonl`` (ART's SFT chat format, one kept sample a line) and ``collected.jsonl`` (one
line per document done, with every sample's reward), each appended and fsynced as a document finishes, so a
rerun skips the documents already done and never pays a teacher twice. Training is ``model.train_sft``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import art

from summrl.config import Config
from summrl.data import Document
from summrl.rewards import Missing
from summrl.job import write_json
from summrl.rollout import rollout, sample_seed, summary_messages, summary_of

SAMPLES = "samples.jsonl"
COLLECTED = "collected.jsonl"
RECORD = "record.json"  # the stage's record once SFT has trained: a resumed run reads it and never redoes SFT


class CostNotConfirmed(RuntimeError):
    """The user declined the teacher's estimated cost: nothing was called."""


class SFTError(RuntimeError):
    """A failure of the SFT stage the user can fix (nothing passed the filter, the teacher failed after its retries)."""


def sft_dir(config: Config) -> Path:
    return Path(config.run.dir) / "sft"


def saved_record(config: Config) -> dict:
    """The record of an SFT stage that has trained ({} when none has): its step, samples and costs."""
    path = sft_dir(config) / RECORD
    return json.loads(path.read_text()) if path.is_file() else {}


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut off by a crash: its document is collected again
            continue
    return rows


def append_jsonl(path: Path, rows: Sequence[dict]) -> None:
    cut = path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
    with path.open("a") as f:
        if cut:  # the last write was cut off by a crash: start a fresh line
            f.write("\n")
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def keep(rewards: Sequence[Optional[float]], min_reward: Optional[float], top_k: Optional[int]) -> list[int]:
    """Indices of the samples to train on: every one >= min_reward, or else the top_k (missing rewards never)."""
    scored = [(r, i) for i, r in enumerate(rewards) if r is not None]
    if min_reward is not None:
        return [i for r, i in scored if r >= min_reward]
    return sorted(i for _, i in sorted(scored, key=lambda x: -x[0])[:top_k])


def collection_documents(config: Config, train_docs: Sequence[Document]) -> list[Document]:
    docs = list(train_docs)
    random.Random(config.seed).shuffle(docs)  # a capped collection samples the split, same seed same documents
    return docs[: config.sft.max_docs] if config.sft.max_docs else docs


# --------------------------------------------------------------------------- writers of summaries


class Teacher:
    """sft=distill: any litellm model or OpenAI-compatible endpoint writes the summaries."""

    def __init__(self, config: Config) -> None:
        self.config, self.teacher = config, config.sft.teacher
        self.slot = asyncio.Semaphore(self.teacher.max_concurrency)
        self.calls, self.cost_usd = 0, 0.0

    def _api_key(self) -> Optional[str]:
        if self.teacher.api_key_env:
            key = os.environ.get(self.teacher.api_key_env)
            if not key:
                raise RuntimeError(f"sft.teacher: the environment variable {self.teacher.api_key_env} is not set")
            return key
        return "none" if self.teacher.api_base else None

    async def one(self, document: Document) -> str:
        import litellm

        t = self.config.trainer
        async with self.slot:
            response = await litellm.acompletion(
                model=self.teacher.model, messages=summary_messages(document, t.max_words),
                api_base=self.teacher.api_base, api_key=self._api_key(), max_tokens=t.max_summary_tokens,
                temperature=t.temperature, timeout=self.teacher.timeout_s, num_retries=3,
            )
        self.calls += 1
        try:
            self.cost_usd += float(litellm.completion_cost(completion_response=response) or 0.0)
        except Exception:  # not in litellm's cost map
            pass
        return response.choices[0].message.content or ""

    async def write(self, document: Document, n: int) -> list[str]:
        return list(await asyncio.gather(*(self.one(document) for _ in range(n))))


class Policy:
    """sft=best_of_n: the base policy writes the summaries, through the same rollout as GRPO."""

    def __init__(self, model: art.Model, config: Config) -> None:
        self.model, self.trainer, self.seed = model, config.trainer, config.seed

    async def write(self, document: Document, n: int) -> list[str]:
        t = self.trainer
        # Seeded like the loop's rollouts: the same run collects the same samples, whatever is batched with them.
        trajectories = await asyncio.gather(*(
            rollout(self.model, document, max_words=t.max_words, max_tokens=t.max_summary_tokens,
                    temperature=t.temperature, seed=sample_seed(self.seed, "sft", document.id, i)) for i in range(n)))
        return [summary_of(tr) for tr in trajectories]


def confirm_teacher_cost(config: Config, pending: Sequence[Document]) -> None:
    """The benchmark's cost guard for the teacher's calls (and an LLM judge's calls to score them)."""
    from summrl.benchmark.cost import Calls, Work, confirmed, estimate, needs_confirmation, render

    s, t = config.sft, config.trainer
    teacher = Calls(f"teacher {s.teacher.model}", s.teacher.model)
    llm_judge = config.judge.kind not in ("lexical", "local", "embedded")
    judge = Calls(f"judge {getattr(config.judge, 'model', config.judge.kind)}",
                  getattr(config.judge, "model", None) if llm_judge else None)
    lines = estimate([Work(teacher, 1, {d.id: s.samples_per_doc for d in pending})], pending, judge,
                     max_words=t.max_words, max_summary_tokens=t.max_summary_tokens,
                     reward_uses_ruler="ruler" in (config.reward.kind, getattr(config.reward, "base", None)),
                     qa_calls=llm_judge)
    plan = render(lines, len(pending) * s.samples_per_doc, 0).split("\n", 1)[1]
    print(f"summrl: sft plan: {len(pending)} documents x {s.samples_per_doc} teacher summaries\n{plan}", flush=True)
    if s.confirm and needs_confirmation(lines) and not confirmed():
        raise CostNotConfirmed("sft: the teacher's cost was not confirmed; nothing was called "
                               "(sft.confirm=false skips the question)")


# --------------------------------------------------------------------------- the stage


async def collect(config: Config, model: art.Model, reward: Any, train_docs: Sequence[Document]) -> dict:
    """Write and score ``samples_per_doc`` summaries per pending document; append the kept ones as they arrive."""
    s = config.sft
    folder = sft_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    docs = collection_documents(config, train_docs)
    done = {row["document_id"] for row in read_jsonl(folder / COLLECTED)}
    pending = [d for d in docs if d.id not in done]
    print(f"summrl: sft collection ({s.kind}): {len(docs) - len(pending)} of {len(docs)} documents already collected",
          flush=True)
    if s.kind == "distill" and pending:
        confirm_teacher_cost(config, pending)
    writer = Teacher(config) if s.kind == "distill" else Policy(model, config)
    # best_of_n: a few documents at a time, so the embedded endpoint batches their rollouts
    parallel = asyncio.Semaphore(s.teacher.max_concurrency if s.kind == "distill" else config.trainer.groups_per_step)
    started = time.perf_counter()

    async def one(doc: Document) -> None:
        async with parallel:
            summaries = await writer.write(doc, s.samples_per_doc)
            scores = await reward.score_group(doc, summaries)
        rewards = [None if isinstance(sc, Missing) else sc.reward for sc in scores]
        kept = keep(rewards, s.min_reward, s.top_k)
        samples = [{"messages": [*summary_messages(doc, config.trainer.max_words),
                                 {"role": "assistant", "content": summaries[i]}],
                    "metadata": {"document_id": doc.id, "reward": rewards[i]}} for i in kept]
        append_jsonl(folder / SAMPLES, samples)  # samples first: a document is done only once its samples are on disk
        append_jsonl(folder / COLLECTED, [{"document_id": doc.id, "rewards": rewards, "kept": kept}])

    await asyncio.gather(*(one(d) for d in pending))
    return {"collect_s": round(time.perf_counter() - started, 1),
            "teacher_calls": getattr(writer, "calls", 0), "teacher_cost_usd": getattr(writer, "cost_usd", 0.0)}


def training_samples(config: Config) -> list[art.Trajectory]:
    """The kept samples of the documents recorded as done. A crash between a document's samples and its line in
    collected.jsonl leaves samples of an attempt that a rerun redoes: only each document's last attempt counts."""
    folder = sft_dir(config)
    kept = {row["document_id"]: len(row["kept"]) for row in read_jsonl(folder / COLLECTED)}
    by_doc: dict[str, list[dict]] = {}
    for row in read_jsonl(folder / SAMPLES):
        by_doc.setdefault(row["metadata"]["document_id"], []).append(row)
    rows = [row for doc_id, n in kept.items() if n for row in by_doc.get(doc_id, [])[-n:]]
    return [art.Trajectory(messages_and_choices=row["messages"], reward=row["metadata"]["reward"] or 0.0)
            for row in rows]


async def warm_start(config: Config, model: art.Model, reward: Any, train_docs: Sequence[Document]) -> dict:
    """Collect (or continue collecting), then ``model.train_sft`` over ``sft.epochs`` shuffled passes.
    Returns the record for ``result.json``'s ``sft``; the SFT checkpoint is the model's next step."""
    s = config.sft
    record: dict[str, Any] = {"kind": s.kind, **await collect(config, model, reward, train_docs)}
    collected = read_jsonl(sft_dir(config) / COLLECTED)
    samples = training_samples(config)
    rewards = [r for row in collected for r in row["rewards"] if r is not None]
    record.update(documents=len(collected), samples_collected=sum(len(row["rewards"]) for row in collected),
                  samples_kept=len(samples),
                  mean_reward_collected=sum(rewards) / len(rewards) if rewards else None,
                  mean_reward_kept=sum(t.reward for t in samples) / len(samples) if samples else None)
    if not samples:
        raise RuntimeError(f"sft: no sample passed the filter (sft.min_reward={s.min_reward}, sft.top_k={s.top_k}) "
                           f"out of {record['samples_collected']}: lower sft.min_reward")
    epochs = []
    for epoch in range(s.epochs):
        order = list(samples)
        random.Random(config.seed + epoch).shuffle(order)
        epochs.extend(order)
    started = time.perf_counter()
    await model.train_sft(epochs, config=art.TrainSFTConfig(learning_rate=s.lr, batch_size=s.batch_size))
    record.update(train_s=round(time.perf_counter() - started, 1), step=await model.get_step())
    write_json(sft_dir(config) / RECORD, record)  # before anything else can fail: SFT is never redone
    print(f"summrl: sft: {record['samples_kept']} of {record['samples_collected']} samples kept "
          f"(mean reward {record['mean_reward_kept']:.3f} vs {record['mean_reward_collected']:.3f} collected), "
          f"{s.epochs} epoch(s) in {record['train_s']}s -> step {record['step']}", flush=True)
    return record
