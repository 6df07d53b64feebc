"""Rubric calls of an LLM judge: write a document's positive and negative rubrics (one call), and score a group of
summaries against every rubric (one call). The prompts, the reply schemas and the shape checks live here; a reply
of the wrong shape is retried and counted by :meth:`JudgeClient.complete_json`, and a call that still fails raises
JudgeError (with its kind). The offline writer and scorer are :class:`summrl.judges.lexical.LexicalJudge`'s.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from summrl.judges.base import Rubrics
from summrl.judges.client import JudgeClient, ReplyShapeError, list_of, list_schema

PROMPT_VERSION = "rubric-v1"  # bump when a prompt changes: cached rubrics are then rewritten

WRITE_PROMPT = """Write grading rubrics for summaries of this document.
Positive rubrics: up to {n} specific facts a good summary keeps (one short sentence each).
Negative rubrics: up to {n} specific errors a summary must avoid, e.g. a number, date or name that is not in the document, or a claim the document contradicts.

<document>
{document}
</document>

Reply in JSON: {{"positive_rubrics": [strings], "negative_rubrics": [strings]}}"""

SCORE_PROMPT = """Score each summary against each rubric: 1 when the rubric's statement is true of the summary, 0 when it is false, in between when partly true.

Rubrics:
{rubrics}

{summaries}

Reply in JSON: {{"rubric_scores": [one list of {m} numbers in [0, 1] per summary, rubrics in order, summaries in order]}}"""


def write_schema(max_rubrics: int) -> dict:
    text_list = {"type": "array", "items": {"type": "string", "maxLength": 160}, "minItems": 1,
                 "maxItems": max_rubrics}
    return {"type": "object", "required": ["positive_rubrics", "negative_rubrics"], "additionalProperties": False,
            "properties": {"positive_rubrics": text_list, "negative_rubrics": text_list}}


def check_written(reply: Any, max_rubrics: int) -> Rubrics:
    """Both lists present, strings only, the positives non-empty; a judge that writes more than asked is cut to
    ``max_rubrics``. No negative rubric is an answer the prompt allows ("up to n"): refused, it was asked for again
    and again, paid each time, and the document had no reward for the whole run."""
    lists = []
    for key in ("positive_rubrics", "negative_rubrics"):
        items = reply.get(key) if isinstance(reply, dict) else None
        if (not isinstance(items, list) or (key == "positive_rubrics" and not items)
                or not all(isinstance(i, str) and i.strip() for i in items)):
            kind = "a non-empty list" if key == "positive_rubrics" else "a list"
            raise ReplyShapeError(f"expected {key} as {kind} of strings, got {json.dumps(reply)[:200]}")
        lists.append(tuple(i.strip() for i in items[:max_rubrics]))
    return Rubrics(*lists)


def check_scores(reply: Any, n_summaries: int, n_rubrics: int) -> list[list[float]]:
    """One row per summary, one score in [0, 1] per rubric."""
    rows = list_of(reply, "rubric_scores", n_summaries, list)
    for row in rows:
        if len(row) != n_rubrics or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1
                                            for x in row):
            raise ReplyShapeError(f"expected {n_summaries} lists of {n_rubrics} scores in [0, 1], "
                                  f"got {json.dumps(reply)[:200]}")
    return [[float(x) for x in row] for row in rows]


async def write_rubrics(client: JudgeClient, document: str, max_rubrics: int) -> Rubrics:
    prompt = WRITE_PROMPT.format(n=max_rubrics, document=document)
    return await client.complete_json([{"role": "user", "content": prompt}], schema=write_schema(max_rubrics),
                                      check=lambda reply: check_written(reply, max_rubrics))


async def score_rubrics(client: JudgeClient, rubrics: Rubrics, summaries: Sequence[str]) -> list[list[float]]:
    listed = rubrics.listed
    m, n = len(listed), len(summaries)
    rubric_lines = "\n".join(f"R{i + 1}. {r}" for i, r in enumerate(listed))
    summary_blocks = "\n\n".join(f"<summary id=\"{i + 1}\">\n{s}\n</summary>" for i, s in enumerate(summaries))
    row_schema = {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "minItems": m,
                  "maxItems": m}
    prompt = SCORE_PROMPT.format(rubrics=rubric_lines, summaries=summary_blocks, m=m)
    # room for n x m scores (about 5 tokens each, pretty-printed): 16 summaries x 16 rubrics took 1286 tokens, and at
    # the default 1024 every reply was cut off, every group missing, each retry paid (the default below 200 scores)
    return await client.complete_json([{"role": "user", "content": prompt}],
                                      schema=list_schema("rubric_scores", row_schema, n),
                                      max_tokens=max(1024, 8 * n * m + 64),
                                      check=lambda reply: check_scores(reply, n, m))
