"""The prompt a summarizer sees (the policy's rollouts, SFT samples, teachers and benchmarked models all get it), and
how its word limit is counted. Light on purpose: the cost guard and the data tools read it without loading ART."""

from __future__ import annotations

from typing import Any

from summrl.data import Document

SYSTEM_PROMPT = "You are a specialized AI assistant that writes concise, informative summaries of documents."


def summary_prompt(document: Document, max_words: int) -> str:
    return (
        f"Here is a document:\n\n{document.text}\n\n"
        f"Write a summary of this document in at most {max_words} words. "
        "Keep the concrete facts a reader could ask about: names, dates, numbers, places and outcomes."
    )


def chat_token_ids(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs: Any
                   ) -> list[int]:
    """A chat's token ids under the tokenizer's chat template (a list, whichever type this transformers returns)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        **template_kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def summary_messages(document: Document, max_words: int) -> list[dict]:
    """The chat a summarizer sees: the policy's rollouts, SFT samples and teachers all get these messages."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": summary_prompt(document, max_words)},
    ]


def word_count(text: str) -> int:
    return len(text.split())
