"""The documents a run validates and trains on (and the benchmark scores), with their questions.

Repliqa brings its questions. ``dataset=documents`` reads the user's documents (:mod:`summrl.data.documents`), holds
them to ``dataset.max_document_tokens``, splits them with the seeded shuffle, and gets questions for those that need
them from :class:`summrl.judges.questions.QuestionBank` (cached, or written and checked by the judge). Val documents
always need questions (every run reports QA accuracy on val); train documents need them when the reward uses the
QA reward. A paid writer's cost is estimated and printed first, held to ``dataset.questions.max_cost_usd``, and
confirmed on stdin unless ``dataset.questions.confirm=false``: declining calls nothing. What happened (files
skipped, duplicates, long documents, questions written, kept and dropped by reason, the closed-book answer rate) is
printed and returned as the run's ``dataset`` record.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from summrl.config import FREE_JUDGES, reward_kinds
from summrl.cost import Calls, confirmed
from summrl.data import Document, all_documents, load_splits, split
from summrl import inbox
from summrl.data.documents import (PART, Loaded, by_source, limit_length, policy_token_counter, read,
                                   same_text, source_id, text_hash)
from summrl.data.split import DataError
from summrl.errors import ConfigError, ExpectedFailure
from summrl.judges import build_judge, missing_keys
from summrl.judges.cache import JsonCache
from summrl.judges.client import REQUEST_COST, SPEND_GUARD, SpendStopped
from summrl.preflight import refuse
from summrl.storage import latest_local_step
from summrl.judges.questions import (Checked, QuestionBank, QuestionSettings, estimated_tokens, question_writer,
                                     totals)

log = logging.getLogger(__name__)


class QuestionsNotConfirmed(ExpectedFailure, RuntimeError):
    """The user declined the question writer's estimate, or it is over dataset.questions.max_cost_usd: nothing was
    called."""

    failure = "not_confirmed"


class QuestionsFailed(ExpectedFailure, RuntimeError):
    """The judge failed to write some documents' questions after its retries; those written are cached."""

    failure = "judge"


@dataclass
class Splits:
    val: list[Document]
    train: list[Document]
    record: dict[str, Any] = field(default_factory=dict)  # result.json's "dataset"
    lines: Optional[dict[str, int]] = None  # dataset=inbox: each document's inbox line (the watermark counts lines)


class LazyCounter:
    """The policy's token counter, loaded on first use: most documents are short enough to need none."""

    def __init__(self, model: Any) -> None:
        self.model, self._count = model, None

    def __call__(self, text: str) -> int:
        if self._count is None:
            self._count = policy_token_counter(self.model)
        return self._count(text)


def read_documents(config: Any, count_tokens: Optional[Callable[[str], int]] = None, report: bool = True) -> Loaded:
    """dataset=documents: the documents, duplicates kept once, held to max_document_tokens; what happened printed
    (unless ``report`` is false: read a second time)."""
    loaded = limit_length(read(config.dataset), config.dataset, count_tokens or LazyCounter(config.model))
    for line in loaded.lines() if report else ():
        log.info(line)
    return loaded


def needs_questions(config: Any, train: bool) -> bool:
    """Val always needs questions (QA accuracy on val); train when the reward uses the QA reward."""
    return not train or "qa" in reward_kinds(config.reward)


def val_digest(val: Sequence[Document]) -> str:
    """What the val split is (result.json's dataset.val_sha256, which a resume must match): its documents' ids and
    texts, before the question check (the split's seeded shuffle moves documents when one is added to or removed
    from dataset.path, and an edited one is another document)."""
    digest = hashlib.sha256()
    for document in sorted(val, key=lambda d: d.id):
        digest.update(f"{document.id}\0{document.text}\0".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:16]


async def load(config: Any, *, every_document: bool = False, val_only: bool = False,
               before_questions: Optional[Callable[[list[Document], list[Document]], None]] = None) -> Splits:
    """(val, train) for ``config.dataset``, questions included. ``every_document``: every document as val, none as
    train (the benchmark's split=all); ``val_only``: only val needs questions (the benchmark). ``before_questions``
    checks the val/train split (repliqa's, or dataset=documents' before any question is written: the question check
    only removes documents, and a refusal known from the split came after the user had confirmed and paid for them). Raises DataError,
    ConfigError, QuestionsNotConfirmed, QuestionsFailed."""
    dataset = config.dataset
    if dataset.kind == "inbox":
        return await load_inbox(config)
    if dataset.kind == "repliqa":
        if every_document:
            return Splits(all_documents(dataset), [], {"kind": "repliqa", "split": "all"})
        val, train = load_splits(dataset)
        if before_questions is not None:
            before_questions(val, train)
        return Splits(val, train, {"kind": "repliqa", "val": len(val), "train": len(train),
                                   "val_sha256": val_digest(val)})
    loaded = read_documents(config)
    val, train = (list(loaded.documents), []) if every_document else split_whole(loaded, dataset)
    if before_questions is not None:
        before_questions(val, train)
    return await with_questions(config, loaded, val, train, train_needs=needs_questions(config, True) and not val_only,
                                train_required=not every_document)


