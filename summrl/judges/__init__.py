"""Judges answer a document's questions from a summary alone and say which answers are correct."""

from __future__ import annotations

from typing import Protocol, Sequence

from summrl.data import Question


class Judge(Protocol):
    async def grade(self, summary: str, questions: Sequence[Question]) -> list[bool]:
        """One verdict per question: was it answered correctly from the summary alone?"""
        ...


def build_judge(config) -> Judge:
    if config.kind == "lexical":
        from summrl.judges.lexical import LexicalJudge

        return LexicalJudge(min_recall=config.min_recall)
    raise ValueError(f"judge.kind={config.kind} is not available yet")
