"""The offline judge: answer recall of the gold answer's content words, abstention on unanswerable questions."""

from __future__ import annotations

import asyncio

import pytest

from summrl.data import Question
from summrl.judges.lexical import LexicalJudge, content_words


def q(answer: str) -> Question:
    return Question(id="d-q1", question="?", answer=answer, long_answer="")


def test_content_words_drop_stop_words_and_normalize():
    assert content_words("The festival drew 2,100 visitors to the Parks") == {"festival", "drew", "2100", "visitor", "park"}
    assert content_words("$2.1 million") == {"2.1", "million"}


@pytest.mark.parametrize(
    "summary,answer,expected",
    [
        ("Mayor Ruth Okafor opened the bridge on March 14, 2024.", "Ruth Okafor", True),
        ("The bridge reopened in spring.", "Ruth Okafor", False),
        ("It cost 2,100 dollars.", "2100 dollars", True),  # numbers are normalized
        ("OPENED BY RUTH, the mayor.", "Ruth Okafor", False),  # 1 of 2 words < 0.6
        ("The answer is yes, it passed.", "Yes", True),  # no content word: phrase match
        ("It did not pass.", "Yes", False),
        # "may" is a stop word, but May beside a number is a month, as March is: June 2023 was taken for May 2023
        ("The bridge reopened in June 2023.", "May 2023", False),
        ("The bridge reopened in March 2023.", "March 2023", True),
        ("The bridge reopened on 5 May 2023.", "May 5, 2023", True),
        ("It may rain, and the bridge may close.", "It may close", True),  # phrase-free: "close" is the content
    ],
)
def test_answerable_questions(summary, answer, expected):
    judge = LexicalJudge(min_recall=0.6)
    assert asyncio.run(judge.grade(summary, [q(answer)])) == [expected]


def test_unanswerable_questions_are_abstained_and_correct():
    judge = LexicalJudge()
    assert asyncio.run(judge.grade("anything at all", [q("UNANSWERABLE"), q("unanswerable")])) == [True, True]


def test_threshold_controls_partial_recall():
    summary = "The council met in Elderwick."
    answer = "Elderwick town council chambers"  # 2 of 4 content words present
    assert LexicalJudge(min_recall=0.5).answers(summary, q(answer))
    assert not LexicalJudge(min_recall=0.6).answers(summary, q(answer))
    with pytest.raises(ValueError, match="min_recall"):
        LexicalJudge(min_recall=0)


@pytest.mark.parametrize(
    "summary,answer,expected",
    [
        # letters of other scripts were not words: "Zürich" was "z" + "rich", and a Cyrillic or Chinese answer had no
        # word at all, so it was never answered whatever the summary said
        ("The office moved to Zürich in May.", "Zürich", True),
        ("The office moved to Zurich in May.", "Zürich", False),  # another word: accents are kept
        ("Штаб-квартира находится в Москве, столица осталась прежней.", "столица", True),
        ("Штаб-квартира находится в Казани.", "столица", False),
        ("他在北京大学学习。", "北京大学", True),  # no spaces between words: character by character
        ("他在上海工作。", "北京大学", False),
        ("ＩＴＥＭ ２，１００ was sold.", "item 2,100", True),  # full-width forms (NFKC)
        ("He lives on Hauptstrasse.", "Hauptstraße", True),  # case folding: ß = ss
    ],
)
def test_answers_in_any_script(summary, answer, expected):
    assert asyncio.run(LexicalJudge().grade(summary, [q(answer)])) == [expected]
