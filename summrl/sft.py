"""The SFT warm start (``sft=distill|best_of_n``): collect summaries, keep the best by the run's reward, fine-tune.

A stage beside the GRPO loop: ``loop.train`` calls :func:`confirm_cost` once the documents are loaded (before
any model loads or anything is paid), then :func:`warm_start` once, at step 0. Collection keeps, in
``<run dir>/sft/``, each appended and fsynced as it happens:

- ``summaries.jsonl``: every summary written (a teacher's reply, a policy sample) the moment it arrives, kept or
  not, with its ``finish_reason`` ("length": cut off at trainer.max_summary_tokens), so that a crash or a rerun never
  asks for it again;
- ``samples.jsonl``: the kept samples, in ART's SFT chat format;
- ``collected.jsonl``: one line per document done (scored and filtered), with every sample's reward and the filter
  applied (another one on a rerun filters the document again, its latest line counting);
- ``teacher_usage.json``: the teacher's calls, tokens and $ over every invocation of the run.

A document whose teacher calls fail after their retries, or whose scores are missing (the judge failed), stays
pending while the others go on; the stage then fails with one :class:`SFTError` and a rerun continues it.
Training is ``model.train_sft``; ``record.json`` is written once it has trained, so a resumed run never redoes it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import art

from summrl.backends import takes_burst_tags
from summrl.config import FREE_JUDGES, Config, reward_kinds, rewards_of_kind
from summrl.cost import Calls, Work, confirmed, estimate, needs_confirmation, render
from summrl.data import Document
from summrl.errors import ExpectedFailure, finish_despite_a_signal
from summrl.job import append_jsonl, jsonl_rows, write_json
from summrl.judges.client import SPEND_GUARD, CallBudget, JudgeClient, JudgeError, ReplyShapeError
from summrl.keys import model_key_names
from summrl.rewards import Missing
from summrl.prompt import SummaryPrompt
from summrl.rollout import Burst, rollout, sample_seed, summary_of
from summrl.storage import CheckpointBackup, NoBackup, sft_dir
from summrl.storage import SFT_RECORD as RECORD

log = logging.getLogger(__name__)

SUMMARIES = "summaries.jsonl"
SAMPLES = "samples.jsonl"
COLLECTED = "collected.jsonl"
USAGE = "teacher_usage.json"
USAGE_KEYS = ("calls", "retries", "failures", "input_tokens", "output_tokens", "cost_usd")


class CostNotConfirmed(ExpectedFailure, RuntimeError):
    """The user declined the teacher's estimated cost: nothing was called."""

    failure = "not_confirmed"


class SFTError(ExpectedFailure, RuntimeError):
    """An SFT stage the user can fix or continue: teacher calls or judge scores that failed after their retries
    (a rerun continues), or no sample that passed the filter."""

    failure = "sft"


def saved_record(config: Config) -> dict:
    """The record of an SFT stage that has trained ({} when none has): its step, samples and costs."""
    path = sft_dir(config) / RECORD
    return json.loads(path.read_text()) if path.is_file() else {}


def record_after_stop(config: Config, step: int) -> dict:
    """The record of an SFT stage whose checkpoint (``step``) was saved but whose run stopped before the record was
    written (Ctrl-C, a kill): the checkpoint is SFT's, so SFT is not trained again (it was, a second pass on top)."""
    record = {"kind": config.sft.kind, "step": step, **collected_figures(config),
              "note": "the run stopped after SFT trained, before this record was written: rebuilt from sft/"}
    write_json(sft_dir(config) / RECORD, record)
    return record


def record_before_training(config: Config) -> Optional[dict]:
    """sft=distill's record of a stage that stopped before it trained (a teacher or judge that failed, a signal),
    ``incomplete``: the teacher's calls and $ so far were in sft/ alone. None where nothing was paid, or SFT trained."""
    if config.sft.kind != "distill" or saved_record(config):
        return None
    figures = collected_figures(config)
    return {"kind": "distill", **figures, "incomplete": True} if figures["teacher_calls"] else None


