"""Questions for documents that have none (dataset=documents): written by the judge, checked, cached.

**Writing.** An LLM judge writes ``per_document`` questions in one call, with short reference answers copied from the
document and a share of questions the document does not answer (answer ``UNANSWERABLE``, as in Repliqa). The
offline writer (judge=lexical, local and embedded: no key, no network, deterministic) writes SummaQA's cloze
questions: a sentence of the document with one of its facts (a name, number or date, :mod:`summrl.facts`) masked,
the fact being the answer; its unanswerable questions ask for a contact detail the document does not give.

**Checking** (the round-trip filter of synthetic QA corpora, Alberti et al. 2019, plus a closed-book test): a written
question is kept only when the judge answers it correctly *with* the document (open book) and, for an answerable
one, *not* without it (closed book: a question general knowledge answers rewards nothing about the summary). An
unanswerable question is kept when the judge, with the document, also finds no answer. The reasons a question is
dropped: ``not_in_document``, ``closed_book``, ``answered_by_document``. The offline checker is lexical: open book,
the answer's words are in the document; closed book, they are in the question itself.

**Cache.** Each document's written questions, with their check, are kept on disk (:class:`JsonCache`), keyed by the
document's hash, the writer (model, endpoint, prompt version) and the settings: reruns and a sweep's jobs pay once.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence

from summrl.config import FREE_JUDGES
from summrl.data import UNANSWERABLE, Document, Question
from summrl.facts import MONTHS, WEEKDAYS, facts
from summrl.judges.cache import JsonCache
from summrl.judges.client import JudgeClient, JudgeError, ReplyShapeError, SpendStopped, list_schema
from summrl.judges.lexical import LexicalJudge, content_words
from summrl.judges.llm import LLMJudge, listing

PROMPT_VERSION = "questions-v1"  # bump when a prompt below changes: cached questions are then written again
OFFLINE_WRITER = "offline-cloze-v1"
DROP_REASONS = ("not_in_document", "closed_book", "answered_by_document")

WRITE_PROMPT = """Write questions that test whether a summary of this document kept the document's key facts.
- {answerable} questions the document answers, each with a short reference answer copied from the document (a name, number, date or short phrase).
- {unanswerable} questions on the document's topic that the document does NOT answer; their answer is "{unanswerable_word}".
Each question must be clear to a reader who does not have the document, and must not be answerable from general knowledge.

<document>
{document}
</document>

Reply in JSON: {{"questions": [{n} objects {{"question": string, "answer": string}}]}}"""

OPEN_BOOK_PROMPT = """Using only this document, answer each question briefly. If the document does not answer it, write "{unanswerable}".

<document>
{document}
</document>

{questions}

Reply in JSON: {{"answers": [one string per question, in order]}}"""

CLOSED_BOOK_PROMPT = """No document is given. Answer each question briefly from your general knowledge. If you cannot know the answer, write "{unanswerable}".

{questions}

