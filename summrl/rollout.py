"""One rollout: the policy summarizes one document. The questions never reach it.

The same code runs on every backend: it only talks to ``model.openai_client()``.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import art

from summrl.data import Document
from summrl.prompt import summary_messages, word_count

def sample_seed(*key: object) -> int:
    """A summary's sampling seed from its key, e.g. (run seed, document id, sample index) for val.

    A stable hash (not Python's salted ``hash``), below 2**31 so that every server's seed type takes it.
    """
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


async def rollout(
    model: art.Model,
    document: Document,
    *,
    max_words: int,
    max_tokens: int,
    temperature: float,
    seed: Optional[int] = None,
) -> art.Trajectory:
    """``seed``: the OpenAI ``seed`` parameter (the embedded server and vLLM honour it); None samples freely."""
    messages = summary_messages(document, max_words)
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=messages,
        max_tokens=max_tokens,
        temperature=temperature,
        logprobs=True,
        **({} if seed is None else {"seed": seed}),
    )
    choice = completion.choices[0]
    summary = choice.message.content or ""
    return art.Trajectory(
        messages_and_choices=[*messages, choice],
        reward=0.0,  # set by the reward, which scores the whole group
        metrics={"word_count": word_count(summary), "chars": len(summary)},
        metadata={"document_id": document.id},
    )


def summary_of(trajectory: art.Trajectory) -> str:
    last = trajectory.messages_and_choices[-1]
    content = last["content"] if isinstance(last, dict) else last.message.content
    return content or ""
