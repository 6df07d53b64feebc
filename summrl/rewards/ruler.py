"""RULER: ART's ``ruler`` ranks a group's summaries against each other with a rubric.

One judge call per group, through the configured LLM judge's model, endpoint and key. GRPO only
needs scores that are consistent within a group. The call runs on the judge client's own retry loop, like
every other judge call: an HTTP error (429 with its Retry-After, 5xx, a timeout) and a reply of the wrong shape
(not JSON, the wrong number of scores: ART raises ValueError; trajectory ids other than 1..n once each) are retried
from one budget of attempts, and counted. Each score goes to the summary its trajectory id names. A group RULER
still cannot score comes back missing: the loop leaves it out and counts it.
"""

from __future__ import annotations

import contextvars
import json
import math
import sys
from typing import Any, Optional, Sequence, Union

from art.metrics import MetricsBuilder

from summrl.data import Document
from summrl.judges.client import JudgeClient, JudgeError, ReplyCutOff, ReplyShapeError, strip_fences
from summrl.rewards.base import Missing, Score
from summrl.prompt import SummaryPrompt, word_count


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


class UsageRecorder:
    """Stands in for ART's MetricsBuilder while RULER calls the judge: ART hands it each response to price
    (``art.rewards.ruler._record_ruler_cost``), and the judge's client accounts for it as for its own calls."""

    def __init__(self, client: JudgeClient) -> None:
        self.client = client

    def add_response_cost(self, source: str, response: Any, **kwargs: Any) -> float:
        return self.client.account(response)


class _UnescapedJson:
    """The json module, with a dumps that keeps non-ASCII characters as they are."""

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)

    @staticmethod
    def dumps(obj: Any, **kwargs: Any) -> str:
        return json.dumps(obj, **{"ensure_ascii": False, **kwargs})


def patched_ruler() -> None:
    """Two fixes to ART 0.5.18's RULER module, made once:
    - it writes the trajectories into its prompt with json.dumps, which escapes every non-ASCII character: a Chinese or
      Greek summary reached the judge as \\uXXXX runs, several times the tokens (paid for) and text a judge reads
      poorly. Its module's json keeps the characters.
    - it parses the reply as bare JSON: a judge that wraps its JSON in a Markdown fence (```json ... ```), as models
      that ignore ``response_format`` do, was refused, retried and paid for each time, then left the group missing.
      Its completions come back unfenced, as every other judge reply is read."""
    import art.rewards  # noqa: F401  (its package's name "ruler" is the function: the module is sys.modules')

    module = sys.modules["art.rewards.ruler"]
    if not isinstance(module.json, _UnescapedJson):
        module.json = _UnescapedJson()  # type: ignore[assignment]
        module.acompletion = _unfenced_completion


# The last RULER reply of this asyncio context, as it came: (its text, its finish_reason), read by RulerReward once
# ART has parsed it (ART's pydantic model reads true and "0" as scores, and says nothing of a reply cut off).
_REPLY: contextvars.ContextVar[Optional[tuple[str, Optional[str]]]] = contextvars.ContextVar("summrl_ruler_reply",
                                                                                             default=None)


async def _unfenced_completion(*args: Any, **kwargs: Any) -> Any:
    import litellm

    response = await litellm.acompletion(*args, **kwargs)  # looked up per call: litellm's own, as ART's import was
    for choice in getattr(response, "choices", None) or []:
        message = getattr(choice, "message", None)
        if message is not None and isinstance(message.content, str):
            message.content = strip_fences(message.content)
            _REPLY.set((message.content, getattr(choice, "finish_reason", None)))
    return response


def routed(model: str, api_base: Any = None) -> str:
    """The judge's model id with its litellm provider in front. ART prices a RULER call only for a "provider/model" id:
    an unprefixed one (gpt-4o-mini) was never counted, $0 and 0 tokens in result.json, though it was paid."""
    if "/" in model:
        return model
    import litellm

    try:
        provider = litellm.get_llm_provider(model=model, api_base=api_base)[1]
    except Exception:  # litellm can't route it: the preflight named it already
        return model
    return f"{provider}/{model}" if provider else model


def not_numbers(reply: Optional[tuple[str, Optional[str]]]) -> None:
    """ReplyShapeError (retried) where a RULER reply's score is not a JSON number: ART's model read true as 1.0 and
    "0" as 0.0, where the QA judge's replies refuse such items (list_of)."""
    if reply is None:
        return
    try:
        scores = json.loads(reply[0], strict=False).get("scores")
        given = [item.get("score") for item in scores]
    except (ValueError, AttributeError, TypeError):
        return  # ART parsed it, so its shape is ART's to judge
    bad = [score for score in given if isinstance(score, bool) or not isinstance(score, (int, float))]
    if bad:
        raise ReplyShapeError(f"RULER scores must be JSON numbers, got {json.dumps(bad[:3])}")