async def load_inbox(config: Any) -> Splits:
    """dataset=inbox: what the server recorded in the run's inbox, in order; the first ``val_size`` documents are
    val. Which of the rest are new is the watermark's business (:func:`summrl.inbox.online`, at the resume step)."""
    got = inbox.read(config.run.dir)
    if got.cut_short:
        log.info(f"summrl: inbox: {got.cut_short} line(s) cut short (a crash while recording) or still being "
                 "written (no newline yet): skipped")
    documents, lines, seen, duplicates = [], {}, {}, []
    for row in got.rows:
        text = row["text"].strip()
        doc_id, key = str(row.get("id") or text_hash(text)[:16]), same_text(text)
        if key in seen:  # served twice: trained on once
            duplicates.append((f"{doc_id} (line {row['line'] + 1})", seen[key]))
            continue
        while doc_id in lines or PART.search(doc_id):  # one id for two texts, or a part's name: keep both, apart
            doc_id = f"{doc_id}~{row['line']}"  # (again if a client's own id was that: ids are the watermark's keys)
        seen[key] = doc_id
        documents.append(Document(id=doc_id, topic="", text=text, questions=()))
        lines[doc_id] = row["line"]
    loaded = limit_length(Loaded(str(inbox.inbox_dir(config.run.dir) / inbox.DOCUMENTS), documents,
                                 duplicates=duplicates), config.dataset, LazyCounter(config.model))
    for line in loaded.lines()[1:]:  # duplicates and documents over the limit (skipped: the watermark passes them)
        log.info(line)
    # Val is the first val_size documents recorded, each with all its parts, counted before the length limit skips
    # any: one over it leaves val short, where the next one took its place, and another limit in a later run moved a
    # document already trained on into val.
    n_val = config.dataset.val_size
    kept = inbox.val_lines(config.run.dir)  # the val set the run's first online step kept
    first = {d.id for d in documents[:n_val]} if kept is None else {i for i, line in lines.items() if line in kept}
    groups = by_source(loaded.documents)
    val = [d for g in groups if source_id(g[0].id) in first for d in g]
    train = [d for g in groups if source_id(g[0].id) not in first for d in g]
    if not val and train:
        raise DataError(f"the online val set, the first {n_val} recorded documents, are all over "
                        f"dataset.max_document_tokens={config.dataset.max_document_tokens} and skipped: raise the "
                        "limit, or set dataset.long_documents=split")
    if not val:
        return Splits([], [], {"kind": "inbox", "recorded": len(got.rows), "documents": 0}, lines={})
    # what the run trained on by its latest checkpoint here needs no questions (inbox.online leaves it out): with
    # reward=qa, every document ever recorded had its questions written, and paid for, at every online run. (A
    # checkpoint restored from S3 later resumes at a later step: the documents between are still in train.)
    done = inbox.consumed_at(config.run.dir, latest_local_step(config))
    train = [d for d in train if lines[source_id(d.id)] >= done]
    splits = await with_questions(config, loaded, val, train, train_needs=needs_questions(config, True),
                                  train_required=False)
    splits.record.update(kind="inbox", recorded=len(got.rows), cut_short=got.cut_short)
    splits.lines = source_lines([*splits.val, *splits.train], lines)
    return splits


def source_lines(documents: list[Document], lines: dict[str, int]) -> dict[str, int]:
    """Each document's inbox line: a split document's parts (<id>#part<k>, summrl.data.documents) share their
    source's. load_inbox renames a recorded id that already ends in #part<k>, so no other id is taken for a part."""
    return {d.id: lines[source_id(d.id)] for d in documents}


