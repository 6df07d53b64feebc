"""``LLMJudge``: an LLM grades a group of summaries with one call per summary that answers all of the
document's questions from the summary alone, plus one call for the whole group that grades the
answers that don't already match the gold answer. The grading prompt holds no document. For reward=rubric it
writes a document's rubrics (once per process, shared by the train and val rewards) and scores a group against
them, with the prompts and checks of :mod:`summrl.judges.rubrics`. Every call goes through
:class:`summrl.judges.client.JudgeClient`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import unicodedata
from typing import Optional, Sequence, Union

from summrl.data import UNANSWERABLE, Document, Question
from summrl.judges.base import Rubrics
from summrl.judges.client import JudgeClient, JudgeError, list_of, list_schema
from summrl.judges.rubrics import PROMPT_VERSION, score_rubrics, write_rubrics


def listing(questions: Sequence[Question]) -> str:
    return "\n".join(f"{i + 1}. {q.question}" for i, q in enumerate(questions))


# A number (thousands separators and a decimal point kept in it), a run of letters or digits of any script, or one
# symbol. Sentence punctuation is dropped; signs, currency and units (-, +, %, £, €) decide a match and are kept.
_TOKEN = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?|\w+|[^\w\s]")
_PUNCTUATION = frozenset(".,;:!?'\"()[]{}…“”‘’«»。、「」『』【】《》・·")


def normalize(text: str) -> str:
    """An answer reduced to what decides a match with no grading call: NFKC (full-width forms), case-folded,
    "2,100" read as "2100", sentence punctuation dropped. Only an equal non-empty result skips the grader, so a
    stricter key costs a call, never a wrong verdict. An answer with a superscript or subscript ("10⁸", "H₂O") has no
    key (""): NFKC wrote 10⁸ as 108, and a quote mark after a digit (5" for inches) was dropped as punctuation."""
    if any(unicodedata.decomposition(c).startswith(("<super>", "<sub>")) for c in text) or _DIGIT_MARK.search(text):
        return ""
    tokens = _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())
    return " ".join(t.replace(",", "") if t[0].isdigit() else t for t in tokens if t not in _PUNCTUATION)


_DIGIT_MARK = re.compile(r"\d\s*['\"′″’”]")  # a unit written as a mark: 5' (feet), 5" (inches), 40′


ANSWER_PROMPT = """Using only this summary, answer each question briefly. If the summary lacks the answer, write "{unanswerable}".

<summary>
{summary}
</summary>

{questions}

Reply in JSON: {{"answers": [one string per question, in order]}}"""

# Candidates are listed under their question, so a question and its gold answer appear once per group.
GRADE_PROMPT = """For each numbered candidate, say whether it means the same as the gold answer to its question. Gold "{unanswerable}" means the question cannot be answered; a candidate saying so then matches.

{items}

Reply in JSON: {{"correct": [true or false per candidate, in number order]}}"""


