"""An offline, deterministic judge for the QA reward.

What it measures: *answer recall*. An answerable question counts as answered when at least
``min_recall`` of its gold answer's content words (stop words removed, case and punctuation
ignored, numbers normalized, plural "s" stripped) occur in the summary. Words of every script count (accents
kept: "José" is not "Jose"); in Chinese, Japanese and Thai, which put no spaces between words, each character is
one. A gold answer with no
content word ("Yes") must occur as a phrase. The judge never invents an answer: for an
unanswerable question it abstains ("UNANSWERABLE"), which is Repliqa's gold answer, so those
questions always count as correct and carry no signal; `reward.include_unanswerable=false`
leaves them out of the score.

It cannot tell a summary that states a fact from one that merely contains its words. That is
enough for a CPU smoke-scale reward: a summary that keeps the facts a reader asks about scores
higher than one that drops them.

It also writes and scores rubrics offline (reward=rubric with judge=lexical or judge=local): positives are the
document's most repeated numbers, dates and names (``"Mentions 2021."``, met by the share of the fact's words the
summary has), the one negative is :data:`INVENTS_FACTS` (met when the summary states a number, date or name absent
from the document, :mod:`summrl.facts`). It reads only rubrics of those two forms (:func:`readable_rubric`).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Sequence

from summrl.data import Document, Question
from summrl.facts import facts, invented_facts, numbers
from summrl.judges.base import Rubrics

STOP_WORDS = frozenset(
    """a an the and or but nor of to in on at by for with from into onto over under about as is are was were be
    been being am do does did has have had it its this that these those there their they them he she him her his
    hers we us our you your i me my mine which who whom whose what when where why how than then so such not no
    yes can could would should will shall may might must also just only very more most some any each all both
    per via up out off after before during while until since""".split()
)
# Letters and digits of any script. A character of a script written without spaces between words (Chinese, Japanese,
# Thai) is a word of its own, so that an answer in one is matched character by character: as one run, an answer
# would have to be the whole sentence it sits in.
UNSPACED = "\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN = re.compile(rf"[{UNSPACED}]|(?:(?![{UNSPACED}])[^\W_])+(?:[.,]\d+)*")


def tokens(text: str) -> list[str]:
    """``text``'s words, NFKC-normalized (full-width forms, ligatures) and case-folded ("Straße" = "strasse")."""
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())


def content_words(text: str) -> set[str]:
    words = set()
    found = tokens(text)
    for i, token in enumerate(found):
        token = token.replace(",", "")  # 2,100 -> 2100
        if token in STOP_WORDS and not (token == "may" and _beside_number(found, i)):  # "May 5, 2023": a month
            continue
        if len(token) > 3 and token.endswith("s") and not token.endswith("ss") and not token[0].isdigit():
            token = token[:-1]  # libraries ~ library is out of reach; parks ~ park is enough here
        words.add(token)
    return words


def _beside_number(found: list[str], i: int) -> bool:
    return any(found[j][:1].isdigit() for j in (i - 1, i + 1) if 0 <= j < len(found))


def _phrase(text: str) -> str:
    return " ".join(tokens(text))


# Negative rubrics name the error (scored 1 when the summary makes it) and are flipped: this one is the issue's
# "states no number, date or proper name absent from the document", stated as the error to avoid.
INVENTS_FACTS = "States a number, date or proper name that is absent from the document."
_MENTIONS = re.compile(r"^Mentions (.+)\.$")


def _mentioned(rubric: str) -> set[str]:
    """The words a "Mentions X." rubric asks for (empty: not such a rubric, or nothing to check)."""
    match = _MENTIONS.match(rubric)
    return numbers(match.group(1)) | content_words(match.group(1)) if match else set()


def readable_rubric(rubric: str) -> bool:
    """Whether the lexical scorer can score ``rubric``: its own negative, or "Mentions X." with X checkable."""
    return rubric == INVENTS_FACTS or bool(_mentioned(rubric))


class LexicalJudge:
    rubric_writer = None  # its rubrics are instant and deterministic: nothing to cache

    def __init__(self, min_recall: float = 0.6) -> None:
        if not 0.0 < min_recall <= 1.0:
            raise ValueError(f"judge.min_recall must be in (0, 1], got {min_recall}")
        self.min_recall = min_recall

    def recall(self, summary: str, answer: str) -> float:
        wanted = content_words(answer)
        if not wanted:
            phrase = _phrase(answer)
            return 1.0 if phrase and f" {phrase} " in f" {_phrase(summary)} " else 0.0
        return len(wanted & content_words(summary)) / len(wanted)

    def answers(self, summary: str, question: Question) -> bool:
        if not question.answerable:
            return True  # abstains, and abstaining is the gold answer
        return self.recall(summary, question.answer) >= self.min_recall

    async def grade(self, summary: str, questions: Sequence[Question]) -> list[bool]:
        return [self.answers(summary, q) for q in questions]

    async def grade_group(self, texts: Sequence[str], questions: Sequence[Question]) -> list[list[bool]]:
        return [[self.answers(t, q) for q in questions] for t in texts]

    def usage_metrics(self) -> dict[str, float]:
        return {}

    async def write_rubrics(self, document: Document, max_rubrics: int) -> Rubrics:
        # The document's most repeated facts first; a lone digit ("2 of them") is too common to be a rubric, and a
        # capitalized stop word ("at The Anchor") leaves nothing to check.
        found = [f for f in facts(document.text)
                 if not (f.isdigit() and len(f) == 1) and readable_rubric(f"Mentions {f}.")]
        ranked = sorted(found, key=lambda f: -len(re.findall(rf"(?<!\w){re.escape(f)}(?!\w)", document.text)))
        return Rubrics(tuple(f"Mentions {f}." for f in ranked[:max_rubrics]), (INVENTS_FACTS,))

    async def score_rubrics(self, document: Document, rubrics: Rubrics, summaries: Sequence[str]) -> list[list[float]]:
        unreadable = [r for r in rubrics.listed if not readable_rubric(r)]
        if unreadable:  # a bug in the caller: train and the benchmark refuse such data before loading (check_dataset_rubrics)
            raise ValueError(f"the lexical judge can't score the rubric {unreadable[0]!r} (document {document.id}), "
                              "so every summary would score the same on it: dataset rubrics need an LLM judge "
                              "(judge=embedded offline, judge=openai_compatible or judge=gemini_flash)")

        def holds(rubric: str, summary: str) -> float:
            if rubric == INVENTS_FACTS:
                return float(bool(invented_facts(summary, document.text)))
            wanted = _mentioned(rubric)
            return len(wanted & (numbers(summary) | content_words(summary))) / len(wanted)

        return [[holds(r, s) for r in rubrics.listed] for s in summaries]
