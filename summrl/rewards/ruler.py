"""RULER: ART's ``ruler_score_group`` ranks a group's summaries against each other with a rubric.

One judge call per group, through the configured LLM judge's model, endpoint and key. GRPO only
needs scores that are consistent within a group. A reply with the wrong shape is asked again; a group
RULER still cannot score comes back missing: the loop leaves it out and counts it.
"""

from __future__ import annotations

import asyncio
from typing import Sequence, Union

import art

from summrl.data import Document
from summrl.judges.llm import JudgeClient
from summrl.rewards import Missing, Score
from summrl.rollout import SYSTEM_PROMPT, summary_prompt


def ruler_schema(n: int) -> dict:
    """ART's RULER reply schema with exactly ``n`` scores, ids 1..n, in order."""
    item = {"type": "object", "additionalProperties": False, "required": ["trajectory_id", "explanation", "score"],
            "properties": {"trajectory_id": {"type": "string"}, "explanation": {"type": "string", "maxLength": 200},
                           "score": {"type": "number", "minimum": 0, "maximum": 1}}}
    return {"type": "object", "additionalProperties": False, "required": ["scores"],
            "properties": {"scores": {"type": "array", "minItems": n, "maxItems": n,
                                      "prefixItems": [{**item, "properties": {**item["properties"],
                                                       "trajectory_id": {"const": str(i + 1)}}} for i in range(n)],
                                      "items": item}}}


class RulerReward:
    def __init__(self, client: JudgeClient, *, rubric: str, max_words: int) -> None:
        self.client, self.rubric, self.max_words = client, rubric, max_words

    def _litellm_params(self, n_scores: int) -> dict:
        params = self.client.litellm_params()
        if self.client.structured:
            # A grammar-constrained judge needs the exact count: ART's Response schema sets none, and a small
            # model then emits extra entries. extra_body overrides the request's response_format over HTTP.
            params["extra_body"] = {"response_format": {"type": "json_schema", "json_schema": {
                "name": "Response", "schema": ruler_schema(n_scores)}}}
        return params

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        from art.rewards import ruler_score_group

        prompt = [{"role": "system", "content": SYSTEM_PROMPT},
                  {"role": "user", "content": summary_prompt(document, self.max_words)}]
        group = art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[*prompt, {"role": "assistant", "content": s}], reward=0.0)
            for s in summaries
        )
        n_scores = 1 if len(set(summaries)) == 1 else len(summaries)  # RULER sends identical trajectories once
        client, scored, last = self.client, None, None
        # litellm retries HTTP errors itself (num_retries); a reply of the wrong shape (not JSON, the wrong
        # number of scores: ART raises ValueError) is asked again here, and counted, like the QA judge's.
        for attempt in range(client.max_retries + 1):
            client.usage.calls += 1
            try:
                async with client.slot():
                    scored = await ruler_score_group(group, client.model, self._litellm_params(n_scores), self.rubric)
                break
            except ValueError as e:
                last = e
            except Exception as e:  # litellm's error after its own retries
                last = e
                break
            if attempt < client.max_retries:
                client.usage.retries += 1
                await asyncio.sleep(client.backoff_s(attempt))
        if scored is None:
            client.usage.failures += 1
            error = client.redact(" ".join(f"RULER could not score the group of document {document.id} with judge "
                                            f"{client.model}: {type(last).__name__}: {last}".split()))[:500]
            return [Missing(error, type(last).__name__) for _ in summaries]
        return [
            Score(t.reward, {"ruler_score": t.reward, "word_count": float(len(s.split()))})
            for t, s in zip(scored.trajectories, summaries)
        ]