Reply in JSON: {{"answers": [one string per question, in order]}}"""


@dataclass(frozen=True)
class QuestionSettings:
    per_document: int = 5
    unanswerable_share: float = 0.2
    check: bool = True

    @property
    def counts(self) -> tuple[int, int]:
        """(answerable, unanswerable) questions to write per document."""
        unanswerable = round(self.per_document * self.unanswerable_share)
        return self.per_document - unanswerable, unanswerable


@dataclass
class Checked:
    """A document's written questions, each with its check: ``dropped`` is None (kept) or a DROP_REASONS entry;
    ``closed_book`` says whether the judge answered it correctly without the document (None: not asked)."""

    rows: list[dict]

    def questions(self, document_id: str) -> tuple[Question, ...]:
        return tuple(Question(id=f"{document_id}-g{i + 1}", question=r["question"], answer=r["answer"], long_answer="")
                     for i, r in enumerate(self.rows) if r["dropped"] is None)

    def counts(self) -> dict[str, Any]:
        dropped = Counter(r["dropped"] for r in self.rows if r["dropped"])
        return {"written": len(self.rows), "kept": len(self.rows) - sum(dropped.values()),
                "dropped": {reason: dropped.get(reason, 0) for reason in DROP_REASONS}}


class QuestionWriter(Protocol):
    writer: str  # the cache's writer key: model, endpoint and prompt version
    client: Optional[JudgeClient]  # the paid client (its usage counts the calls); None for the offline writer

    async def write(self, document: Document, answerable: int, unanswerable: int) -> list[tuple[str, str]]:
        """(question, answer) pairs; JudgeError when the judge fails after its retries."""
        ...

    async def check(self, document: Document, questions: Sequence[Question]) -> tuple[list[bool], list[bool]]:
        """Per question: answered correctly with the document (open book), and without it (closed book)."""
        ...


def _check_written(reply: Any, n: int) -> list[tuple[str, str]]:
    items = reply.get("questions") if isinstance(reply, dict) else None
    if not isinstance(items, list) or len(items) != n or not all(
            isinstance(i, dict) and all(isinstance(i.get(k), str) and i[k].strip() for k in ("question", "answer"))
            for i in items):
        raise ReplyShapeError(f"expected {{\"questions\": [{n} objects with question and answer]}}, "
                              f"got {json.dumps(reply)[:200]}")
    return [(i["question"].strip(), i["answer"].strip()) for i in items]


class LLMQuestionWriter:
    """The judge's model writes and checks (judge=gemini_flash, openai_compatible, ...)."""

    def __init__(self, judge: LLMJudge) -> None:
        self.judge, self.client = judge, judge.client
        self.writer = json.dumps([judge.client.model, judge.client.cache_endpoint, PROMPT_VERSION])

    async def write(self, document: Document, answerable: int, unanswerable: int) -> list[tuple[str, str]]:
        n = answerable + unanswerable
        prompt = WRITE_PROMPT.format(answerable=answerable, unanswerable=unanswerable, n=n, document=document.text,
                                     unanswerable_word=UNANSWERABLE)
        item = {"type": "object", "required": ["question", "answer"], "additionalProperties": False,
                "properties": {"question": {"type": "string"}, "answer": {"type": "string", "maxLength": 120}}}
        return await self.client.complete_json([{"role": "user", "content": prompt}],
                                               schema=list_schema("questions", item, n), max_tokens=200 * n,
                                               check=lambda reply: _check_written(reply, n))

    async def check(self, document: Document, questions: Sequence[Question]) -> tuple[list[bool], list[bool]]:
        n, listed = len(questions), listing(questions)
        answered = await asyncio.gather(
            self.judge.ask(OPEN_BOOK_PROMPT.format(document=document.text, questions=listed,
                                                   unanswerable=UNANSWERABLE), n),
            self.judge.ask(CLOSED_BOOK_PROMPT.format(questions=listed, unanswerable=UNANSWERABLE), n),
            return_exceptions=True)
        open_book, closed_book = await self.judge.grade_answers(list(answered), questions)
        for verdict in (open_book, closed_book):
            if isinstance(verdict, JudgeError):
                raise verdict
        return list(open_book), list(closed_book)  # type: ignore[arg-type]


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_LINE_MARKUP = re.compile(r"^\s*(?:#+|[-*•>]+|\d{1,3}[.)])\s*")
UNANSWERABLE_ASKS = ("the telephone number", "the email address", "the postal code", "the fax number")


class OfflineQuestionWriter:
    """Deterministic cloze questions (SummaQA): a sentence with one of its facts masked; lexical checks."""

    client = None
    writer = OFFLINE_WRITER

    def __init__(self, min_recall: float = 0.6) -> None:
        self.lexical = LexicalJudge(min_recall=min_recall)
        # the cache key: its checks' verdicts depend on min_recall (another one reused stale ones); the default
        # keeps the key caches were written under
        self.writer = OFFLINE_WRITER if min_recall == 0.6 else f"{OFFLINE_WRITER}-min-recall-{min_recall:g}"

    @staticmethod
    def sentences(text: str) -> list[str]:
        out = []
        for line in text.splitlines():
            if line.lstrip().startswith("#"):  # a heading: a title, not a statement
                continue
            line = _LINE_MARKUP.sub("", line).strip()
            out += [s.strip() for s in _SENTENCE_END.split(line) if 6 <= len(s.split()) <= 60]
        return out

    async def write(self, document: Document, answerable: int, unanswerable: int) -> list[tuple[str, str]]:
        candidates, used = [], set()
        for sentence in self.sentences(document.text):
            for fact in facts(sentence):
                pattern = rf"(?<![\w.,:]){re.escape(fact)}(?![\w]|[.,:]\d)"  # not a part of 2.4, 1,450 or 09:12
                if fact.lower() in used or (fact.isdigit() and len(fact) == 1) or len(re.findall(pattern, sentence)) != 1:
                    continue
                cloze = re.sub(pattern, "____", sentence, count=1)
                candidates.append((f'Fill in the blank: "{cloze}"', fact))
                used.add(fact.lower())
                break  # one question per sentence: they spread over the document
        if len(candidates) > answerable:  # evenly spaced over the document, first and last included
            step = (len(candidates) - 1) / max(1, answerable - 1)
            candidates = [candidates[round(i * step)] for i in range(answerable)]
        names = [f for f in facts(document.text) if not any(c.isdigit() for c in f) and f[0].isupper()
                 and f.lower() not in MONTHS + WEEKDAYS] or ["the author"]
        asks = [(f"What is {UNANSWERABLE_ASKS[i % len(UNANSWERABLE_ASKS)]} of {names[i % len(names)]}?", UNANSWERABLE)
                for i in range(unanswerable)]
        return candidates + asks

    async def check(self, document: Document, questions: Sequence[Question]) -> tuple[list[bool], list[bool]]:
        open_book = [self.lexical.answers(document.text, q) for q in questions]
        # closed book: the answer's words are in the question itself (nothing left for the summary to supply)
        closed_book = [q.answerable and bool(content_words(q.answer))
                       and self.lexical.recall(q.question, q.answer) >= self.lexical.min_recall for q in questions]
        return open_book, closed_book