def split_whole(loaded: Loaded, dataset: Any) -> tuple[list[Document], list[Document]]:
    """The seeded val/train split of the documents as read, before the length limit (``loaded.read_ids``): a long
    document's parts on one side (a split of the parts put some of one document in val and the rest in train), and
    another limit, or skip for split, moves no other document between val and train (it reshuffled them, putting
    documents one run trained on in the next one's val). The sizes count documents as read; one skipped for its
    length leaves its side a document short."""
    if loaded.read_ids and not loaded.documents:  # (summrl.data inspect ended in a traceback, prepare "prepared 0")
        raise DataError(f"the documents in {loaded.source} are all over dataset.max_document_tokens="
                        f"{dataset.max_document_tokens} and skipped: raise the limit, or set "
                        "dataset.long_documents=split")
    groups = {source_id(g[0].id): g for g in by_source(loaded.documents)}
    val_ids, train_ids = split(loaded.read_ids or list(groups), dataset, loaded.source)
    val = [d for i in val_ids for d in groups.get(i, [])]
    if val_ids and not val and loaded.documents:
        named = f"{', '.join(val_ids[:5])}{', ...' if len(val_ids) > 5 else ''}"
        copies = dict(loaded.duplicates)  # a document whose text is another's part: kept once, as that part
        if all(i in copies for i in val_ids):  # (it was said to be over the limit, and told to split: it was)
            raise DataError(f"the val documents ({named}) are each the text of another document's part, kept once "
                            f"there ({copies[val_ids[0]]}): remove the copies from {loaded.source}, or another "
                            "dataset.seed")
        also = " (or copies of a part of another)" if any(i in copies for i in val_ids) else ""
        raise DataError(f"the val documents ({named}) are all over dataset.max_document_tokens="
                        f"{dataset.max_document_tokens} and skipped{also}: raise the limit, set "
                        "dataset.long_documents=split, or another dataset.seed")
    return val, [d for i in train_ids for d in groups.get(i, [])]


async def with_questions(config: Any, loaded: Loaded, val: list[Document], train: list[Document], *,
                         train_needs: bool, train_required: bool, progress: bool = False) -> Splits:
    """Questions for the val documents (and the train ones when ``train_needs``) that have none: cached, or written
    and checked after the cost guard. A document none of whose questions pass is left out. ``progress``: a bar."""
    dataset = config.dataset
    need = needing_questions(val, train, train_needs)
    bank = question_bank(config)
    try:
        checked = await fill(bank, need, dataset.questions, progress=progress) if need else {}
    except BaseException as e:  # failed, over budget, or Ctrl-C part-way: what was paid still goes in the run's record
        if bank.writer.client is not None and bank.writer.client.usage.cost_usd:
            e.questions_cost_usd = bank.writer.client.usage.cost_usd  # type: ignore[attr-defined]
        raise

    def questioned(documents: Sequence[Document], required: bool) -> list[Document]:
        out = []
        for document in documents:
            if document.id in checked:
                document = replace(document, questions=checked[document.id].questions(document.id))
            # all unanswerable (a cloze writer finds no name, number or date): any summary, an empty one too, answers
            # every question, so its QA reward was 1.0 whatever the policy wrote
            if any(q.answerable for q in document.questions) or not required:
                out.append(document)
        return out

    val_out = questioned(val, True)
    train_out = questioned(train, train_needs)
    left_out = sorted({d.id for d in [*val, *train]} - {d.id for d in [*val_out, *train_out]})
    if left_out:
        log.info(f"summrl: dataset: {len(left_out)} document(s) left out, none of their questions that a summary must "
                 f"answer passed the check: {', '.join(left_out[:10])}{' ...' if len(left_out) > 10 else ''}")
    if not train and train_required:  # the split gave it documents: each was over the length limit
        raise DataError(f"the train documents are all over dataset.max_document_tokens={dataset.max_document_tokens} "
                        "and skipped: raise the limit, set dataset.long_documents=split, or another dataset.seed")
    if not val_out or (not train_out and train_required):
        # an inbox's val set is its first recorded documents, fixed once online learning began: neither more
        # documents nor another dataset.val_size (refused by the watermark) changes it
        fix = ("another judge or dataset.questions settings may write questions that pass; or move "
               f"{inbox.inbox_dir(config.run.dir)} aside (a new inbox: the documents recorded next are its val set)"
               if dataset.kind == "inbox" else "add documents, or change dataset.val_size")
        raise ConfigError(f"{loaded.source}: after the question check, {len(val_out)} val and {len(train_out)} train "
                          f"documents are left: {fix}")
    usage = bank.writer.client.usage if bank.writer.client is not None else None
    record = {"kind": dataset.kind, **loaded.record(), "val": len(val_out), "train": len(train_out),
              "val_sha256": val_digest(val),
              "questions": {"given": sum(bool(d.questions) for d in loaded.documents),
                            "generated_documents": len(checked), "cache_hits": bank.hits, "written_now": bank.written,
                            **totals(checked), "left_out": left_out,
                            "cost_usd": usage.cost_usd if usage else 0.0, "calls": usage.calls if usage else 0,
                            "per_document": {doc_id: c.counts() for doc_id, c in checked.items()}}}
    q = record["questions"]
    if checked:
        rate = q["closed_book_answer_rate"]
        log.info(f"summrl: questions: {q['written']} written for {len(checked)} documents ({bank.hits} from the "
                 f"cache), {q['kept']} kept; dropped: {', '.join(f'{k} {v}' for k, v in q['dropped'].items())}; "
                 f"closed-book answer rate {'n/a' if rate is None else f'{rate:.1%}'}")
    return Splits(val_out, train_out, record)