def collected_figures(config: Config) -> dict[str, Any]:
    """What ``sft/`` holds: documents, samples collected, cut off and kept, their mean rewards, and the teacher's
    calls, retries and $ over every invocation (a record rebuilt after a stop lacked all but the counts)."""
    folder = sft_dir(config)
    collected, samples, usage = collected_rows(folder), training_samples(config), teacher_usage(folder)
    rewards = [r for row in collected for r in row["rewards"] if r is not None]
    return {"documents": len(collected), "samples_collected": sum(len(row["rewards"]) for row in collected),
            "samples_cut_off": sum(len(row.get("cut_off", ())) for row in collected), "samples_kept": len(samples),
            "mean_reward_collected": sum(rewards) / len(rewards) if rewards else None,
            "mean_reward_kept": sum(t.reward for t in samples) / len(samples) if samples else None,
            "teacher_calls": int(usage["calls"]), "teacher_retries": int(usage["retries"]),
            "teacher_cost_usd": usage["cost_usd"]}


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return jsonl_rows(path.read_text())  # a line cut off by a crash is skipped: what it held is asked for again


def eligible(rewards: Sequence[Optional[float]], finishes: Sequence[Optional[str]], keep_cut_off: bool
             ) -> list[Optional[float]]:
    """The rewards ``keep`` may choose from: a summary cut off at max_tokens has none unless ``keep_cut_off``. An SFT
    sample is a finished turn (its end-of-turn token is trained), so a cut one taught the model to stop mid-sentence;
    GRPO trains only the tokens a rollout drew. A summary written before 2026-12-07 has no finish_reason: kept."""
    return [None if finish == "length" and not keep_cut_off else reward for reward, finish in zip(rewards, finishes)]


def collected_rows(folder: Path) -> list[dict]:
    """Each collected document's latest line of collected.jsonl (a document filtered again has several)."""
    return list({row["document_id"]: row for row in read_jsonl(folder / COLLECTED)}.values())


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


def written_summaries(folder: Path) -> dict[str, dict[int, dict]]:
    """The summaries already on disk: document id -> {sample index: its summaries.jsonl row}."""
    written: dict[str, dict[int, dict]] = {}
    for row in read_jsonl(folder / SUMMARIES):
        written.setdefault(row["document_id"], {})[int(row["index"])] = row
    return written


def teacher_usage(folder: Path) -> dict[str, float]:
    """The teacher's calls, retries, failed calls, tokens and $ over every invocation of this run."""
    path = folder / USAGE
    saved = json.loads(path.read_text()) if path.is_file() else {}
    return {key: saved.get(key, 0) for key in USAGE_KEYS}


# --------------------------------------------------------------------------- writers of summaries


# a run keeps the summary budget its val passes were drawn with (loop.RESUMED_AS_TRAINED): a higher one is a new run
EMPTY_HINT = "raise trainer.max_summary_tokens for a thinking model, in a new run (another run.name)"


def non_empty() -> Callable[[str], str]:
    """A teacher's reply must hold a summary: a thinking model can spend its tokens and return nothing. An empty reply
    is asked again once; a second is the teacher's failure, not retried (each retry a paid call that spends the same
    tokens: 6 calls for one summary, at the default sft.teacher.max_retries)."""
    empty = 0

    def check(text: str) -> str:
        nonlocal empty
        if text.strip():
            return text
        empty += 1
        if empty > 1:
            raise JudgeError(f"the teacher's reply was empty twice ({EMPTY_HINT})", kind="EmptyReply")
        raise ReplyShapeError(f"the teacher's reply is empty ({EMPTY_HINT})")

    return check


