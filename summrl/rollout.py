"""One rollout: the policy summarizes one document. The questions never reach it.

The same code runs on every backend: it only talks to ``model.openai_client()``.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import replace
from typing import Any, Optional, Sequence

import art
from pydantic import BaseModel, Field

from summrl.data import Document
from summrl.errors import ConfigError
from summrl.prompt import SummaryPrompt, word_count


class Burst(BaseModel):
    """Rollouts sent together (a val pass, a step's groups), ``size`` rows in all, as the request field
    ``summrl_burst``. The embedded server waits for all of them before it generates: a row's logits depend, around
    1e-5, on the rows it shares a generate call with, so the calls must not depend on when each request arrived."""

    id: str
    size: int = Field(ge=1)

    @classmethod
    def new(cls, size: int) -> "Burst":
        return cls(id=uuid.uuid4().hex, size=size)

    def request_fields(self) -> dict:
        """The openai client's arguments that send this tag with a request."""
        return {"extra_body": {"summrl_burst": self.model_dump()}}


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
    prompt: SummaryPrompt,
    max_tokens: int,
    temperature: float,
    seed: Optional[int] = None,
    sample: int = 0,
    burst: Optional[Burst] = None,
) -> art.Trajectory:
    """``seed``: the OpenAI ``seed`` parameter (the embedded server and vLLM honour it); None samples freely.
    ``sample``: the summary's index among its document's, kept in the metadata (``in_request_order`` reads it).
    ``burst``: the rollouts this one is sent with, for a server that reads it (``backends.takes_burst_tags``)."""
    messages = prompt.messages(document)
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=messages,
        max_tokens=max_tokens,
        temperature=temperature,
        logprobs=True,
        **({} if seed is None else {"seed": seed}),
        **({} if burst is None else burst.request_fields()),
    )
    choice = completion.choices[0]
    summary = choice.message.content or ""
    return art.Trajectory(
        messages_and_choices=[*messages, choice],
        reward=0.0,  # set by the reward, which scores the whole group
        metrics={"word_count": word_count(summary), "chars": len(summary)},
        metadata={"document_id": document.id, "sample": sample},
    )


def longest_prompt(engine: Any, documents: Sequence[Document], prompt: SummaryPrompt,
                   room: int) -> Optional[tuple[int, Document]]:
    """(tokens, document) of the longest prompt among the documents whose prompt could take more than ``room`` tokens;
    None when none could. A token holds at least one byte of the text (plus a few at the template's joins): only a
    document whose bytes could overflow is tokenized (none of Repliqa's at the defaults; all of its 3,591 would take
    about 4 s here)."""
    instructions = len(engine.encode_chat(prompt.messages(replace(documents[0], text=""))))
    near = [d for d in documents if instructions + len(d.text.encode()) + 16 > room]
    if not near:
        return None
    return max(((len(engine.encode_chat(prompt.messages(d))), d) for d in near), key=lambda pair: pair[0])


def check_context(engine: Any, documents: Sequence[Document], prompt: SummaryPrompt, max_tokens: int) -> None:
    """Refuse a run whose summary requests can't fit the policy's context (``engine.context_length``): the longest
    document's prompt plus ``trainer.max_summary_tokens``. The server refuses such a request, as vLLM does; checked
    here, after the model loads and before anything is generated, rather than at the step that meets that document."""
    context = engine.context_length
    if context is None or not documents:
        return
    found = longest_prompt(engine, documents, prompt, context - max_tokens)
    if found and found[0] + max_tokens > context:
        longest, document = found
        room = context - longest
        raise ConfigError(
            f"trainer.max_summary_tokens={max_tokens}: the policy's context is {context} tokens and the longest "
            f"prompt (document {document.id}) takes {longest}, so a summary can have at most {room} tokens"
            + (f": set trainer.max_summary_tokens={room} or less" if room > 0 else "")
            + ", or shorten the documents (dataset.max_document_tokens for dataset=documents)")


def check_packing(engine: Any, documents: Sequence[Document], prompt: SummaryPrompt, max_tokens: int, rollouts: int,
                  packed_length: Optional[int]) -> None:
    """Refuse a ``backend.packed_sequence_length`` that a group of full-length summaries can't fit: the longest train
    prompt once, then ``rollouts`` summaries of up to ``max_tokens``, each with the prompt's last token (ART's
    tokenization counts it in each completion, whose first logprob it predicts). The step that met such a group
    refused it (its update would be of nothing) after the rollouts and judge calls were paid for; checked here, as
    ``check_context`` is, once the model loads."""
    if packed_length is None or not documents:
        return
    completions = rollouts * (max_tokens + 1) - 1
    found = longest_prompt(engine, documents, prompt, packed_length - completions)
    if found and found[0] + completions > packed_length:
        longest, document = found
        raise ConfigError(
            f"backend.packed_sequence_length={packed_length}: a group can pack into {longest + completions} tokens "
            f"(the longest prompt, document {document.id}, {longest} tokens once, then trainer.rollouts_per_group="
            f"{rollouts} summaries of up to trainer.max_summary_tokens={max_tokens}), and a group that does not fit is "
            f"not trained: set it to {-(-(longest + completions) // 128) * 128} or more, or null (each step's longest "
            "group, rounded up to 128)")


def in_request_order(groups: list[art.TrajectoryGroup]) -> list[art.TrajectoryGroup]:
    """Each group's rollouts in the order they were asked for (``sample``), not the order they finished in.

    ART gathers a group's rollouts with ``asyncio.as_completed``, so their order followed the HTTP replies' timing,
    which differs from run to run. The order is the packed training row's layout and the order the judge sees the
    summaries in: a repeated run with the same seed trained on the same samples in another order, its losses parted
    in the 8th digit at step 1 to 5, and it went on to other summaries (16-step experiment=local runs ended at val
    0.29 to 0.45 from one seed)."""
    for group in groups:
        group.trajectories.sort(key=lambda t: t.metadata.get("sample", 0))
    return groups


def summary_of(trajectory: art.Trajectory) -> str:
    last = trajectory.messages_and_choices[-1]
    content = last["content"] if isinstance(last, dict) else last.message.content
    return content or ""
