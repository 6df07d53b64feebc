"""The stop sequences a chat request may carry, as OpenAI bounds them, checked alike by every server in front of a
backend (vLLM takes more than 4, and an empty one; OpenAI refuses both)."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import AfterValidator

MAX_STOPS = 4


def _bounded(value: Union[str, list[str]]) -> Union[str, list[str]]:
    sequences = [value] if isinstance(value, str) else value
    if len(sequences) > MAX_STOPS or not all(sequences):
        raise ValueError(f"at most {MAX_STOPS} sequences, none of them empty (OpenAI's bounds), got {value!r}")
    return value


Stop = Annotated[Union[str, list[str]], AfterValidator(_bounded)]


def stop_sequences(value: Union[str, list[str], None]) -> tuple[str, ...]:
    """A checked ``stop`` as the sequences it names."""
    return (value,) if isinstance(value, str) else tuple(value or ())