class Teacher:
    """sft=distill: any litellm model or OpenAI-compatible endpoint writes the summaries, through the judges' client
    (concurrency, retries with backoff and Retry-After, counts, key redaction). Its usage is kept on disk after
    every call, added to what earlier invocations of the run spent."""

    def __init__(self, config: Config) -> None:
        t = config.sft.teacher
        self.trainer, self.folder = config.trainer, sft_dir(config)
        key_env = t.api_key_env
        if not key_env and not t.api_base:  # litellm's variable for a hosted teacher: read and redacted as ours
            key_env = next((n for n in model_key_names(t.model) if os.environ.get(n)), None)
        self.client = JudgeClient(model=t.model, api_key_env=key_env, api_base=t.api_base,
                                  max_concurrency=t.max_concurrency, timeout_s=t.timeout_s, max_retries=t.max_retries,
                                  retry_base_s=t.retry_base_s, retry_max_s=t.retry_max_s)
        self.earlier = teacher_usage(self.folder)
        budget = t.max_cost_usd
        self.budget = None if budget is None else CallBudget(lambda: self.client.usage.cost_usd, budget,
                                                             "sft.teacher.max_cost_usd")

    def usage(self) -> dict[str, float]:
        now = self.client.usage
        return {key: self.earlier[key] + getattr(now, key) for key in USAGE_KEYS}

    async def write(self, document: Document, index: int, burst: Optional[Burst] = None) -> tuple[str, Optional[str]]:
        """(the summary, its finish_reason). ``burst`` is for the embedded policy's batcher; a teacher's server
        batches as it will."""
        t = self.trainer
        guarded = SPEND_GUARD.set(self.budget.guard) if self.budget is not None else None
        try:
            return await self.client.complete_text(SummaryPrompt.of(t).messages(document),
                                                   max_tokens=t.max_summary_tokens, temperature=t.temperature,
                                                   check=non_empty())
        finally:
            if guarded is not None:  # (the judge's calls that score the summaries are not the teacher's)
                SPEND_GUARD.reset(guarded)
            write_json(self.folder / USAGE, self.usage())


class Policy:
    """sft=best_of_n: the base policy writes the summaries, through the same rollout as GRPO."""

    def __init__(self, model: art.Model, config: Config) -> None:
        self.model, self.trainer, self.seed = model, config.trainer, config.seed

    async def write(self, document: Document, index: int, burst: Optional[Burst] = None) -> tuple[str, Optional[str]]:
        t = self.trainer
        # Seeded like the loop's rollouts, and sent in bursts (``collect``) where the server reads them
        trajectory = await rollout(self.model, document, prompt=SummaryPrompt.of(t), max_tokens=t.max_summary_tokens,
                                   temperature=t.temperature, seed=sample_seed(self.seed, "sft", document.id, index),
                                   burst=burst)
        return summary_of(trajectory), trajectory.messages_and_choices[-1].finish_reason


# --------------------------------------------------------------------------- the cost guard


def confirm_cost(config: Config, train_docs: Sequence[Document]) -> None:
    """sft=distill: print the teacher's calls still to make and their price (the benchmark's cost guard), and ask
    before any of them (``sft.confirm=false`` skips the question). Called before the model loads, so a refusal
    costs nothing. Raises CostNotConfirmed."""
    s, t = config.sft, config.trainer
    if s.kind != "distill" or saved_record(config):
        return
    folder = sft_dir(config)
    done = {row["document_id"] for row in collected_rows(folder)}
    written = written_summaries(folder)
    # every document not yet collected is scored, all its summaries: those written by an earlier run too (a run whose
    # judge failed scores them again; its calls were left out of the plan). The teacher writes only the missing ones.
    pending = {d.id: s.samples_per_doc for d in collection_documents(config, train_docs) if d.id not in done}
    if not pending:
        return
    # the indices missing, as collect() asks for them (summaries past a lower sft.samples_per_doc are not counted)
    to_buy = {doc_id: sum(i not in written.get(doc_id, {}) for i in range(s.samples_per_doc)) for doc_id in pending}
    docs = [d for d in train_docs if d.id in pending]
    teacher = Calls(f"teacher {s.teacher.model}", s.teacher.model)
    llm_judge = config.judge.kind not in FREE_JUDGES
    judge = Calls(f"judge {getattr(config.judge, 'model', config.judge.kind)}",
                  getattr(config.judge, "model", None) if llm_judge else None)
    # the judge calls scoring the summaries makes: the reward's terms (its QA answering and grading where it has a QA
    # term, RULER, each rubric's writing and scoring), as the benchmark prices them. Rubric calls were left out of an
    # "upper bound" the user confirmed (qa_rubric: 9 calls priced, 15 made), and QA calls priced for a reward with none
    kinds = reward_kinds(config.reward)
    lines = estimate([Work(teacher, 1, pending, to_buy)], docs, judge, prompt=SummaryPrompt.of(t),
                     max_summary_tokens=t.max_summary_tokens, reward_uses_ruler="ruler" in kinds,
                     qa_calls=llm_judge and "qa" in kinds,
                     rubric_rewards=list(rewards_of_kind(config.reward, "rubric").values()) if llm_judge else [])
    calls = sum(to_buy.values())
    plan = render(lines, calls, 0).split("\n", 1)[1]
    log.info(f"summrl: sft plan: {calls} teacher summaries for {sum(n > 0 for n in to_buy.values())} documents "
             f"({sum(len(v) for v in written.values())} already written), {len(pending)} documents to score\n{plan}")
    budget = s.teacher.max_cost_usd
    if budget is not None and (teacher.usd is None or teacher.usd > budget):  # (estimate() filled in its calls)
        raise CostNotConfirmed(f"sft.teacher.max_cost_usd={budget:g}: the teacher's estimate is {teacher.price()}, "
                               "over the budget; nothing was called. Raise the budget, or buy fewer summaries "
                               "(sft.samples_per_doc, sft.max_docs)")
    if s.confirm and needs_confirmation(lines) and not confirmed():
        raise CostNotConfirmed("sft: the teacher's cost was not confirmed; nothing was called "
                               "(sft.confirm=false skips the question)")


