"""What every dataset gives the loop: documents with their questions (and, optionally, rubrics)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from summrl.data.split import DataError

UNANSWERABLE = "UNANSWERABLE"  # Repliqa's answer for questions the document does not answer


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str
    long_answer: str

    @property
    def answerable(self) -> bool:
        return self.answer.strip().upper() != UNANSWERABLE


@dataclass(frozen=True)
class Document:
    id: str
    topic: str
    text: str
    questions: tuple[Question, ...]
    # From the optional dataset columns; None: not given (reward=rubric then writes them).
    positive_rubrics: Optional[tuple[str, ...]] = None
    negative_rubrics: Optional[tuple[str, ...]] = None


def unix_newlines(text: str) -> str:
    """The text with Windows' (CRLF) and old Macs' (CR) line endings as LF: what makes two copies of a document one
    (duplicates, and the caches of what a judge wrote for it)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def resolve_path(spec: str) -> Path:
    """A plain path, or ``pkg:<package>/<relative path>`` for a file inside an installed package."""
    if not spec.startswith("pkg:"):
        return Path(spec).expanduser()
    package, _, relative = spec[len("pkg:"):].partition("/")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise DataError(f"{spec}: the package {package!r} is not installed (pip install it, see README.md)")
    return Path(list(found.submodule_search_locations)[0]) / relative




def rubric_list(value: Any, column: str, where: str) -> Optional[tuple[str, ...]]:
    """A rubric column's value: a list of strings (parquet gives an array), or None when the row has none."""
    if value is None or (isinstance(value, float) and value != value):  # absent, or NaN from a partly-filled column
        return None
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(r, str) and r.strip() for r in value):
        raise DataError(f"{where}: {column} must be a non-empty list of non-empty strings (or absent), "
                        f"got {str(value)[:100]!r}")
    return tuple(r.strip() for r in value)