class RulerReward:
    def __init__(self, client: JudgeClient, *, rubric: str, prompt: SummaryPrompt) -> None:
        self.client, self.rubric, self.prompt = client, rubric, prompt

    def _litellm_params(self, n_scores: int) -> dict:
        params = self.client.litellm_params()
        if self.client.structured:
            # A grammar-constrained judge needs the exact count: ART's Response schema sets none, and a small
            # model then emits extra entries. extra_body overrides the request's response_format over HTTP.
            params["extra_body"] = {"response_format": {"type": "json_schema", "json_schema": {
                "name": "Response", "schema": ruler_schema(n_scores)}}}
        return params

    async def score_group(self, document: Document, summaries: Sequence[str]) -> list[Union[Score, Missing]]:
        from art.rewards import ruler

        patched_ruler()
        prompt = self.prompt.messages(document)
        trajectories = [[*prompt, {"role": "assistant", "content": s}] for s in summaries]
        n_scores = 1 if len(set(summaries)) == 1 else len(summaries)  # RULER sends identical trajectories once
        client = self.client
        # the judge's reply cache, as every other judge call has it: a rerun or a resumed step paid for RULER again.
        # "by id": scores kept before they were read by trajectory id may sit on the wrong summaries, so not reused
        asked = [{"role": "system", "content": f"RULER by id: {self.rubric}"}, *prompt,
                 *({"role": "assistant", "content": s} for s in summaries)]
        # keyed by what decides the reply: the endpoint is in the key as the client names it (an embedded judge's port
        # changes every run), and the key, timeout and retries decide nothing
        params = {k: v for k, v in self._litellm_params(n_scores).items()
                  if k not in ("api_key", "api_base", "timeout", "num_retries")}
        rewards = client.cached_reply(asked, params)
        if (isinstance(rewards, list) and len(rewards) == len(summaries)
                and all(isinstance(r, (int, float)) and 0.0 <= r <= 1.0 for r in rewards)):
            return [Score(float(r), {"ruler_score": float(r), "word_count": float(word_count(s))})
                    for r, s in zip(rewards, summaries)]

        async def attempt() -> list[float]:
            async with client.slot():
                # ART prices a RULER call through the active metrics builder, which it looks up as it records:
                # this one adds the call's tokens and $ to the judge's usage (it was counted, never priced)
                token = MetricsBuilder.activate(UsageRecorder(client))  # type: ignore[arg-type]
                _REPLY.set(None)
                try:
                    # ART's ruler(), not ruler_score_group(): the latter pairs scores with trajectories in the reply's
                    # order, so a judge that listed the best first gave its score to the first summary
                    scored = await ruler(trajectories, routed(client.model, client.api_base),
                                         self._litellm_params(n_scores), self.rubric)
                    not_numbers(_REPLY.get())
                    ids = [str(i + 1) for i in range(len(summaries))]
                    if sorted(s.trajectory_id for s in scored) != sorted(ids):
                        raise ReplyShapeError(f"RULER must score trajectories {', '.join(ids)} once each, got ids "
                                              f"{[s.trajectory_id for s in scored][:10]}")
                    by_id = {s.trajectory_id: s.score for s in scored}
                    rewards = [by_id[i] for i in ids]
                    # ART checks the count only (its schema bounds nothing for a hosted judge): a score out of
                    # [0, 1] or NaN was taken as the reward, and a NaN poisoned the group's advantages
                    bad = [r for r in rewards if not isinstance(r, (int, float)) or not math.isfinite(r)
                           or not 0.0 <= r <= 1.0]
                    if bad:
                        raise ReplyShapeError(f"RULER scores must lie in [0, 1], got {bad[:3]}")
                except ValueError:
                    client.usage.calls += 1  # answered, with the wrong shape
                    reply = _REPLY.get()
                    if reply is not None and reply[1] == "length":  # the same cut at temperature 0: not retried
                        raise ReplyCutOff(f"the reply was cut off at max_tokens before its JSON ended ({len(reply[0])} "
                                          "characters)") from None
                    raise
                finally:
                    token.var.reset(token)
            client.usage.calls += 1
            return rewards

        try:
            rewards = await client.retrying(attempt, shape_errors=(ValueError,))
        except JudgeError as e:
            error = client.redact(" ".join(f"RULER could not score the group of document {document.id}: {e}".split()))
            return [Missing(error[:500], e.kind) for _ in summaries]
        client.keep_reply(asked, params, rewards)
        return [Score(r, {"ruler_score": r, "word_count": float(word_count(s))}) for r, s in zip(rewards, summaries)]
