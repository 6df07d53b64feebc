"""The prompt a summarizer sees (the policy's rollouts, SFT samples, teachers and benchmarked models all get it), and
how its word limit is counted. Light on purpose: the cost guard and the data tools read it without loading ART."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from summrl.data import Document
from summrl.judges.lexical import UNSPACED, tokens

# trainer.prompt's choices: the system message and the user message (``{document}``, ``{max_words}``).
PROMPTS: dict[str, tuple[str, str]] = {
    # OpenPipe's Summary-RL word for word (src/summarizer/rollout.py, newlines included). It states no length: the
    # limit is the QA reward's (reward.max_chars, 3000 characters, as there); trainer.max_words is not in it.
    "summary_rl": (
        "\nYou are a specialized AI assistant that generates concise, informative summaries for documents.\n",
        "You are a specialized AI assistant that generates concise, informative summaries for documents.\n\n"
        "Here is a document: {document}\n\n"
        "Generate a summary that conveys all relevant information in a concise manner.",
    ),
    # The word limit (trainer.max_words) and the kinds of fact a question may ask about: experiment=local's, and every
    # run's before trainer.prompt existed (a small model without the limit writes past max_summary_tokens).
    "facts": (
        "You are a specialized AI assistant that writes concise, informative summaries of documents.",
        "Here is a document:\n\n{document}\n\n"
        "Write a summary of this document in at most {max_words} words. "
        "Keep the concrete facts a reader could ask about: names, dates, numbers, places and outcomes.",
    ),
}
# What a run or a benchmark folder saved before trainer.prompt existed was asked (its config does not say)
PROMPT_BEFORE_THE_OPTION = "facts"


@dataclass(frozen=True)
class SummaryPrompt:
    """What a summarizer is asked: ``trainer.prompt`` (one of PROMPTS) and ``trainer.max_words``."""

    style: str
    max_words: int

    @staticmethod
    def of(trainer: Any) -> "SummaryPrompt":
        return SummaryPrompt(trainer.prompt, trainer.max_words)

    def messages(self, document: Document) -> list[dict]:
        """The chat a summarizer sees: the policy's rollouts, SFT samples and teachers all get these messages."""
        system, user = PROMPTS[self.style]
        # str.replace, not format: a document's own braces stay as they are
        text = user.replace("{max_words}", str(self.max_words)).replace("{document}", document.text)
        return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def chat_token_ids(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs: Any
                   ) -> list[int]:
    """A chat's token ids under the tokenizer's chat template (a list, whichever type this transformers returns)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        **template_kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def content_text(content: Any) -> Any:
    """A chat message's content as a chat template reads it: OpenAI's list of text parts (``[{"type": "text",
    "text": ...}]``, which its SDKs send) is its texts a line each, as vLLM joins them; null (an assistant turn with
    tool calls only) is no text; anything else is returned as it is. A part that is not text (an image) raises
    ValueError naming its type: a summarizer reads text only."""
    if content is None:
        return ""
    if not isinstance(content, list):
        return content
    kinds = [p.get("type") if isinstance(p, dict) else type(p).__name__ for p in content]
    other = [k for k in kinds if k != "text"]  # a part with no type is none of text
    if other or not all(isinstance(p.get("text"), str) for p in content):
        got = f"a part of type {other[0]!r}" if other else "a text part with no text string"
        raise ValueError(f'only text parts ({{"type": "text", "text": ...}}) are read by a summarizer, got {got}')
    return "\n".join(p["text"] for p in content)


# OpenAI chat parameters no summrl server implements (summrl.serve, the embedded endpoint): refused by name where set,
# as a client relying on them would get text it did not ask for (top_logprobs: its alternatives are not kept)
UNSUPPORTED_CHAT = ("tools", "tool_choice", "functions", "function_call", "logit_bias", "frequency_penalty",
                    "presence_penalty", "best_of", "top_logprobs", "parallel_tool_calls", "reasoning_effort",
                    "modalities", "audio", "prediction", "web_search_options")


def unsupported_chat(body: dict) -> list[str]:
    """The UNSUPPORTED_CHAT parameters ``body`` sets (an empty or zero one asks for nothing)."""
    return [k for k in UNSUPPORTED_CHAT if body.get(k) not in (None, [], {}, False, 0)]


CHAT_ROLES = ("system", "user", "assistant", "developer")  # developer: OpenAI's newer name for system
# name, reasoning_content: the template's to read (Qwen3's reads an assistant turn's reasoning; vLLM passes both on)
MESSAGE_FIELDS = ("role", "content", "name", "reasoning_content")


def unsupported_message_fields(message: dict) -> list[str]:
    """The fields of a chat message, other than MESSAGE_FIELDS, that ask for something (``tool_calls``,
    ``tool_call_id``, ``audio``): the template never read them. Empty ones ask for nothing: an assistant message an
    OpenAI client echoes back carries ``tool_calls: null``, ``refusal: null`` and ``annotations: []``."""
    return [k for k, v in message.items() if k not in MESSAGE_FIELDS and v not in (None, [], {}, "")]


def chat_role(role: Any) -> str:
    """A message's role as the chat template reads it (developer as system); ValueError for one outside CHAT_ROLES:
    a role like "robot" went into the template and was sampled from."""
    if role not in CHAT_ROLES:
        raise ValueError(f"must be one of {', '.join(CHAT_ROLES)} (this server has no tools), got {role!r}")
    return "system" if role == "developer" else role


_UNSPACED_CHAR = re.compile(f"[{UNSPACED}]")


def word_count(text: str) -> int:
    """Words as ``str.split()`` counts them, but in a script written without spaces (Chinese, Japanese, Thai) each
    character is a word, as the lexical judge reads it: a Chinese summary of any length was one word, never over
    trainer.max_words. A word with none of those characters counts 1, as before."""
    return sum(len(tokens(word)) if _UNSPACED_CHAR.search(word) else 1 for word in text.split())