# --------------------------------------------------------------------------- the stage


async def collect(config: Config, model: Optional[art.Model], reward: Any, train_docs: Sequence[Document],
                  backup: CheckpointBackup | NoBackup | None = None) -> dict:
    """Write ``samples_per_doc`` summaries per pending document (each on disk as it arrives; those already there are
    not asked for again), score each document's, and append the kept ones. Raises SFTError, once every document
    has been tried, when some are left pending."""
    s = config.sft
    folder = sft_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    docs = collection_documents(config, train_docs)
    collected = {row["document_id"]: row for row in collected_rows(folder)}
    pending = [d for d in docs if d.id not in collected]
    log.info(f"summrl: sft collection ({s.kind}): {len(docs) - len(pending)} of {len(docs)} documents already collected")
    writer = Teacher(config) if s.kind == "distill" else Policy(model, config)
    written = written_summaries(folder)
    applied = {"min_reward": s.min_reward, "top_k": s.top_k, "keep_cut_off": s.keep_cut_off}

    def kept_samples(doc: Document, rewards: list[Optional[float]], rows: list[dict]) -> None:
        """The filter applied to a scored document: its kept samples, then its line (the document is done)."""
        finishes = [row.get("finish_reason") for row in rows]
        kept = keep(eligible(rewards, finishes, s.keep_cut_off), s.min_reward, s.top_k)
        samples = [{"messages": [*SummaryPrompt.of(config.trainer).messages(doc),
                                 {"role": "assistant", "content": rows[i]["summary"]}],
                    "metadata": {"document_id": doc.id, "reward": rewards[i]}} for i in kept]
        append_jsonl(folder / SAMPLES, samples)  # samples first: a document is done only once its samples are on disk
        append_jsonl(folder / COLLECTED, [{"document_id": doc.id, "rewards": rewards, "kept": kept, "filter": applied,
                                           "cut_off": [i for i, finish in enumerate(finishes) if finish == "length"]}])

    # A document collected under another filter (sft.min_reward, top_k, keep_cut_off) is filtered again from its
    # rewards and summaries on disk, calling nothing: the fix the "no sample passed" error gives (lower min_reward,
    # rerun) had met the same frozen choice, and only a new run.name, paying for the summaries again, got past it.
    refiltered = 0
    for doc in docs:
        row = collected.get(doc.id)
        rows = [written.get(doc.id, {}).get(i) for i in range(len(row["rewards"]))] if row else []
        if row and row.get("filter") != applied and rows and all(rows):
            kept_samples(doc, row["rewards"], rows)
            refiltered += 1
    if refiltered:
        log.info(f"summrl: sft: {refiltered} collected document(s) filtered again with sft.min_reward={s.min_reward}, "
                 f"sft.top_k={s.top_k}, sft.keep_cut_off={s.keep_cut_off} (from the rewards and summaries on disk)")
    # best_of_n: a few documents at a time, so the embedded endpoint batches their rollouts
    parallel = asyncio.Semaphore(s.teacher.max_concurrency if s.kind == "distill" else config.trainer.groups_per_step)
    failed: dict[str, str] = {}  # document id -> what failed, e.g. "teacher RateLimitError"
    first_error: list[str] = []
    started = time.perf_counter()

    def todo(doc: Document) -> list[int]:
        return [i for i in range(s.samples_per_doc) if i not in written.get(doc.id, {})]

    async def write(doc: Document, index: int, burst: Optional[Burst]) -> None:
        text, finish = await writer.write(doc, index, burst)
        row = {"document_id": doc.id, "index": index, "summary": text, "finish_reason": finish}
        append_jsonl(folder / SUMMARIES, [row])
        written.setdefault(doc.id, {})[index] = row

    async def one(doc: Document, burst: Optional[Burst] = None) -> None:
        async with parallel:
            results = await asyncio.gather(*(write(doc, i, burst) for i in todo(doc)), return_exceptions=True)
            errors = [e for e in results if isinstance(e, BaseException)]
            unexpected = [e for e in errors if not isinstance(e, JudgeError)]
            if unexpected:
                raise unexpected[0]
            if errors:  # the summaries that did arrive are on disk; the rerun asks only for the others
                failed[doc.id] = f"teacher {errors[-1].kind}"
                # the client is the judges' one: its message says "judge <model>"
                first_error.append(str(errors[-1]).replace("judge ", "teacher ", 1))
                return
            rows = [written[doc.id][i] for i in range(s.samples_per_doc)]
            summaries = [row["summary"] for row in rows]
            scores = await reward.score_group(doc, summaries)
        missing = [sc for sc in scores if isinstance(sc, Missing)]
        if missing:  # scored again by a rerun, from the summaries on disk
            failed[doc.id] = f"judge {missing[0].kind}"
            first_error.append(missing[0].error)
            return
        kept_samples(doc, [sc.reward for sc in scores], rows)
        if backup is not None:
            await backup.save_sft()

    try:
        if s.kind == "best_of_n" and takes_burst_tags(config):
            # groups_per_step documents at a time, their summaries one burst: the embedded batcher then makes the
            # same generate calls in every run, as for a step's rollouts (README "What a seed fixes")
            size = config.trainer.groups_per_step
            for wave in (pending[i:i + size] for i in range(0, len(pending), size)):
                rows = sum(len(todo(d)) for d in wave)
                burst = Burst.new(rows) if rows else None
                await asyncio.gather(*(one(d, burst) for d in wave))
        else:
            await asyncio.gather(*(one(d) for d in pending))
    finally:
        if backup is not None:
            await backup.save_sft(force=True)
    stopped = [doc_id for doc_id, kind in failed.items() if kind == "teacher SpendStopped"]
    if stopped:
        spent = writer.client.usage.cost_usd
        raise SFTError(f"sft.teacher.max_cost_usd={s.teacher.max_cost_usd:g} reached (${spent:.4f} spent): "
                       f"{len(stopped)} of {len(docs)} documents still need summaries; every summary written is kept "
                       f"in {folder}, so a rerun pays only for the rest")
    if failed:
        kinds = ", ".join(f"{kind} x{n}" for kind, n in Counter(failed.values()).most_common())
        first = " ".join(first_error[0].split())[:300]
        raise SFTError(f"sft: {len(failed)} of {len(docs)} documents failed after their retries ({kinds}; first: "
                       f"{first}) and are left pending; {len(docs) - len(failed)} are collected and "
                       f"every summary written is kept in {folder}: rerun the same command (same run.name) to continue "
                       "with the pending ones only")
    usage = teacher_usage(folder)
    return {"collect_s": round(time.perf_counter() - started, 1), "teacher_calls": int(usage["calls"]),
            "teacher_retries": int(usage["retries"]), "teacher_cost_usd": usage["cost_usd"]}