def question_writer(judge_config: Any, judge: Optional[LLMJudge] = None) -> QuestionWriter:
    """The writer for the configured judge: offline for judge=lexical, local and embedded (the embedded model is not
    loaded when questions are prepared, before training), the judge's own model otherwise."""
    if judge_config.kind in FREE_JUDGES:
        return OfflineQuestionWriter(min_recall=getattr(judge_config, "min_recall", 0.6))
    if judge is None:
        raise ValueError(f"judge={judge_config.kind} writes questions with its LLM: pass the built judge")
    return LLMQuestionWriter(judge)


async def write_checked(writer: QuestionWriter, document: Document, settings: QuestionSettings) -> Checked:
    """Write a document's questions and check each one (one writing call, then the open- and closed-book answers)."""
    answerable, unanswerable = settings.counts
    pairs = await writer.write(document, answerable, unanswerable)
    questions = [Question(id=str(i), question=q, answer=UNANSWERABLE if a.upper() == UNANSWERABLE else a,
                          long_answer="") for i, (q, a) in enumerate(pairs)]
    if settings.check:
        open_book, closed_book = await writer.check(document, questions)
    else:
        open_book, closed_book = [True] * len(questions), [False] * len(questions)
    rows = []
    for question, with_document, without in zip(questions, open_book, closed_book):
        if question.answerable:
            dropped = "not_in_document" if not with_document else "closed_book" if without else None
        else:
            dropped = None if with_document else "answered_by_document"
        rows.append({"question": question.question, "answer": question.answer, "dropped": dropped,
                     "closed_book": bool(without) if question.answerable and settings.check else None})
    return Checked(rows)


@dataclass
class QuestionBank:
    """Questions for many documents: read from the cache, or written, checked and cached."""

    writer: QuestionWriter
    settings: QuestionSettings
    cache: JsonCache
    hits: int = 0
    written: int = 0
    failures: dict[str, str] = field(default_factory=dict)  # document id -> why its questions could not be written

    def path(self, document: Document, new: bool = False):
        return self.cache.document_path(document.text, self.writer.writer, self.settings.per_document,
                                        self.settings.unanswerable_share, self.settings.check, new=new)

    def cached(self, document: Document) -> Optional[Checked]:
        saved = self.cache.read(self.path(document))
        rows = saved.get("questions") if saved else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) and {"question", "answer", "dropped"} <= set(r)
                                                 for r in rows):
            return None
        return Checked(rows)

    async def get(self, document: Document) -> Optional[Checked]:
        """The document's checked questions; None (and ``failures`` names why) when the judge failed."""
        checked = self.cached(document)
        if checked is not None:
            self.hits += 1
            return checked
        try:
            checked = await write_checked(self.writer, document, self.settings)
        except SpendStopped:  # not a failure: the caller's budget stopped it (its caller says so)
            raise
        except JudgeError as e:
            self.failures[document.id] = str(e)
            return None
        self.written += 1
        self.cache.write(self.path(document, new=True), {"questions": checked.rows, "document_id": document.id,
                                                         "writer": self.writer.writer, **checked.counts()})
        return checked


def totals(checked: dict[str, Checked]) -> dict[str, Any]:
    """Written, kept, dropped by reason, and the closed-book answer rate (answerable questions the judge answered
    correctly with no document, over those it was asked)."""
    written = kept = 0
    dropped: Counter[str] = Counter()
    asked = answered = 0
    for item in checked.values():
        counts = item.counts()
        written, kept = written + counts["written"], kept + counts["kept"]
        dropped.update(counts["dropped"])
        closed = [r["closed_book"] for r in item.rows if r.get("closed_book") is not None]
        asked, answered = asked + len(closed), answered + sum(closed)
    return {"written": written, "kept": kept, "dropped": {reason: dropped.get(reason, 0) for reason in DROP_REASONS},
            "closed_book_answer_rate": answered / asked if asked else None}


def estimated_tokens(documents: Sequence[Document], settings: QuestionSettings) -> tuple[int, int, int]:
    """(calls, input tokens, output tokens) to write and check questions for ``documents``: one writing call, one
    open-book and one closed-book answering call, and at most two grading calls each. Output is an upper bound."""
    import litellm

    n = settings.per_document
    calls = input_tokens = output_tokens = 0
    for document in documents:
        text = litellm.token_counter(model="gpt-4o", text=document.text)
        calls += 1 + (4 if settings.check else 0)
        input_tokens += text + 150
        output_tokens += 60 * n
        if settings.check:
            input_tokens += (text + 60 + 25 * n) + (60 + 25 * n) + 2 * (80 + 40 * n)
            output_tokens += 2 * 20 * n + 2 * 5 * n
    return calls, input_tokens, output_tokens
