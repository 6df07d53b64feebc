"""Documents with their questions, loaded from Repliqa (hub or local files) and split into val/train."""

from summrl.data.repliqa import (
    REPLIQA_COLUMNS,
    UNANSWERABLE,
    DataError,
    Document,
    Question,
    group_documents,
    all_documents,
    load_splits,
    resolve_path,
)

__all__ = [
    "REPLIQA_COLUMNS",
    "UNANSWERABLE",
    "DataError",
    "Document",
    "Question",
    "group_documents",
    "all_documents",
    "load_splits",
    "resolve_path",
]