def question_bank(config: Any, lookup_only: bool = False) -> QuestionBank:
    """The run's question bank. ``lookup_only``: to read the cache (the cloud launcher), so no key is needed and the
    judge's reply cache is not opened; it writes nothing."""
    q = config.dataset.questions
    judge = None
    if config.judge.kind not in FREE_JUDGES:
        missing = missing_keys(config.judge)
        if missing and not lookup_only:  # a preflight error (exit 3), as training's preflight names the judge's key
            refuse([f"dataset=documents: the judge writes the questions, and its key {missing[0]} is not set: "
                    f"export {missing[0]}=... (or put it in .env), or use judge=lexical offline"], "question writing")
        judge = build_judge(replace(config.judge, cache_dir=None) if lookup_only else config.judge)
    settings = QuestionSettings(q.per_document, q.unanswerable_share, q.check)
    return QuestionBank(question_writer(config.judge, judge), settings, JsonCache(q.cache_dir))


def needing_questions(val: Sequence[Document], train: Sequence[Document], train_needs: bool) -> list[Document]:
    """The documents whose questions are written or read from the cache: the val ones without questions, and the
    train ones too when ``train_needs`` (:func:`needs_questions`)."""
    return [d for d in val if not d.questions] + [d for d in train if not d.questions and train_needs]


def cached_question_files(config: Any, report: bool = True) -> tuple[list[Path], int]:
    """dataset=documents: the files of this machine's question cache that the run would read, and how many of its
    documents have none yet (their questions are still to be written). Reads the documents; calls nothing."""
    loaded = read_documents(config, report=report)
    val, train = split_whole(loaded, config.dataset)
    bank = question_bank(config, lookup_only=True)
    need = needing_questions(val, train, needs_questions(config, True))
    files = [bank.path(d) for d in need if bank.cached(d) is not None]
    return files, len(need) - len(files)


def plan(bank: QuestionBank, documents: Sequence[Document], price_model: Optional[str]) -> tuple[list[Document], Calls]:
    """The documents whose questions are not cached, and the calls writing them would make (priced when paid)."""
    pending = [d for d in documents if bank.cached(d) is None]
    calls = Calls(f"judge {price_model or bank.writer.writer}", price_model)
    if pending and price_model is not None:
        calls.calls, calls.input_tokens, calls.output_tokens = estimated_tokens(pending, bank.settings)
    elif pending:
        calls.calls = len(pending)
    return pending, calls


def describe(calls: Calls, pending: int, cached: int) -> str:
    if not pending:
        return f"summrl: questions: all {cached} documents' questions are cached; nothing to write"
    if calls.local:
        return (f"summrl: questions: {pending} documents to write questions for ({cached} cached), offline "
                f"({calls.who.split(' ', 1)[1]}), $0")
    return f"summrl: questions: {pending} documents to write questions for ({cached} cached): {calls.line()}"