class LLMJudge:
    def __init__(self, client: JudgeClient) -> None:
        self.client = client
        # (document hash, max_rubrics) -> rubrics written in this process, and those being written: the train
        # and val rewards (and a step's groups of one document) share one writing call.
        self._rubrics: dict[tuple[str, int], Rubrics] = {}
        self._writing: dict[tuple[str, int], asyncio.Future] = {}

    def usage_metrics(self) -> dict[str, float]:
        return self.client.usage.snapshot_and_reset()

    @property
    def rubric_writer(self) -> str:
        return json.dumps([self.client.model, self.client.cache_endpoint, PROMPT_VERSION])

    async def write_rubrics(self, document: Document, max_rubrics: int) -> Rubrics:
        """The document's rubrics, written once per process; a failed call is asked again by the next caller."""
        key = (hashlib.sha256(document.text.encode()).hexdigest(), max_rubrics)
        if key in self._rubrics:
            return self._rubrics[key]
        task = self._writing.get(key)
        if task is None:
            task = self._writing[key] = asyncio.ensure_future(write_rubrics(self.client, document.text, max_rubrics))
        try:
            rubrics = await asyncio.shield(task)  # one caller's cancellation does not cancel the others' call
        finally:
            if task.done() and self._writing.get(key) is task:
                del self._writing[key]
        self._rubrics[key] = rubrics
        return rubrics

    async def score_rubrics(self, document: Document, rubrics: Rubrics, summaries: Sequence[str]) -> list[list[float]]:
        return await score_rubrics(self.client, rubrics, summaries)

    async def answer(self, summary: str, questions: Sequence[Question]) -> list[str]:
        return await self.ask(ANSWER_PROMPT.format(summary=summary, questions=listing(questions),
                                                   unanswerable=UNANSWERABLE), len(questions))

    async def ask(self, prompt: str, n: int) -> list[str]:
        """One answering call: ``prompt`` lists ``n`` questions and asks for {"answers": [...]}."""
        return await self.client.complete_json(
            [{"role": "user", "content": prompt}],
            schema=list_schema("answers", {"type": "string", "maxLength": 80}, n),
            check=lambda reply: [str(a) for a in list_of(reply, "answers", n, (str, int, float))],
        )

    async def grade_group(self, texts: Sequence[str], questions: Sequence[Question]) -> list[Union[list[bool], JudgeError]]:
        """Grade several texts (a group's summaries) on the same questions: one answering call per distinct text,
        in parallel, then a single grading call for every answer that doesn't already match its gold answer."""
        # each distinct text once: identical summaries in a group (a collapsed policy, empty ones) were each paid for,
        # their calls in flight at once, before either reply reached the cache
        unique = list(dict.fromkeys(texts))
        replies = await asyncio.gather(*(self.answer(t, questions) for t in unique), return_exceptions=True)
        by_text = dict(zip(unique, replies))
        return await self.grade_answers([by_text[t] for t in texts], questions)

    async def grade_answers(self, answered: Sequence[Union[list[str], BaseException]],
                            questions: Sequence[Question]) -> list[Union[list[bool], JudgeError]]:
        """Each text's answers against the gold answers: an exact or normalized match needs no call, the rest are
        graded in one call. A text whose answering failed (a JudgeError) keeps its error."""
        verdicts: list[Union[list[Optional[bool]], JudgeError]] = []
        pending: list[tuple[int, int]] = []  # (text, question) pairs the grading call decides
        for t, answers in enumerate(answered):
            if isinstance(answers, BaseException):
                if not isinstance(answers, JudgeError):
                    raise answers
                verdicts.append(answers)
                continue
            row: list[Optional[bool]] = []
            for q, (question, answer) in enumerate(zip(questions, answers)):
                gold = normalize(question.answer)  # a gold of punctuation alone is graded, never matched by key
                same = bool(gold) and normalize(answer) == gold  # exact and normalized matches need no call
                row.append(True if same else None)
                if not same:
                    pending.append((t, q))
            verdicts.append(row)
        if pending:
            pending.sort(key=lambda tq: tq[1])  # by question, to list each question's candidates together
            blocks, number = [], 0
            for q, question in enumerate(questions):
                texts_q = [t for t, qq in pending if qq == q]
                if not texts_q:
                    continue
                lines = [f"Question: {question.question}\nGold: {question.answer}"]
                for t in texts_q:
                    number += 1
                    lines.append(f"Candidate {number}: {answered[t][q]}")  # type: ignore[index]
                blocks.append("\n".join(lines))
            items = "\n\n".join(blocks)
            try:
                correct = await self.client.complete_json(
                    [{"role": "user", "content": GRADE_PROMPT.format(items=items, unanswerable=UNANSWERABLE)}],
                    schema=list_schema("correct", {"type": "boolean"}, len(pending)),
                    check=lambda reply: list_of(reply, "correct", len(pending), bool),
                )
            except JudgeError as e:  # only the texts that had answers to grade lose their verdicts
                failed = {t for t, _ in pending}
                return [e if t in failed else v if isinstance(v, JudgeError) else [bool(x) for x in v]
                        for t, v in enumerate(verdicts)]
            for (t, q), value in zip(pending, correct):
                verdicts[t][q] = value  # type: ignore[index]
        return [v if isinstance(v, JudgeError) else [bool(x) for x in v] for v in verdicts]

    async def grade(self, summary: str, questions: Sequence[Question]) -> list[bool]:
        (result,) = await self.grade_group([summary], questions)
        if isinstance(result, JudgeError):
            raise result
        return result