def training_samples(config: Config) -> list[art.Trajectory]:
    """The kept samples of the documents recorded as done. A crash between a document's samples and its line in
    collected.jsonl leaves samples of an attempt that a rerun redoes: only each document's last attempt counts."""
    folder = sft_dir(config)
    kept = {row["document_id"]: len(row["kept"]) for row in collected_rows(folder)}
    by_doc: dict[str, list[dict]] = {}
    for row in read_jsonl(folder / SAMPLES):
        by_doc.setdefault(row["metadata"]["document_id"], []).append(row)
    # by document id, not in the order the documents finished (a teacher's or judge's latency, a resumed collection):
    # the epochs' shuffle, seeded, then trains the same batches in every run
    rows = [row for doc_id, n in sorted(kept.items()) if n for row in by_doc.get(doc_id, [])[-n:]]
    return [art.Trajectory(messages_and_choices=row["messages"], reward=row["metadata"]["reward"] or 0.0)
            for row in rows]


async def warm_start(config: Config, model: art.TrainableModel, reward: Any, train_docs: Sequence[Document],
                     backup: CheckpointBackup | NoBackup | None = None) -> dict:
    """Collect (or continue collecting), then ``model.train_sft`` over ``sft.epochs`` shuffled passes.
    Returns the record for ``result.json``'s ``sft``; the SFT checkpoint is the model's next step."""
    s = config.sft
    record: dict[str, Any] = {"kind": s.kind, **await collect(config, model, reward, train_docs, backup)}
    record.update(collected_figures(config))
    samples = training_samples(config)
    if not samples:  # every document was scored (failures raise above): the filter kept none
        rewards = [r for row in collected_rows(sft_dir(config)) for r in row["rewards"] if r is not None]
        cut = record["samples_cut_off"]
        raise SFTError(f"sft: no sample passed the filter (sft.min_reward={s.min_reward}, sft.top_k={s.top_k}) out of "
                       f"{record['samples_collected']} scored (best {max(rewards, default=float('nan')):.3f}"
                       + (f"; {cut} cut off at trainer.max_summary_tokens={config.trainer.max_summary_tokens} and not "
                          "kept: raise it, or set sft.keep_cut_off=true to train them as finished summaries" if cut
                          and not s.keep_cut_off else "")
                       + "): lower sft.min_reward, or use sft.min_reward=null sft.top_k=1")
    epochs = []
    for epoch in range(s.epochs):
        order = list(samples)
        random.Random(config.seed + epoch).shuffle(order)
        epochs.extend(order)
    started = time.perf_counter()
    # Ctrl-C or SIGTERM: the update still writes its checkpoint, so it is finished and recorded, then the run stops
    _, stopped = await finish_despite_a_signal(lambda: model.train_sft(
        epochs, config=art.TrainSFTConfig(learning_rate=s.lr, batch_size=s.batch_size)), "SFT's update and checkpoint",
        "SFT's training")
    record.update(train_s=round(time.perf_counter() - started, 1), step=await model.get_step())
    write_json(sft_dir(config) / RECORD, record)  # before anything else can fail: SFT is never redone
    # The stage's figures join the history at the SFT step: W&B mirrors it (its summary keeps the last values).
    await model.log(split="train", step=record["step"], metrics={
        "sft/samples_kept": float(record["samples_kept"]), "sft/samples_collected": float(record["samples_collected"]),
        "sft/teacher_calls": float(record["teacher_calls"]), "sft/teacher_cost_usd": float(record["teacher_cost_usd"])})
    cut_note = (f", {record['samples_cut_off']} cut off at trainer.max_summary_tokens and "
                f"{'kept as finished (sft.keep_cut_off)' if s.keep_cut_off else 'not kept'}"
                if record["samples_cut_off"] else "")
    log.info(f"summrl: sft: {record['samples_kept']} of {record['samples_collected']} samples kept{cut_note} "
             f"(mean reward {record['mean_reward_kept']:.3f} vs {record['mean_reward_collected']:.3f} collected), "
             f"{s.epochs} epoch(s) in {record['train_s']}s -> step {record['step']}")
    if stopped:
        raise SFTStopped(record)
    return record


class SFTStopped(asyncio.CancelledError):
    """Ctrl-C or SIGTERM came while SFT trained: its checkpoint and record are written; the run stops now."""

    def __init__(self, record: dict) -> None:
        super().__init__("stopped after SFT")
        self.record = record