async def fill(bank: QuestionBank, documents: Sequence[Document], settings: Any,
               progress: bool = False) -> dict[str, Checked]:
    """Every document's checked questions: the cached ones, then those written now, after the cost guard."""
    client = bank.writer.client
    price_model = client.model if client is not None else None
    pending, calls = plan(bank, documents, price_model)
    log.info(describe(calls, len(pending), len(documents) - len(pending)))
    budget = settings.max_cost_usd
    if pending and client is not None:
        usd = calls.usd
        if budget is not None and (usd is None or usd > budget):
            raise QuestionsNotConfirmed(
                f"dataset.questions.max_cost_usd={budget:g}: the estimate is "
                f"{calls.price()}, over the budget; nothing "
                "was called. Raise the budget, or write fewer questions (dataset.questions.per_document, fewer "
                "documents)")
        if settings.confirm and not confirmed(sys.stdin):
            raise QuestionsNotConfirmed("dataset.questions: the question writer's cost was not confirmed; nothing was "
                                        "called (dataset.questions.confirm=false skips the question)")
    checked: dict[str, Checked] = {}
    pending_ids = {d.id for d in pending}
    for document in documents:
        if document.id not in pending_ids:
            checked[document.id] = bank.cached(document)  # type: ignore[assignment]
            bank.hits += 1
    over_budget: list[str] = []
    # The budget while writing: a document starts only if what is spent, plus what each one in flight may still
    # spend, plus its own cost, stays within it; a document's cost is the estimate's, or the mean of those written
    # where that is higher. At most the writer's max_concurrency are in flight. (Every document passed the check as
    # they all started at once: an estimate $5 short of the real cost spent it twice over. Each document's own spend
    # (REQUEST_COST) is what is counted: the mean of the total over the documents done counted the calls of those in
    # flight too, and stopped writing well within the budget.)
    # Each call, a retry too, is held to the budget: within its document's reservation it is covered; past it (its
    # replies were retried), calls go one at a time, each made only if what is spent, the others' reservations and
    # the call fit. A call's price is the largest seen, at least the estimate's mean. (Checked only as each document
    # started, 8 documents in flight whose every reply had the wrong shape spent 1.67 times the budget.)
    estimate = (calls.usd or 0.0) / len(pending) if pending else 0.0
    largest = [(calls.usd or 0.0) / calls.calls if calls.calls else 0.0]
    unreserved = asyncio.Lock()
    slots = asyncio.Semaphore(getattr(client, "max_concurrency", None) or 8)
    writing: dict[int, list[float]] = {}  # the documents in flight: what each has spent so far
    done_usd, done = 0.0, 0

    def each() -> float:
        return max(estimate, done_usd / done if done else 0.0)

    def reserved_by_others(index: int) -> float:
        return sum(max(0.0, each() - spent[0]) for i, spent in writing.items() if i != index)

    @contextlib.asynccontextmanager
    async def paid_call(index: int, spent: list[float]) -> AsyncIterator[None]:
        before = spent[0]
        try:
            if each() - spent[0] >= largest[0]:  # within the document's own reservation
                yield
            else:
                async with unreserved:
                    if client.usage.cost_usd + reserved_by_others(index) + largest[0] > budget:
                        raise SpendStopped(f"dataset.questions.max_cost_usd={budget:g}: no room for another call")
                    yield
        finally:  # a reply of the wrong shape was paid for too
            largest[0] = max(largest[0], spent[0] - before)

    async def one(index: int, document: Document) -> None:
        nonlocal done_usd, done
        async with slots:
            guarded = budget is not None and client is not None
            if guarded and client.usage.cost_usd + reserved_by_others(index) + each() > budget:
                over_budget.append(document.id)
                return
            spent = writing[index] = [0.0]
            REQUEST_COST.set(spent)  # this task's own context: the writer's calls add their price to it
            if guarded:
                SPEND_GUARD.set(lambda: paid_call(index, spent))
            try:
                result = await bank.get(document)
            except SpendStopped:
                over_budget.append(document.id)
                return
            finally:
                del writing[index]
                done_usd, done = done_usd + spent[0], done + 1
        if result is not None:
            checked[document.id] = result

    bar = None
    if progress and pending:
        from tqdm import tqdm

        bar = tqdm(total=len(pending), desc="writing questions", unit="doc")
    tasks = [asyncio.ensure_future(one(i, d)) for i, d in enumerate(pending)]
    try:
        for task in asyncio.as_completed(tasks):
            await task
            if bar is not None:
                bar.update(1)
    finally:  # Ctrl-C too: the bar ends its line first, or it was redrawn after the interrupted line, at the exit
        if bar is not None:
            bar.close()
    if over_budget:
        raise QuestionsNotConfirmed(f"dataset.questions.max_cost_usd={budget:g} reached (${client.usage.cost_usd:.4f} "
                                    f"spent): {len(over_budget)} documents still need questions; those written are "
                                    "cached, so a rerun with a higher budget pays only for the rest")
    if bank.failures:
        first = next(iter(bank.failures.items()))
        raise QuestionsFailed(f"questions could not be written for {len(bank.failures)} of {len(pending)} documents "
                              f"(document {first[0]}: {first[1]}); the {bank.written} written are cached: rerun to "
                              "write the rest")
    return checked


def token_lengths(documents: Sequence[Document], count_tokens: Callable[[str], int]) -> dict[str, float]:
    lengths = [count_tokens(d.text) for d in documents]
    return {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)}

